"""Lab 06's ``check()``: the learner's own search over the planner's levers, graded on clusters
the lab never shows.

The learner writes ``choose_plan(model, gpus, gpu, seq, global_batch, inter_node=None,
host_per_node=None, one_node=False, without=())`` returning
a :class:`gpumem.planner.Layout` (or a dict of its fields; ``dp`` and ``n_micro`` are derived,
``cp``/``vp`` default to 1, ``hybrid`` to ``"none"``, ``group`` to 0, ``mcore`` to False) under
mixed precision. The pieces are the time engine's (``per_gpu``, ``step_seconds``, ``rules``); the
search's own entry points refuse while the learner runs (:mod:`.lab06_guard`).

Each case is priced by :func:`gpumem.planner.evaluate` against the planner's answer to the same
question (mixed precision, every lever), computed *after* the learner's call and kept only inside
the check. A plan passes when it runs (some framework accepts it), fits the GPU's usable bytes and
the node's host memory and drives, and its step time is within :data:`SLACK` of the fastest
fitting layout. Why 3 %: the learner prices with the planner's own cost model, so an exhaustive
search lands within the ranking's 0.5 % tie band; 3 % leaves room for a search that skips what
matters little in a case, while each case's own lever costs at least 5 % (:data:`.lab06_cases.MARGIN`,
tested for each member as it is drawn; Megatron-Core's engine, worth 0-3.1 % on the tensor and
pipeline family, has a family of its own where it is worth 8 % or more, so a search without it
fails on every draw). A plan that is too slow is told the lever the fastest layout
uses and the learner's lacks, or the term where it loses, and the names of the settings in which the
fastest layout differs from the learner's (:mod:`.lab06_diagnose`); the fastest layout itself, its
values, is never printed.

The cases: the lab's own cluster (``LAB_CASE``), then one member of each family of
:mod:`.lab06_cases` drawn at check time from a seed (fresh each check unless ``seed`` is given;
model, GPU type and count, sequence, batch and link drawn from ranges): offload, NVMe offload, tensor with
pipeline parallelism, Megatron-Core's engine, context parallelism, then on a 5-20 Gb/s link
between nodes the interleaved schedule, ZeRO-1/2 and hybrid sharding; then one member of each
family under the team's limits, which ``planner.plan``'s default question leaves out
(:mod:`.lab06_limit_cases`: a host cap per node below 2 TB, one node per replica on a slow link and
at long sequences, a cap NVMe offload fits only without its swap buffers, a stack that lacks 1-3 of
the levers the planner's answer uses, :mod:`.lab06_levers`), graded against the planner's own
search asked with the team's host memory, its plans kept to one node and to the levers the stack
has when asked (:func:`.lab06_limit_cases.truth`), so ``plan()``'s default answer, a copy's or a child process's
breaks the limit.
Each row is labelled with its family. Grading stops at the first case that is wrong. After the lab's
own cluster, a ``choose_plan`` that holds a table of answers (more literal data or code than a search
needs, :mod:`.lab06_table`: review r26's harvested winners) gets one row saying so, and grading stops.
"""

import inspect
import operator
import types
from dataclasses import asdict
from gpumem import planner
from gpumem.course import copy_watch
from gpumem.course.plain import plain
from gpumem.course.grading import LearnerError, Report, Row, call, error_line, returned, run_case
from gpumem.errors import UsageError

from . import lab06_cases, lab06_diagnose, lab06_gpu, lab06_limit_cases, lab06_table
from .lab06_timer import STOPPED
from .lab06_cases import SLOW_LINK  # noqa: F401 (the lab's text names it)
from .lab06_guard import COPY, FOREIGN, HELD, RAN, REACHED, changed_line, no_search, prints, refuse_if_active

LAB = "lab06_choose_plan"
SLACK = 1.03
DETAIL_CHARS = 600           # a row names a lever, the settings that differ and a question (review r24 #2: 300 cut it)
KEYS = ("recipe", "zero", "checkpoint", "attention", "offload", "device", "micro_batch", "tp", "pp")
OPTIONAL = {"cp": 1, "vp": 1, "hybrid": "none", "group": 0, "mcore": False}
LAB_CASE = ("llama-3-70b", 8, "h100-80gb", 8192, 64)
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


