"""Lab 03's ``check()``: the learner's checkpoint, peak estimate, placement and SAC choice, measured.

The learner writes four functions, graded in this order on cases drawn at check time
(``labcases``: fresh each check unless a seed is given). Each function stops at its first failing
case: that row names the case, its later cases are not run.

* ``checkpoint(run, *args)``: ``run(*args)`` under activation checkpointing, where ``args`` may mix
  tensors and other values, ``run`` may return several tensors and may draw random numbers. Graded
  on a drawn Llama with every layer checkpointed (gradients equal to the plain step's; bytes kept
  equal to the layers' inputs, as the course's tracer measures; every layer re-run in backward, as
  the FLOP counter's recorder sees it) and on small functions of each kind against plain autograd
  (each must call ``run`` again in backward, and take its gradients from that re-run: one case's
  ``run`` changes between forward and backward). Ready-made checkpoints, and copies of their
  code, refuse to run while the learner's code does, and numbers may not leave torch
  (``labguard``, ``labprints``, ``labescape``); a checkpoint that keeps clones fails the bytes
  row, one that never re-runs the re-run row.
* ``estimate_peak(segments, ...)``: the step's activation peak of a placement, to the byte,
  against the two moments (``labplace.moments``, which the tracer matches to the byte).
* ``place_checkpoints(...)``: segments whose measured peak fits the budget with the fewest layers
  re-run, run with the learner's checkpoint on real tensors, against a search over every placement.
* ``choose_saved(ops, budget)``: which of a drawn layer's operators to keep (selective
  checkpointing), run under PyTorch's SAC outside the learner's call (``labsac``).

Both are called with numbers only, from a helper (``_ask``) that holds nothing else; the
expected answers are worked out after the call returns, so no optimum exists while the
learner's code runs. The drawn models and budgets sit in the grader's locals, and the learner's
code runs under :func:`gpumem.course.lab_audit.refusing` (``labguard.guarded``): reading frames
(r6: a walk up ``sys._getframe`` found the model) or the collector's objects, and starting another
process (review r8: an ``os.system`` interpreter ran ``labplace`` on the model read from a module
global, then removed), are refused. The course's formula, tracer and search (``recompute_cost``,
``recompute_trace``, ``labplace``) refuse too, and so do copies of them (``labprints``, and
copy_watch for ``torch.utils.checkpoint``, ``labplace.best_placements`` and ``labguard.CASES_ANSWERS``,
renamed locals and all: review r30 #1); not for ``labplace.moments``, which copy_watch takes the
solution's own ``estimate_peak`` for (the same short loop).

The optional GPU part (``lab_gpu``) adds a row only where CUDA is present; otherwise check()
prints ``GPU part: skipped (reason)``.
"""

import functools

from gpumem.course.grading import Report, Row, call, case_seconds, kind, returned, run_case
from gpumem.errors import UsageError
from gpumem.memory import recompute_cost
from gpumem.memory.models import ModelConfig
from gpumem.memory.recompute_plans import from_segments

from . import lab_gpu, labcases, labplace, labsac
from .labguard import guarded, refused
from .labvariants import grade_variants, measured_with_grads

LAB = "lab03_checkpoint_budget"
SEQ, BATCH = labcases.SEQ, labcases.BATCH


def _ask(fn, given: dict, *first):
    """The learner's ``fn`` called with plain arguments only (``first``, then ``given`` by name):
    the frames above it hold no model (module docstring)."""
    return "ok", call(fn, *first, **given)


def numbers(cfg: ModelConfig, seq: int = SEQ, batch: int = BATCH) -> dict:
    """What ``estimate_peak`` and ``place_checkpoints`` are given for ``cfg``: a plain layer's
    bytes, a checkpoint's, the rest the step holds when the forward ends, and what of that rest
    is still alive after the loss."""
    return labplace.numbers(cfg, seq, batch)


def budget_for(cfg: ModelConfig, count: int, seq: int = SEQ, batch: int = BATCH) -> int:
    """A budget that ``count`` checkpointed layers, well placed, meet and no fewer do."""
    return labplace.budget_for(cfg, count, seq, batch)


