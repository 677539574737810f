"""Lab 03's ``check()``: the learner's checkpoint and checkpoint placement, measured.

The learner writes two functions:

* ``checkpoint(run, *args)``: ``run(*args)`` under activation checkpointing, more general than
  the chapter's ``Checkpoint``: ``args`` may mix tensors and other values, ``run`` may return
  several tensors, and it may draw random numbers (dropout), which the re-run must replay.
  Graded on a model the lab never shows (the gradients must equal the plain step's, and with
  every layer checkpointed the forward must keep only the layers' inputs, as the course's tracer
  measures) and on small functions of each of those three kinds, against plain autograd.
  Ready-made checkpoints (``torch.utils.checkpoint``, DeepSpeed's, the course's) refuse to run
  while the learner's code does (``labguard``).
* ``place_checkpoints(n_layers, layer_bytes, checkpoint_bytes, other_bytes, budget)``: which
  layers to checkpoint (a list of segments) so that the step's activation peak stays within
  ``budget`` bytes with the least recomputation. Graded by running the learner's placement with
  the learner's checkpoint on real tensors: the measured peak against the budget, the measured
  recompute FLOPs against the fewest possible, found by a search over every placement
  (``labplace``), not assumed to be "the first c layers, one each": on ``lab-d`` (12 layers) that
  placement needs one layer more than the best one.

Budgets are set between two placements, so that one layer fewer misses and any layer more is
recomputation the budget did not need.
"""

from gpumem.course.grading import Report, Row, call, case_seconds, kind, returned, run_case
from gpumem.errors import UsageError
from gpumem.memory import recompute_cost
from gpumem.memory.models import ModelConfig
from gpumem.memory.recompute_plans import from_segments

from . import lab_gpu, labplace
from .labguard import guarded, refused

LAB = "lab03_checkpoint_budget"
SEQ, BATCH = 32, 2
# Wide layers and small vocabularies: the loss is small beside a layer, so where the checkpoints
# go matters (a re-run late in backward happens while every earlier layer still holds its own).
CASES = ((ModelConfig("lab-a", 6, 96, 6, 2, 256, 128, teaching=True), 3),
         (ModelConfig("lab-b", 5, 128, 8, 4, 352, 96, teaching=True), 2),
         (ModelConfig("lab-c", 7, 64, 4, 1, 192, 64, teaching=True), 5),
         # 12 thin layers: the best 10-layer placement merges layers into longer segments; the
         # first 10 layers one each miss the budget, and the first 11 re-run one layer too many
         (ModelConfig("lab-d", 12, 64, 4, 1, 64, 400, teaching=True), 10))
GRAD_CASE = ModelConfig("lab-g", 3, 80, 5, 5, 224, 200, teaching=True)


def numbers(cfg: ModelConfig, seq: int = SEQ, batch: int = BATCH) -> dict:
    """What ``place_checkpoints`` is given for ``cfg``: a plain layer's bytes, a checkpoint's, and
    the rest the step holds when the forward ends (RoPE tables, final norm, head input, loss)."""
    return labplace.numbers(cfg, seq, batch)


def budget_for(cfg: ModelConfig, count: int, seq: int = SEQ, batch: int = BATCH) -> int:
    """A budget that ``count`` checkpointed layers, well placed, meet and no fewer do."""
    return labplace.budget_for(cfg, count, seq, batch)


def optimum(cfg: ModelConfig, budget: int, seq: int = SEQ, batch: int = BATCH) -> int:
    """The fewest layers any placement re-runs within ``budget`` (search over every placement)."""
    return labplace.optimum(cfg, budget, seq, batch)


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


def _grade_checkpoint(report: Report, ckpt) -> bool:
    from gpumem.memory import recompute_trace as rt
    case = f"{GRAD_CASE.name}, {GRAD_CASE.n_layers} layers, every layer checkpointed"
    start = len(report.rows)

    def body():
        cut = _cut_from_graph(ckpt)
        if refused():                   # a ready-made checkpoint: the guard's row says which
            return "wrong", ""
        if cut:
            return "wrong", cut
        plain = rt.measure(GRAD_CASE, "none", seq=SEQ, micro_batch=BATCH, keep_grads=True)
        mine = call(rt.measure, GRAD_CASE, "full", ckpt, seq=SEQ, micro_batch=BATCH, keep_grads=True)
        import torch

        from gpumem.memory.llama import Llama
        with torch.device("meta"):
            names = [name for name, _ in Llama(GRAD_CASE).named_parameters()]
        bad = next((f"first differing gradient: {name}, max |got - expected| = {(g - w).abs().max().item():.3g}"
                    for name, g, w in zip(names, mine.grads, plain.grads) if not (g == w).all()), None)
        report.rows.append(Row("checkpoint", f"{case}: gradients vs no checkpointing", "wrong" if bad else "ok",
                               bad or ""))
        want = recompute_cost.activation_bytes(GRAD_CASE, SEQ, BATCH, "full")["saved"]
        ok = mine.saved == want
        report.rows.append(Row("checkpoint", f"{case}: bytes kept for backward", "ok" if ok else "wrong",
                               "" if ok else f"expected {want:,} B (only each layer's input), got {mine.saved:,} B"
                               + (": the segments' activations were kept too (run the forward without a graph)"
                                  if mine.saved > want else "")))
    run_case(report, "checkpoint", case, guarded(body))
    return all(r.status == "ok" for r in report.rows[start:])