def reference(case: tuple, inter_node: float | None):
    """The planner's answer to the case; refuses inside the learner's call (never cached)."""
    refuse_if_active("labcheck.reference")
    model, gpus, gpu, seq, batch = case
    return planner.plan(model, gpus, gpu, seq=seq, global_batch=batch, inter_node=inter_node, advise=False,
                        **LAB_LEVERS)


def _ask(choose, case: tuple, inter_node: float | None, limits=None):
    model, gpus, gpu, seq, batch = case
    with no_search() as changes:
        try:
            asked = (lambda *a, **k: plain(choose(*a, **k))) if callable(choose) else choose   # read under the guard
            choice = call(asked, model, gpus, gpu, seq, batch, inter_node=inter_node,
                          **({} if limits is None else limits.keywords()))
        except LearnerError:
            if not (changes.reached or changes.ran or changes.stopped):
                raise
            choice = None
        what = changes()
    if changes.reached:                      # frames or another process (lab_audit), caught or not
        raise LearnerError(f"{REACHED} ({changes.reached[0]})")
    if changes.stopped:                      # the sampler's timer or handler changed (lab06_timer, review r16 #2)
        raise LearnerError(STOPPED.format(changes.stopped[0], "choose_plan"))
    if changes.copies:                       # a refusal the learner's code caught
        raise LearnerError(COPY.format(changes.copies[0]))
    if changes.foreign:                      # code of no cell's and no installed file's (lab_origin)
        raise LearnerError(FOREIGN.format(changes.foreign[0]))
    if what:
        raise LearnerError(changed_line(what))
    if changes.ran:                          # a blocked function's genuine code ran (rebuilt, bound back)
        raise LearnerError(RAN.format(changes.ran[0]))
    return choice


def _refused(err: Exception) -> str:
    """A plan the course's model refuses (UsageError names the value and what is accepted)."""
    if isinstance(err, UsageError):
        return f"the plan is refused: {str(err).removeprefix('--layout ')}"
    return f"could not be checked: {error_line(err)}"


def grade_case(choose, case: tuple, inter_node: float | None = None, family=None,
               ref=reference, limits=None) -> tuple[str, str]:
    """(status, detail) of the learner's plan for one cluster (``inter_node``: bytes/s per GPU
    between nodes, None: the node type's own NICs); the reference is priced after the learner's
    call (``ref``: the tests pass a cached one); never raises. A copy of the planner's search in the
    learner's namespace is an error before any call (looked for outside the case's time limit)."""
    held = copy_watch.held_copies(prints(), getattr(choose, "__globals__", {}))
    if held:
        return "error", HELD.format(held)
    if limits is not None:            # the team's limits (lab06_limit_cases): the grader's own search
        try:
            inspect.signature(choose).bind("m", 1, "g", 1, 1, inter_node=None, **limits.keywords())
        except (TypeError, ValueError):
            return "error", ("choose_plan does not take the team's limits: give it the keywords host_per_node=None, "
                             "one_node=False and without=() (section 2)")

        def body():
            return lab06_limit_cases.grade(_ask(choose, case, inter_node, limits), case, inter_node, limits, SLACK,
                                           fields_of)
    else:
        def body():
            return _grade(choose, case, inter_node, family, ref)
    row = run_case(Report(LAB), "choose_plan", "", body, on_crash=_refused, limit=DETAIL_CHARS)
    return row.status, row.detail