def optimum(cfg: ModelConfig, budget: int, seq: int = SEQ, batch: int = BATCH) -> int:
    """The fewest layers any placement re-runs within ``budget`` (search over every placement)."""
    return labplace.optimum(cfg, budget, seq, batch)


def show(segments) -> str:
    """Segments in a row's case text: [[0], [1], [2, ..., 9]]."""
    return "[" + ", ".join(f"[{s[0]}]" if len(s) == 1 else f"[{s[0]}, {s[1]}]" if len(s) == 2
                           else f"[{s[0]}, ..., {s[-1]}]" for s in segments) + "]"


def _cut_from_graph(ckpt) -> str:
    """Why no gradient would flow through the learner's checkpoint, probed on ``2 * x``; '' if one does."""
    import torch
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    out = call(ckpt, lambda t: t * 2, x)
    if not torch.is_tensor(out):
        return "checkpoint(run, x) " + returned(out, "the tensor run(x) returns")
    if not out.requires_grad:
        return ("its output does not require grad: it is cut from the graph, so no gradient reaches the layers "
                "(return the result of your autograd.Function's apply)")
    call(lambda: out.sum().backward())
    if x.grad is None or not torch.equal(x.grad, torch.full_like(x, 2.0)):
        return f"the gradient of 2 * x through it is {kind(x.grad)}, not 2 everywhere: does backward return the inputs' gradients?"
    return ""


def reran(m, segments) -> list[str]:
    """The checkpointed layers that backward never re-ran (the recorder's 'recompute' events)."""
    seen = {e["part"] for e in m.events if e["phase"] == "recompute"}
    return [f"L{i}" for seg in segments for i in seg if f"L{i}" not in seen]


def skipped_line(missing: list[str], total: int) -> str:
    """The row's detail for a checkpoint that did not re-run every checkpointed layer."""
    said = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
    return (f"backward re-ran {total - len(missing)} of the {total} checkpointed layers (never: {said}): "
            f"the recomputation was skipped, so their activations were kept somewhere instead")


def _grade_model(report: Report, ckpt, cfg: ModelConfig) -> bool:
    """The checkpoint on a drawn Llama, every layer checkpointed: three rows, up to the first wrong."""
    import torch

    from gpumem.memory import recompute_trace as rt
    from gpumem.memory.llama import Llama
    case = f"{cfg.name} ({cfg.n_layers} layers, h {cfg.d_model}), every layer checkpointed"
    plain = rt.measure(cfg, "none", seq=SEQ, micro_batch=BATCH, keep_grads=True)
    want = recompute_cost.activation_bytes(cfg, SEQ, BATCH, "full")["saved"]
    with torch.device("meta"):
        names = [name for name, _ in Llama(cfg).named_parameters()]
    got = {}

    def body():
        cut = _cut_from_graph(ckpt)
        if refused():                   # a ready-made checkpoint or an escape: the guard's row says which
            return "wrong", ""
        if cut:
            return "wrong", cut
        got["m"], detail = measured_with_grads(cfg, ckpt, SEQ, BATCH)    # r35 #1: a weight left without one
        return ("wrong", detail) if detail else ("ok", "")
    row = run_case(report, "checkpoint", f"{case}: gradients vs no checkpointing", guarded(body))
    if row.status != "ok":
        return False
    mine = got["m"]
    bad = next((f"first differing gradient: {name}, max |got - expected| = {(g - w).abs().max().item():.3g}"
                for name, g, w in zip(names, mine.grads, plain.grads) if not (g == w).all()), None)
    if bad:
        row.status, row.detail = "wrong", bad
        return False
    ok = mine.saved == want
    report.rows.append(Row("checkpoint", f"{case}: bytes kept for backward", "ok" if ok else "wrong",
                           "" if ok else f"expected {want:,} B (only each layer's input), got {mine.saved:,} B"
                           + (": the layers' activations were kept too (the graph's or copies), so the recomputation "
                              "is skipped: run the forward without a graph, re-run it in backward"
                              if mine.saved > want else "")))
    if not ok:
        return False
    missing = reran(mine, [[i] for i in range(cfg.n_layers)])
    report.rows.append(Row("checkpoint", f"{case}: each layer re-run in backward", "wrong" if missing else "ok",
                           skipped_line(missing, cfg.n_layers) if missing else ""))
    return not missing


