"""Lab 06's ``check()``: the learner's own search over the planner's levers, graded on clusters
the lab never shows.

The learner writes ``choose_plan(model, gpus, gpu, seq, global_batch, inter_node=None)`` returning
a :class:`gpumem.planner.Layout` (or a dict of its fields; ``dp`` and ``n_micro`` are derived,
``cp``/``vp`` default to 1, ``hybrid`` to ``"none"``, ``group`` to 0, ``mcore`` to False) under
mixed precision. The pieces are the time engine's (``per_gpu``, ``step_seconds``, ``rules``); the
search's own entry points refuse while the learner runs (:mod:`.lab06_guard`).

Each case is priced by :func:`gpumem.planner.evaluate` -- the functions that price the planner's
own candidates -- against the planner's answer to the same question (mixed precision, every
lever). It passes when the layout runs (some framework accepts it), fits the GPU's usable bytes
and the node's host memory and drives, and its step time is within :data:`SLACK` of the fastest
fitting layout. Why 3 %: the learner prices with the planner's own cost model, so an exhaustive
search lands within the ranking's 0.5 % tie band; 3 % leaves room for a search that skips what
matters little in a case (Megatron-Core's engine for the 405B case costs 2.6 %), while every lever
a case is built around costs at least 10 % when it is missing (tests/test_lab06_adversarial.py
derives each case's winner by hand). A plan that is too slow is told the lever the fastest layout
uses and the learner's lacks (:mod:`.lab06_diagnose`).

The cases: the lab's own cluster (``LAB_CASE``), three unseen ones on the node's own network
(``HIDDEN``: 70B on 16 A100 40GB with offload, 405B on 64 H200 in 3-D, 8B at 131,072 tokens where
context parallelism matters) and two on a 10 Gb/s link between nodes (``SLOW``: 70B on 32 H100
where the interleaved schedule hides the pipeline's sends, and the reflection ``REFLECTION``, 8B
on 64 H100 where hybrid sharding (hpZ) wins). Grading stops at the first case that is wrong.
"""

import operator
from dataclasses import asdict
from functools import lru_cache

from gpumem import planner
from gpumem.course.grading import Report, Row, call, error_line, returned, run_case
from gpumem.errors import UsageError

from . import lab06_diagnose, lab06_gpu
from .lab06_guard import no_search

LAB = "lab06_choose_plan"
SLACK = 1.03
KEYS = ("recipe", "zero", "checkpoint", "attention", "offload", "device", "micro_batch", "tp", "pp")
OPTIONAL = {"cp": 1, "vp": 1, "hybrid": "none", "group": 0, "mcore": False}
LAB_CASE = ("llama-3-70b", 8, "h100-80gb", 8192, 64)
HIDDEN = (("llama-3-70b", 16, "a100-40gb", 4096, 128),
          ("llama-3.1-405b", 64, "h200", 4096, 256),
          ("llama-3-8b", 16, "h100-80gb", 131072, 8))        # long sequence: context parallelism
SLOW_LINK = 1.25e9        # 10 Gb/s Ethernet per GPU between nodes, bytes/s
SLOW = (("llama-3-70b", 32, "h100-80gb", 4096, 256),          # 1F1B's sends exposed: interleave
        ("llama-3-8b", 64, "h100-80gb", 2048, 1024))          # ZeRO-3's gathers exposed: hybrid sharding
REFLECTION = SLOW[-1]
LAB_LEVERS = {"recipes": ("mixed",)}      # the reference: the planner with every lever, mixed precision


def fields_of(choice, gpus: int, global_batch: int) -> dict:
    """The learner's Layout or dict as ``planner.evaluate``'s fields (dp derived, then checked)."""
    if isinstance(choice, planner.Layout):
        choice = asdict(choice)
    if not isinstance(choice, dict):
        raise ValueError(returned(choice, f"a dict with keys {', '.join(KEYS)} (or a Layout)"))
    missing = [k for k in KEYS if k not in choice]
    if missing:
        raise ValueError(f"the plan lacks {', '.join(missing)}")
    c = {**OPTIONAL, **choice}
    tp, pp, mb, cp, vp = (_whole(c, key) for key in ("tp", "pp", "micro_batch", "cp", "vp"))
    group = _whole(c, "group", 0)
    if gpus % (tp * cp * pp):
        raise ValueError(f"tp {tp} x cp {cp} x pp {pp} = {tp * cp * pp} does not divide {gpus} GPUs")
    dp = gpus // (tp * cp * pp)
    if c.get("dp", dp) != dp:
        raise ValueError(f"dp {c['dp']!r}: with tp {tp} x cp {cp} x pp {pp} on {gpus} GPUs, dp is {dp}")
    if global_batch % (dp * mb):
        raise ValueError(f"dp {dp} x micro_batch {mb} does not divide the global batch of {global_batch} "
                         "sequences (dp x micro-batch x accumulation must equal it)")
    n_micro = global_batch // (dp * mb)
    if c.get("n_micro", n_micro) != n_micro:
        raise ValueError(f"n_micro {c['n_micro']!r}: {global_batch} sequences / (dp {dp} x micro_batch {mb}) "
                         f"= {n_micro}")
    if not isinstance(c["mcore"], bool):
        raise ValueError(f"mcore must be True or False, got {c['mcore']!r}"[:120])
    if c["recipe"] != "mixed":
        raise ValueError(f"the lab plans under mixed precision; got recipe {c['recipe']!r}"[:120])
    return {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "vp": vp, "mb": mb, "zero": c["zero"], "ckpt": c["checkpoint"],
            "attn": c["attention"], "recipe": "mixed", "offload": c["offload"],
            "device": c["device"], "hybrid": c["hybrid"], "group": group,
            "engine": "megatron-core" if c["mcore"] else "auto"}