def _variants():
    """Unseen cases for the general checkpoint: (name, run, args) with w a weight to differentiate."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(3)
    w = torch.randn(12, 12, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(5, 12, generator=g, dtype=torch.float64, requires_grad=True)

    def dropout(x):
        return F.dropout(torch.tanh(x @ w), 0.4, training=True) @ w

    def two_outputs(x):
        y = torch.sin(x @ w)
        return y * x, y.sum(dim=1)

    def with_options(x, scale, how):
        y = (x @ w) * scale
        return torch.tanh(y) if how == "tanh" else torch.relu(y)
    return w, x, (("random numbers (dropout) replayed", dropout, (x,)),
                  ("two outputs", two_outputs, (x,)),
                  ("non-tensor arguments (a float, a string)", with_options, (x, 0.7, "tanh")))


def _loss(out):
    import torch
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o * torch.arange(1, o.numel() + 1, dtype=o.dtype).reshape(o.shape)).sum() for o in outs)


def _grade_variants(report: Report, ckpt) -> None:
    import torch
    w, x, cases = _variants()
    for name, run, args in cases:
        def body(run=run, args=args):
            grads = []
            for wrap in (run, lambda *a: call(ckpt, run, *a)):
                w.grad = x.grad = None
                torch.manual_seed(11)
                out = wrap(*args)
                outs = out if isinstance(out, tuple) else (out,)
                if not all(torch.is_tensor(o) for o in outs):
                    return "wrong", "checkpoint(run, ...) " + returned(out, "what run returns (a tensor or a tuple of them)")
                if not all(o.requires_grad for o in outs):
                    return "wrong", "an output does not require grad: it is cut from the graph"
                torch.rand(7)                         # the RNG moves on between forward and backward
                call(lambda: _loss(out).backward())
                if w.grad is None or x.grad is None:
                    return "wrong", f"no gradient reached {'the weight' if w.grad is None else 'the input'}: it is cut from the graph"
                grads.append((w.grad.clone(), x.grad.clone()))
            diff = max(float((a - b).abs().max()) for a, b in zip(*grads))
            return ("ok", "") if diff == 0 else ("wrong", f"gradients differ from plain autograd by up to {diff:.3g}")
        run_case(report, "checkpoint", f"unseen case: {name}", guarded(body))


def _grade_placement(report: Report, place, ckpt, cfg: ModelConfig, count: int) -> None:
    from gpumem.memory import recompute_trace as rt
    budget = budget_for(cfg, count)
    n = numbers(cfg)
    case = f"{cfg.name}, {cfg.n_layers} layers, budget {budget:,} B" + (
        "" if callable(ckpt) else ", measured with the course's checkpoint")

    def body():
        segments = guarded(lambda: ("ok", call(place, **n, budget=budget)))()
        if segments[0] != "ok":
            return segments
        segments = segments[1]
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
        best = optimum(cfg, budget)
        layer = recompute_cost.layer_flops(cfg, SEQ, BATCH)["total"]
        if m.peak > budget:
            return "wrong", (f"measured peak {m.peak:,} B misses the budget by {m.peak - budget:,} B "
                             f"({m.peak_at}); {best} layer(s) checkpointed, well placed, would fit")
        if m.flops["recompute"] > best * layer:
            extra = m.flops["recompute"] / (best * layer) - 1 if best else float("inf")
            return "wrong", (f"fits (peak {m.peak:,} B) but re-runs {m.flops['recompute']:,} FLOPs; {best} layer(s) "
                             f"suffice ({best * layer:,} FLOPs): {extra:.0%} more recomputation than needed")
        return "ok", ""
    run_case(report, "place_checkpoints", case, body)


def _grade_gpu(report: Report, place, ckpt) -> None:
    """The optional GPU part (``lab_gpu``): skipped, with the reason, without CUDA or before the
    checkpoint and the placements pass on the CPU."""
    reason = lab_gpu.cuda_reason() or ("" if place is not None and callable(ckpt) and report.solved else
                                       "checkpoint and place_checkpoints must pass on the CPU first")
    if reason:
        report.rows.append(Row("gpu part", "optional GPU part", "ok", "skipped: " + reason))
        return

    s = lab_gpu.setting()           # outside the guard: labplace is the grader's own answer

    def body():
        segments = call(place, **s["numbers"], budget=s["budget"])
        plan = from_segments(segments, s["cfg"].n_layers, "yours")
        predicted = recompute_cost.activation_bytes(s["cfg"], lab_gpu.SEQ, lab_gpu.BATCH, plan, "scratch")["peak"]
        return lab_gpu.verdict(segments, call(lab_gpu.measure_cuda, segments, ckpt), predicted, s["budget"])
    run_case(report, "gpu part", f"{s['cfg'].name}, seq {lab_gpu.SEQ}, on CUDA",
             guarded(body), case_seconds(cases=6))


def check(ns: dict, show: bool = True) -> Report:
    """Grade ``checkpoint`` and ``place_checkpoints`` from the lab's namespace; never raises."""
    report = Report(LAB)
    ckpt, place = ns.get("checkpoint"), ns.get("place_checkpoints")
    passed = False
    if ckpt is None:
        report.rows.append(Row("checkpoint", "defined", "todo", "define checkpoint(run, *inputs)"))
    else:
        passed = _grade_checkpoint(report, ckpt)
        _grade_variants(report, ckpt)
    for cfg, count in CASES:
        if place is None:
            report.rows.append(Row("place_checkpoints", cfg.name, "todo", "define place_checkpoints"))
            continue
        # measured with the learner's checkpoint once it is right, else with the course's own
        _grade_placement(report, place, ckpt if passed else "scratch", cfg, count)
    _grade_gpu(report, place, ckpt if passed else None)
    if show:
        print(report.summary())
    return report
