"""Lab 06's ``check()``: the learner's own planner, graded on clusters the lab never shows.

The learner writes ``choose_plan(model, gpus, gpu, seq, global_batch) -> dict``: a layout (keys
``recipe, zero, checkpoint, attention, offload, device, micro_batch, tp, pp``) under mixed
precision, found by their own search with the course's memory and cost model
(``planner_memory.per_gpu``, ``planner_cost.step_seconds``) as the measuring tools. While it is
graded, ``planner.plan`` and ``planner.candidates`` refuse to run: the search is the exercise.

Each case passes when the layout is one DeepSpeed accepts (degrees that divide the GPUs, ZeRO-1
at most with pipeline stages, offload at the stages that have it), fits the GPU's usable bytes
by the library's accounting, and its estimated step time is within :data:`SLACK` of the planner's
best mixed-precision plan. The lab's own cluster (``LAB_CASE``) is graded the same way.
"""

from contextlib import contextmanager

from gpumem.course.grading import Report, Row
from gpumem.memory import gpus as gpu_table
from gpumem.memory import models, planner, planner_cost, planner_memory
from gpumem.memory.offload_cost import datasheet_links

LAB = "lab06_choose_plan"
SLACK = 1.25
KEYS = ("recipe", "zero", "checkpoint", "attention", "offload", "device", "micro_batch", "tp", "pp")
LAB_CASE = ("llama-3-70b", 8, "h100-80gb", 8192, 64)
HIDDEN = (("llama-3-70b", 16, "a100-40gb", 4096, 128),
          ("llama-3-8b", 4, "l4", 2048, 32),
          ("llama-3.1-405b", 64, "h200", 4096, 256))


@contextmanager
def _no_planner():
    saved = planner.plan, planner.candidates

    def refuse(*args, **kwargs):
        raise RuntimeError("choose_plan must search by itself: planner.plan is off while the lab is graded")
    planner.plan, planner.candidates = refuse, refuse
    try:
        yield
    finally:
        planner.plan, planner.candidates = saved


def layout_of(choice: dict, gpus: int, global_batch: int) -> planner_memory.Layout:
    """The learner's dict as a Layout (data-parallel degree and micro-batch count derived)."""
    missing = [k for k in KEYS if k not in choice]
    if missing:
        raise ValueError(f"the plan lacks {', '.join(missing)}")
    tp, pp, mb = int(choice["tp"]), int(choice["pp"]), int(choice["micro_batch"])
    if tp < 1 or pp < 1 or mb < 1 or gpus % (tp * pp):
        raise ValueError(f"tp {tp} x pp {pp} does not divide {gpus} GPUs")
    dp = gpus // (tp * pp)
    replica = -(-global_batch // dp)
    return planner_memory.Layout(choice["recipe"], int(choice["zero"]), choice["checkpoint"], choice["attention"],
                                 choice["offload"], choice["device"], mb, tp, pp, dp, -(-replica // mb))


def grade_case(choose, case: tuple) -> tuple[str, str]:
    """(status, detail) of the learner's plan for one cluster."""
    model, gpus, gpu, seq, batch = case
    try:
        with _no_planner():
            choice = choose(model, gpus, gpu, seq, batch)
    except NotImplementedError:
        return "todo", "choose_plan still raises NotImplementedError"
    except Exception as err:  # the learner's bug, reported
        return "error", f"{type(err).__name__}: {err}"
    try:
        lay = layout_of(dict(choice), gpus, batch)
    except (TypeError, ValueError) as err:
        return "wrong", str(err)
    cfg, g = models.get(model), gpu_table.get(gpu)
    if lay.recipe != "mixed":
        return "wrong", f"the lab plans under mixed precision; got recipe {lay.recipe!r}"
    if (lay.tp, lay.pp, lay.dp) not in planner.parallel_degrees(cfg, gpus):
        return "wrong", f"tp {lay.tp} must divide the key/value heads and stay within a node; pp <= layers"
    if not planner.allowed(lay.recipe, lay.zero, lay.pp, lay.offload, lay.device, lay.tp):
        return "wrong", f"DeepSpeed refuses ZeRO-{lay.zero} with pp {lay.pp} and offload {lay.offload}->{lay.device}"
    usable = gpu_table.usable(g)
    mem = planner_memory.per_gpu(cfg, seq, lay)
    if mem["total"] > usable:
        return "wrong", f"{lay.label()} needs {mem['total'] / 1e9:.1f} GB per GPU; {usable / 1e9:.1f} GB usable"
    mine = planner_cost.step_seconds(cfg, seq, lay, g, links=datasheet_links(g.name))["total"]
    best = planner.plan(model, gpus, gpu, seq=seq, global_batch=batch, recipes=("mixed",)).best
    ratio = mine / best.time["total"]
    detail = f"{mine:.2f} s vs the planner's {best.time['total']:.2f} s ({best.layout.label()})"
    return ("ok", detail) if ratio <= SLACK else ("wrong", detail + f": {ratio:.2f}x, more than {SLACK}x")


def check(ns: dict, show: bool = True) -> Report:
    """Grade lab 06 from the notebook's namespace."""
    report = Report(LAB)
    choose = ns.get("choose_plan")
    if choose is None:
        report.rows.append(Row("choose_plan", "defined", "todo", "define choose_plan(model, gpus, gpu, seq, global_batch)"))
    else:
        for case in (LAB_CASE,) + HIDDEN:
            status, detail = grade_case(choose, case)
            report.rows.append(Row("choose_plan", f"{case[0]} on {case[1]} x {case[2]}, seq {case[3]}, batch {case[4]}",
                                   status, detail))
            if status != "ok":
                break
    if show:
        print(report.summary())
    return report