def _whole(choice: dict, key: str, least: int = 1) -> int:
    """A whole number >= ``least`` from the learner's plan (8, numpy's int64; not 8.9, '8' or True)."""
    value = choice[key]
    try:
        whole = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        whole = None
    if whole is None or whole < least:
        kind = "positive" if least == 1 else "non-negative"
        raise ValueError(f"{key} must be a {kind} whole number, got {value!r}"[:120])
    return whole


@lru_cache(maxsize=16)
def reference(case: tuple, inter_node: float | None):
    """The planner's answer to the case (computed before the learner runs, never during; kept)."""
    model, gpus, gpu, seq, batch = case
    return planner.plan(model, gpus, gpu, seq=seq, global_batch=batch, inter_node=inter_node, advise=False,
                        **LAB_LEVERS)


def _ask(choose, case: tuple, inter_node: float | None):
    model, gpus, gpu, seq, batch = case
    with no_search():
        return call(choose, model, gpus, gpu, seq, batch, inter_node=inter_node)


def _refused(err: Exception) -> str:
    """A plan the course's model refuses (UsageError names the value and what is accepted)."""
    if isinstance(err, UsageError):
        return f"the plan is refused: {str(err).removeprefix('--layout ')}"
    return f"could not be checked: {error_line(err)}"


def grade_case(choose, case: tuple, inter_node: float | None = None, result=None) -> tuple[str, str]:
    """(status, detail) of the learner's plan for one cluster (``inter_node``: bytes/s per GPU
    between nodes, None: the node type's own NICs); never raises."""
    result = result or reference(case, inter_node)
    row = run_case(Report(LAB), "choose_plan", "", lambda: _grade(choose, case, inter_node, result),
                   on_crash=_refused)
    return row.status, row.detail


def _grade(choose, case: tuple, inter_node, result) -> tuple[str, str]:
    model, gpus, gpu, seq, batch = case
    choice = _ask(choose, case, inter_node)
    try:
        fields = fields_of(choice, gpus, batch)
    except (TypeError, ValueError) as err:
        return "wrong", str(err) if not isinstance(err, TypeError) else f"the plan's values: {err}"
    ev = planner.evaluate(model, gpus, fields, gpu, seq, batch, result=result)
    label = ev.plan.layout.label()
    if not ev.fits:
        return "wrong", f"{label} does not fit: " + "; ".join(ev.why_not)
    mine, fastest = ev.plan.time["total"], min(p.time["total"] for p in result.plans)
    ratio = mine / fastest
    detail = f"{mine:.2f} s vs the fastest fitting layout's {fastest:.2f} s (planner's top: {result.best.layout.label()})"
    if ratio <= SLACK:
        return "ok", detail
    why = lab06_diagnose.why_slower(ev.plan, result, case, inter_node, SLACK)
    return "wrong", f"{ratio:.2f}x the fastest step (more than {SLACK}x): {why}; yours: {label}"


def _case_text(case: tuple, inter_node: float | None) -> str:
    model, gpus, gpu, seq, batch = case
    link = "" if inter_node is None else f", {inter_node / 1e9:g} GB/s between nodes"
    return f"{model} on {gpus} x {gpu}, seq {seq:,}, batch {batch}{link}"


def slow_case(choose, case: tuple, function: str = "choose_plan") -> Row:
    """A case on :data:`SLOW_LINK`, graded like the others; when the plan is wrong and is the one the
    learner gives on the node's own network, the detail says the plan did not change with the link."""
    status, detail = grade_case(choose, case, SLOW_LINK)

    def same_plan():
        fast, slow = (_ask(choose, case, link) for link in (None, SLOW_LINK))
        f, s = (fields_of(x, case[1], case[4]) for x in (fast, slow))
        return ("ok", "") if f == s else ("wrong", "")
    if status == "wrong" and run_case(Report(LAB), function, "", same_plan).status == "ok":
        detail = ("the plan did not change when the link between nodes slowed to "
                  f"{SLOW_LINK / 1e9:g} GB/s (pass inter_node on to step_seconds); " + detail)
    return Row(function, _case_text(case, SLOW_LINK), status, detail)


def reflection(choose) -> Row:
    """The slow-link reflection: :data:`REFLECTION` on :data:`SLOW_LINK` (see :func:`slow_case`)."""
    return slow_case(choose, REFLECTION, "reflection")


def check(ns: dict, show: bool = True) -> Report:
    """Grade lab 06 from the notebook's namespace."""
    report = Report(LAB)
    choose = ns.get("choose_plan")
    if choose is None:
        report.rows.append(Row("choose_plan", "defined", "todo",
                               "define choose_plan(model, gpus, gpu, seq, global_batch, inter_node=None)"))
    else:
        for case in (LAB_CASE,) + HIDDEN:
            status, detail = grade_case(choose, case)
            report.rows.append(Row("choose_plan", _case_text(case, None), status, detail))
            if status != "ok":
                break
        else:
            for case in SLOW[:-1]:
                report.rows.append(slow_case(choose, case))
                if report.rows[-1].status != "ok":
                    break
            else:
                report.rows.append(reflection(choose))
    lab06_gpu.grade(report, ns.get("measure_kernel_share"))
    if show:
        print(report.summary())
    return report