def _expected_peak(cfg: ModelConfig, segments) -> tuple[int, str, int]:
    """(the step's peak, where it is reached, the end of the forward's bytes) of one placement."""
    K, B, O, R = labplace.constants(cfg, SEQ, BATCH)
    end, reruns = labplace.moments(segments, cfg.n_layers, K, B, O, R)
    want = max([end, *(b for _, b in reruns)])
    at = "the end of the forward" if want == end else \
        f"the re-run of the segment from layer {next(i for i, b in reruns if b == want)}"
    return want, at, end


def _estimate_body(est, cfg: ModelConfig, segments: list, given: dict):
    got = guarded(functools.partial(_ask, est, given, [list(s) for s in segments]), answers=True)()
    if got[0] != "ok":
        return got
    got = got[1]
    if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
        return "wrong", returned(got, "a whole number of bytes (an int)")
    want, at, end = _expected_peak(cfg, segments)     # worked out after the call returns
    if int(got) == want:
        return "ok", ""
    return "wrong", (f"estimate {int(got):,} B, the step's peak is {want:,} B ({int(got) - want:+,} B), "
                     f"reached at {at}; the end of the forward holds {end:,} B")


def _grade_estimates(report: Report, est, estimates) -> None:
    for cfg, segments in estimates:
        case = f"{cfg.name} ({cfg.n_layers} layers), segments {show(segments)}"
        if run_case(report, "estimate_peak", case,
                    functools.partial(_estimate_body, est, cfg, segments, numbers(cfg))).status != "ok":
            return


def _place_body(place, ckpt, cfg: ModelConfig, budget: int, given: dict):   # the optimum: after the call
    from gpumem.memory import recompute_trace as rt
    segments = guarded(functools.partial(_ask, place, given), answers=True)()
    if segments[0] != "ok":
        return segments
    segments = segments[1]
    best = optimum(cfg, budget)
    layer = recompute_cost.layer_flops(cfg, SEQ, BATCH)["total"]
    try:
        plan = from_segments(segments, cfg.n_layers, "yours")
    except (UsageError, TypeError, ValueError) as err:
        return "wrong", f"not a list of segments: {err}" if segments is not None else returned(None, "")
    if callable(ckpt):          # the learner's checkpoint runs: the guard stays on
        m = guarded(lambda: ("ok", call(rt.measure, cfg, plan, ckpt, seq=SEQ, micro_batch=BATCH)))()
        if m[0] != "ok":
            return m
        m = m[1]
    else:
        m = rt.measure(cfg, plan, ckpt, seq=SEQ, micro_batch=BATCH)
    missing = reran(m, plan.segments)
    if missing:
        return "wrong", skipped_line(missing, sum(map(len, plan.segments)))
    if m.peak <= budget and callable(ckpt):     # r19: a checkpoint that hides its re-run from the tracer
        m = rt.measure(cfg, plan, "scratch", seq=SEQ, micro_batch=BATCH)      # the course's, its bytes
    if m.peak > budget:
        return "wrong", (f"measured peak {m.peak:,} B misses the budget by {m.peak - budget:,} B "
                         f"({m.peak_at}); {best} layer(s) checkpointed, well placed, would fit")
    if m.flops["recompute"] > best * layer:
        extra = m.flops["recompute"] / (best * layer) - 1 if best else float("inf")
        return "wrong", (f"fits (peak {m.peak:,} B) but re-runs {m.flops['recompute']:,} FLOPs; {best} layer(s) "
                         f"suffice ({best * layer:,} FLOPs): {extra:.0%} more recomputation than needed")
    return "ok", ""


