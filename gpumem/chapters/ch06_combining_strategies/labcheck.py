"""Lab 06's ``check()``: the learner's own planner, graded on clusters the lab never shows.

The learner writes ``choose_plan(model, gpus, gpu, seq, global_batch, inter_node) -> dict``: a layout (keys
``recipe, zero, checkpoint, attention, offload, device, micro_batch, tp, pp``) under mixed
precision, found by their own search with the course's memory and cost model
(``planner_memory.per_gpu``, ``planner_cost.step_seconds``) as the measuring tools. While it is
graded, ``planner.plan`` and ``planner.candidates`` refuse to run: the search is the exercise.

Each case passes when the layout is one DeepSpeed accepts (degrees that divide the GPUs, ZeRO-1
at most with pipeline stages, offload at the stages that have it), fits the GPU's usable bytes
by the library's accounting, and its estimated step time is within :data:`SLACK` of the planner's
best plan among the lab's levers (:data:`LAB_LEVERS`: mixed precision, no context parallelism,
virtual stages or hybrid sharding), with host bytes within :data:`planner.HOST_PER_NODE` per node. The
lab's own cluster (``LAB_CASE``) is graded the same way. One reflection is graded too
(:data:`REFLECTION`): on an unseen cluster whose planner answer changes when the link between
nodes slows down, the learner's plan for the slow link must be within the same slack there.
"""

import operator
from contextlib import contextmanager

from gpumem.course.grading import Report, Row, call, error_line, returned, run_case
from gpumem.errors import UsageError
from gpumem.memory import gpus as gpu_table
from gpumem.memory import models
from gpumem import planner
from gpumem.planner import cost as planner_cost, memory as planner_memory
from gpumem.timing.offload_time import datasheet_links

LAB = "lab06_choose_plan"
SLACK = 1.25
KEYS = ("recipe", "zero", "checkpoint", "attention", "offload", "device", "micro_batch", "tp", "pp")
LAB_CASE = ("llama-3-70b", 8, "h100-80gb", 8192, 64)
HIDDEN = (("llama-3-70b", 16, "a100-40gb", 4096, 128),
          ("llama-3-8b", 4, "l4", 2048, 32),
          ("llama-3.1-405b", 64, "h200", 4096, 256))