def _grade(choose, case: tuple, inter_node, family, ref) -> tuple[str, str]:
    model, gpus, gpu, seq, batch = case
    choice = _ask(choose, case, inter_node)
    if choice is None:
        result = ref(case, inter_node)
        if result.plans:
            return "wrong", "returned None (no plan): " + lab06_diagnose.why_none(result, family)   # r26
    try:
        fields = fields_of(choice, gpus, batch)
    except (TypeError, ValueError) as err:
        return "wrong", str(err) if not isinstance(err, TypeError) else f"the plan's values: {err}"
    result = ref(case, inter_node)
    ev = planner.evaluate(model, gpus, fields, gpu, seq, batch, result=result)
    label = ev.plan.layout.label()
    if not ev.fits:
        return "wrong", f"yours: {label}: does not fit: " + "; ".join(ev.why_not)
    mine, fastest = ev.plan.time["total"], lab06_diagnose.fastest(result.plans).time["total"]
    ratio = mine / fastest
    if ratio <= SLACK:
        return "ok", f"{mine:.2f} s vs the fastest fitting layout's {fastest:.2f} s ({ratio:.3f}x, within {SLACK}x)"
    shown = f"{ratio:.3f}" if abs(ratio - SLACK) < 0.01 else f"{ratio:.2f}"      # 1.031x, not "1.03x > 1.03x"
    head = f"yours: {label}: {mine:.2f} s, {shown}x the fastest step (more than {SLACK}x)"    # r38 #7
    if inter_node is not None and inter_node < lab06_cases.FAST[0] and _same_plan(choose, case, fields):
        return "wrong", (f"{head}; the plan did not change when the link between nodes slowed to "
                         f"{inter_node / 1e9:g} GB/s (pass inter_node on to step_seconds)")
    return "wrong", f"{head}: {lab06_diagnose.why_slower(ev.plan, result, SLACK, family)}"


def _same_plan(choose, case: tuple, slow_fields: dict) -> bool:
    """Whether the learner gives the same plan on the node's own network (errors: no)."""
    try:
        return fields_of(_ask(choose, case, None), case[1], case[4]) == slow_fields
    except Exception:        # noqa: BLE001 -- any failure here only drops the extra clause
        return False


def _case_text(case: tuple, inter_node: float | None) -> str:
    model, gpus, gpu, seq, batch = case
    link = "" if inter_node is None else f", {inter_node / 1e9:g} GB/s between nodes"
    return f"{model} on {gpus} x {gpu}, seq {seq:,}, batch {batch}{link}"


def cases(seed: int | None = None, ref=reference):
    """Yield (function, family, case, inter_node, limits) in grading order: the lab's cluster, then
    one member of each family, then of each family under the team's limits (``limits``: None
    before), drawn when it is reached (so a check that stops early draws no more)."""
    yield "choose_plan", None, LAB_CASE, None, None
    rng = lab06_cases.rng_of(seed)
    for family in lab06_cases.FAMILIES:
        case, link = lab06_cases.draw(family, rng, ref)
        yield "choose_plan", family, case, link, None
    for family in lab06_limit_cases.FAMILIES:
        yield "choose_plan", family, *lab06_limit_cases.draw(family, rng)


def _label(family, case: tuple, link: float | None, limits=None) -> str:
    text = _case_text(case, link) + ("" if limits is None else f"; limits: {limits.text()}")
    return text if family is None else f"{family.name}: {text}"


def check(ns: dict, show: bool = True, seed: int | None = None, ref=reference) -> Report:
    """Grade lab 06 from the notebook's namespace; the unseen clusters are drawn from ``seed``
    (fresh each check when None)."""
    report = Report(LAB)
    choose = ns.get("choose_plan")
    if choose is None:
        report.rows.append(Row("choose_plan", "defined", "todo",
                               "define choose_plan(model, gpus, gpu, seq, global_batch, inter_node=None)"))
    else:
        table = lab06_table.problem(choose, ns) if isinstance(inspect.unwrap(choose), types.FunctionType) else (
            "choose_plan is not a function (a class?), so the table rule cannot read it: write def choose_plan(...)")
        for function, family, case, link, limits in cases(seed, ref):
            status, detail = grade_case(choose, case, link, family, ref, limits)
            report.rows.append(Row(function, _label(family, case, link, limits), status, detail))
            if status != "ok":
                break
            if table:               # review r26's harvested winners; after the lab's cluster, whose row names a copy
                report.rows.append(Row("choose_plan", "a search, not a table of answers", "wrong", table))
                break
    gpu_line = lab06_gpu.grade(report, ns.get("measure_kernel_share"), no_search)
    if show:
        print(report.summary())
        print(f"GPU part: {gpu_line}")
    return report