def _question_case(ckpt, cfg: ModelConfig, budget: int) -> tuple[str, dict]:
    return (f"{cfg.name} ({cfg.n_layers} layers, h {cfg.d_model}), budget {budget:,} B"
            + ("" if callable(ckpt) else ", measured with the course's checkpoint"), {**numbers(cfg), "budget": budget})


def _grade_placement(report: Report, place, ckpt, q: tuple) -> str:
    """``q``: (model, budget), or a ``labcases.Question`` (its count is not kept)."""
    cfg, budget = q[0], q[-1]
    case, given = _question_case(ckpt, cfg, budget)
    return run_case(report, "place_checkpoints", case,
                    functools.partial(_place_body, place, ckpt, cfg, budget, given)).status


def _grade_gpu(report: Report, place, ckpt, ready: bool | None = None) -> str:
    """The optional GPU part (``lab_gpu``): a row only with CUDA, once the CPU rows it rests on
    pass (``ready``; all rows when None); returns the line check() prints either way."""
    ready = report.solved if ready is None else ready
    reason = lab_gpu.cuda_reason() or ("" if place is not None and callable(ckpt) and ready else
                                       "checkpoint, estimate_peak and place_checkpoints must pass on the CPU first")
    if reason:
        return f"skipped ({reason})"
    s = lab_gpu.setting()           # outside the guard: labplace is the grader's own answer

    def body():
        segments = call(place, **s["numbers"], budget=s["budget"])
        plan = from_segments(segments, s["cfg"].n_layers, "yours")
        predicted = recompute_cost.activation_bytes(s["cfg"], lab_gpu.SEQ, lab_gpu.BATCH, plan, "scratch")["peak"]
        return lab_gpu.verdict(segments, call(lab_gpu.measure_cuda, segments, ckpt), predicted, s["budget"])
    row = run_case(report, "gpu part", f"{s['cfg'].name}, seq {lab_gpu.SEQ}, on CUDA",
                   guarded(body), case_seconds(cases=6))
    return f"{row.status}: {row.detail}"


def _grade_selective(report: Report, fn, cases: list) -> None:
    """``choose_saved`` on the drawn layers (``labsac``), asked under the guard as the others are."""
    labsac.grade(report, fn, cases, lambda f, given: guarded(functools.partial(_ask, f, given), answers=True)())


def _drawn(seed):
    """The check's cases without the answers ``labcases`` drew them with (no optimum count is
    kept on the stack while the learner's functions run)."""
    cases = labcases.draw(seed)
    return (cases["grad"], [(q.cfg, q.budget) for q in cases["questions"]], cases["estimates"],
            cases["selective"])


def check(ns: dict, show: bool = True, seed: int | None = None) -> Report:
    """Grade ``checkpoint``, ``estimate_peak``, ``place_checkpoints`` and ``choose_saved`` from the
    lab's namespace on cases drawn from ``seed`` (fresh each check when None); never raises. The
    learner's code cannot read the drawn cases here (module docstring: lab_audit)."""
    report = Report(LAB)
    drawn = _drawn(seed)
    ckpt, est, place = ns.get("checkpoint"), ns.get("estimate_peak"), ns.get("place_checkpoints")
    passed = False
    if ckpt is None:
        report.rows.append(Row("checkpoint", "defined", "todo", "define checkpoint(run, *args)"))
    elif _grade_model(report, ckpt, drawn[0]):
        passed = grade_variants(report, ckpt)
    if est is None:
        report.rows.append(Row("estimate_peak", "defined", "todo", "define estimate_peak"))
    else:
        _grade_estimates(report, est, drawn[2])
    if place is None:
        report.rows.append(Row("place_checkpoints", "defined", "todo", "define place_checkpoints"))
    else:
        for q in drawn[1]:
            # measured with the learner's checkpoint once it is right, else with the course's own
            if _grade_placement(report, place, ckpt if passed else "scratch", q) != "ok":
                break
    ready = report.solved                  # the GPU part rests on the three functions above
    _grade_selective(report, ns.get("choose_saved"), drawn[3])
    gpu_line = _grade_gpu(report, place, ckpt if passed else None, ready)
    if show:
        print(report.summary())
        print(f"GPU part: {gpu_line}")
    return report