SLOW_LINK = 1.25e9        # 10 Gb/s Ethernet per GPU between nodes, bytes/s
REFLECTION = ("llama-3-8b", 32, "a100-80gb", 4096, 128)   # its best layout changes on the slow link
# the planner's levers the lab's layout has: mixed precision, no context parallelism, no virtual
# stages, no hybrid sharding (the reference plan is the planner's best among those)
LAB_LEVERS = {"recipes": ("mixed",), "cp": (1,), "vp": (1,), "hybrid": ("none",)}


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
    if not isinstance(choice, dict):
        raise ValueError(returned(choice, f"a dict with keys {', '.join(KEYS)}"))
    missing = [k for k in KEYS if k not in choice]
    if missing:
        raise ValueError(f"the plan lacks {', '.join(missing)}")
    tp, pp, mb = (_whole(choice, key) for key in ("tp", "pp", "micro_batch"))
    if gpus % (tp * pp):
        raise ValueError(f"tp {tp} x pp {pp} = {tp * pp} does not divide {gpus} GPUs")
    dp = gpus // (tp * pp)
    if global_batch % (dp * mb):
        raise ValueError(f"dp {dp} x micro_batch {mb} does not divide the global batch of {global_batch} "
                         "sequences (dp x micro-batch x accumulation must equal it)")
    return planner_memory.Layout(choice["recipe"], int(choice["zero"]), choice["checkpoint"], choice["attention"],
                                 choice["offload"], choice["device"], mb, tp, pp, dp, global_batch // (dp * mb))


def _whole(choice: dict, key: str) -> int:
    """A positive whole number from the learner's dict (8, numpy's int64; not 8.9, '8' or True)."""
    value = choice[key]
    try:
        whole = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        whole = None
    if whole is None or whole < 1:
        raise ValueError(f"{key} must be a positive whole number, got {value!r}"[:120])
    return whole


def _ask(choose, case: tuple, inter_node: float):
    model, gpus, gpu, seq, batch = case
    with _no_planner():
        return call(choose, model, gpus, gpu, seq, batch, inter_node=inter_node)


def _refused(err: Exception) -> str:
    """A plan the course's model refuses (UsageError names the value and what is accepted)."""
    return f"the plan is refused: {err}" if isinstance(err, UsageError) else f"could not be checked: {error_line(err)}"


def grade_case(choose, case: tuple, inter_node: float = planner_cost.INTER_NODE) -> tuple[str, str]:
    """(status, detail) of the learner's plan for one cluster (``inter_node``: bytes/s per GPU
    between nodes); never raises, and the learner's call and the check share one time limit."""
    row = run_case(Report(LAB), "choose_plan", "", lambda: _grade(choose, case, inter_node), on_crash=_refused)
    return row.status, row.detail


def _grade(choose, case: tuple, inter_node: float) -> tuple[str, str]:
    model, gpus, gpu, seq, batch = case
    choice = _ask(choose, case, inter_node)
    try:
        lay = layout_of(choice, gpus, batch)
    except (TypeError, ValueError) as err:
        return "wrong", str(err) if not isinstance(err, TypeError) else f"the plan's values: {err}"
    cfg, g = models.get(model), gpu_table.get(gpu)
    if lay.recipe != "mixed":
        return "wrong", f"the lab plans under mixed precision; got recipe {lay.recipe!r}"
    if (lay.tp, lay.pp, lay.dp) not in planner.parallel_degrees(cfg, gpus):
        return "wrong", f"tp {lay.tp} must divide the key/value heads and stay within a node; pp <= layers"
    if not planner.allowed(lay.recipe, lay.zero, lay.pp, lay.offload, lay.device, lay.tp):
        return "wrong", (f"refused: ZeRO-{lay.zero} with tp {lay.tp}, pp {lay.pp} and offload {lay.offload}->"
                         f"{lay.device} (no ZeRO-2/3 with pp; tp x pp without offload; offload stages)")
    usable = gpu_table.usable(g)
    mem = planner_memory.per_gpu(cfg, seq, lay)
    if mem["total"] > usable:
        return "wrong", f"{lay.label()} needs {mem['total'] / 1e9:.1f} GB per GPU; {usable / 1e9:.1f} GB usable"
    host = mem["host"] * min(gpus, planner_cost.GPUS_PER_NODE)
    if host > planner.HOST_PER_NODE:
        return "wrong", f"{lay.label()} needs {host / 1e12:.2f} TB of host memory per node; {planner.HOST_PER_NODE / 1e12:g} TB"
    links = datasheet_links(g.name, ranks_on_node=min(gpus, planner_cost.GPUS_PER_NODE))
    mine = planner_cost.step_seconds(cfg, seq, lay, g, links=links, inter_node=inter_node)["total"]
    best = planner.plan(model, gpus, gpu, seq=seq, global_batch=batch, inter_node=inter_node, **LAB_LEVERS).best
    ratio = mine / best.time["total"]
    detail = f"{mine:.2f} s vs the planner's {best.time['total']:.2f} s ({best.layout.label()})"
    return ("ok", detail) if ratio <= SLACK else ("wrong", detail + f": {ratio:.2f}x, more than {SLACK}x")


def reflection(choose) -> Row:
    """The slow-link reflection: the plan for :data:`REFLECTION` on :data:`SLOW_LINK`, graded like
    a case, its detail saying whether the layout changed from the fast link's."""
    status, detail = grade_case(choose, REFLECTION, SLOW_LINK)

    def same_plan():
        fast, slow = (_ask(choose, REFLECTION, link) for link in (planner_cost.INTER_NODE, SLOW_LINK))
        return ("ok", "") if {k: fast[k] for k in KEYS} == {k: slow[k] for k in KEYS} else ("wrong", "")
    same = status != "ok" and run_case(Report(LAB), "reflection", "", same_plan).status == "ok"
    if same:
        detail = "the plan did not change when the link between nodes slowed to 1.25 GB/s; " + detail
    return Row("reflection", f"{REFLECTION[0]} on {REFLECTION[1]} x {REFLECTION[2]}, 1.25 GB/s between nodes",
               status, detail)


def check(ns: dict, show: bool = True) -> Report:
    """Grade lab 06 from the notebook's namespace."""
    report = Report(LAB)
    choose = ns.get("choose_plan")
    if choose is None:
        report.rows.append(Row("choose_plan", "defined", "todo", "define choose_plan(model, gpus, gpu, seq, global_batch, inter_node)"))
    else:
        for case in (LAB_CASE,) + HIDDEN:
            status, detail = grade_case(choose, case)
            report.rows.append(Row("choose_plan", f"{case[0]} on {case[1]} x {case[2]}, seq {case[3]}, batch {case[4]}",
                                   status, detail))
            if status != "ok":
                break
        else:
            report.rows.append(reflection(choose))
    if show:
        print(report.summary())
    return report
