"""One training step under a checkpoint plan, measured: bytes, FLOPs and the order of events.

:func:`measure` runs forward and backward of the course's Llama under a plan
(``gpumem.memory.recompute``) once, inside two tracers at the same time:

* the memory tracer of chapter 01 (``gpumem.memory.timeline.TimelineTracker``, MemTracker),
  with tensors made while a forward is re-run in backward counted as activations;
* :class:`gpumem.memory.flops.PhaseFlops`, filing each operator under what runs at that moment
  (:class:`Recorder`): ``forward``, ``recompute`` or ``backward``, and of which part (``embed``,
  ``rope``, ``L0`` ... ``L{n-1}``, ``head``, ``loss``).

Measured: ``saved`` (activation bytes alive when backward starts: what the forward kept),
``peak`` (the activation peak of the step, forward or re-run), ``layer_peak`` (the peak while a
layer is re-run or differentiated: the step without its loss), FLOPs per phase, the events.

The recorder knows the part from module hooks (forward and re-runs) and, in backward, from
gradient hooks on each part's output: the part whose output gradient arrived last is the one
being differentiated (autograd runs one node at a time on CPU). On fake tensors (the default
for registry models) nothing is allocated, so a Llama-3-70B step is measured on a laptop; on
real tensors the same step also returns the gradients.
"""

import time
from dataclasses import dataclass, field

import torch

from . import flops as flop_counter, models, recompute, timeline as timelines, tracing
from .recompute_plans import Plan, plan as make_plan
from ..errors import UsageError, one_of, positive_int


class Recorder:
    """Hooks on a Llama's parts that say, at any moment, which phase and part is running."""

    def __init__(self, model):
        self.stack: list[str] = []        # parts whose forward is running (innermost last)
        self.window = "loss"              # in backward: the part being differentiated
        self.in_backward = False
        self.head_done = False            # before the head, code outside the parts is RoPE's
        self.handles = []
        parts = [("embed", model.embed), *[(f"L{i}", m) for i, m in enumerate(model.layers)],
                 ("head", model.norm), ("head", model.head)]
        for label, module in parts:
            self.handles.append(module.register_forward_pre_hook(self._pre(label)))
            self.handles.append(module.register_forward_hook(self._post(label), always_call=True))

    def _pre(self, label):
        def hook(module, args):
            self.stack.append(label)
        return hook

    def _post(self, label):
        def hook(module, args, out):
            self.stack.pop()
            self.head_done |= label == "head"
            if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
                out.register_hook(lambda grad: self._enter(label))
        return hook

    def _enter(self, label) -> None:
        self.window = label

    def where(self) -> tuple[str, str]:
        """(phase, part) of the operator running now."""
        if recompute.recomputing():
            return "recompute", self.stack[-1] if self.stack else self.window
        if self.in_backward:
            return "backward", self.window
        return "forward", self.stack[-1] if self.stack else ("loss" if self.head_done else "rope")

    def remove(self) -> None:
        """Take the hooks off the model."""
        for h in self.handles:
            h.remove()


class PlanTracker(timelines.TimelineTracker):
    """Chapter 01's timeline tracer; what a re-run makes in backward counts as activations, and
    each row is labelled with the recorder's (phase, part) instead of the module's name."""

    def __init__(self, where=None):
        super().__init__()
        self.where = where

    def _update_peak_stats(self, peak_state) -> None:
        rows = len(self.timeline)
        super()._update_peak_stats(peak_state)
        if self.where is not None and len(self.timeline) > rows:
            self.timeline[-1] = (*self.where(), self.timeline[-1][2])

    def _track(self, reftype, t):
        if reftype == tracing.CATEGORIES["temporaries"] and recompute.recomputing():
            reftype = tracing.CATEGORIES["activations"]
        super()._track(reftype, t)


@dataclass
class Measured:
    """One step under one plan: bytes (activations), FLOPs per phase, events, and timeline."""
    model: str
    plan: str
    impl: str
    kernel: str
    seq: int
    micro_batch: int
    fake: bool
    saved: int = 0                  # activation bytes alive when backward starts
    peak: int = 0                   # activation bytes at their peak (forward or re-run)
    peak_at: str = ""
    layer_peak: int = 0             # activation peak while a layer is re-run or differentiated
    peak_with_temporaries: int = 0  # activations + backward temporaries, at their joint peak
    flops: dict[str, int] = field(default_factory=dict)   # forward | recompute | backward
    events: list[dict] = field(default_factory=list)
    timeline: timelines.Timeline | None = None
    loss: float | None = None
    grads: list | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        """JSON-ready: everything but the timeline and the gradients."""
        keys = ("model", "plan", "impl", "kernel", "seq", "micro_batch", "fake", "saved", "peak",
                "peak_at", "layer_peak", "peak_with_temporaries", "flops", "events", "loss")
        return {k: getattr(self, k) for k in keys} | {"seconds": round(self.seconds, 3)}


def events_of(runs: list[list]) -> list[dict]:
    """Operator runs merged into events: one per (phase, part) stretch, with operators and FLOPs."""
    return [{"phase": key[0], "part": key[1], "ops": ops, "flops": fl} for key, ops, fl in runs]


class NoGradient(UsageError):
    """A parameter with no gradient after the step's backward: the checkpoint ``impl``'s backward
    never reached it. ``name`` is the parameter's (``layers.0.attn.wq.weight``)."""

    def __init__(self, name: str):
        super().__init__(f"parameter {name} got no gradient: the checkpoint's backward never reached it "
                         f"(a re-run must send gradients into the weights it uses, not only into its inputs)")
        self.name = name


def _grads(net) -> list:
    """Copies of every parameter's gradient, in ``named_parameters`` order; :class:`NoGradient`
    names the first parameter without one (review r35 #1: an AttributeError on ``None``)."""
    missing = next((name for name, q in net.named_parameters() if q.grad is None), None)
    if missing is not None:
        raise NoGradient(missing)
    return [q.grad.detach().clone() for q in net.parameters()]


def measure(model: str | models.ModelConfig = "tiny", plan: str | Plan = "none", impl="torch",
            kernel: str = "flash", seq: int | None = None, micro_batch: int | None = None, recipe: str = "mixed",
            fake: bool | None = None, seed: int = 0, keep_grads: bool = False) -> Measured:
    """Forward and backward of ``model`` under ``plan`` with checkpoint ``impl`` (a name of
    ``recompute.IMPLS`` or a function ``impl(run, *inputs)``); real tensors for teaching models,
    fake ones for the others unless ``fake`` says otherwise. Sequence and micro-batch default to
    64 x 2 for teaching models, 4096 x 1 for the others. ``keep_grads`` (real tensors): ``grads``
    holds each parameter's gradient; :class:`NoGradient` names a parameter backward never reached."""
    cfg = models.get(model) if isinstance(model, str) else model
    seq = positive_int(seq or (64 if cfg.teaching else 4096), "sequence length")
    micro_batch = positive_int(micro_batch or (2 if cfg.teaching else 1), "micro-batch")
    if not callable(impl):
        one_of(impl, recompute.IMPLS, "checkpoint implementation")
    p = make_plan(plan, cfg.n_layers) if isinstance(plan, str) else plan
    fake = (not cfg.teaching) if fake is None else fake
    start = time.perf_counter()
    net, _, mode = tracing.build(cfg, recipe, fake, seed)
    out = Measured(cfg.name, p.name, impl if isinstance(impl, str) else "custom", kernel, seq,
                   micro_batch, fake)
    with mode:
        gen = None if fake else torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab, (micro_batch, seq + 1), generator=gen)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)
        rec = Recorder(net)
        tracker = PlanTracker(rec.where)
        tracker.track_external(net)
        counter = flop_counter.PhaseFlops(rec.where)
        try:
            with tracker, counter:
                loss = recompute.loss_of(net, inputs, targets, kernel, p, impl)
                forward_end = len(tracker.timeline)
                rec.in_backward = True
                loss.backward()
        finally:
            rec.remove()
        if not fake:
            out.loss = loss.item()
            if keep_grads:
                out.grads = _grads(net)
    rows = tracker.timeline
    cats = list(tracing.CATEGORIES)
    series = {c: [r[2][j] for r in rows] for j, c in enumerate(cats)}
    out.timeline = timelines.Timeline(f"{cfg.name}, checkpoint {p.name}", [r[0] for r in rows],
                                      [r[1] for r in rows], series)
    acts, temps = series["activations"], series["temporaries"]
    out.saved = acts[forward_end - 1] if forward_end else 0
    top = max(range(len(acts)), key=lambda i: (acts[i], -i))
    out.peak, out.peak_at = acts[top], f"{rows[top][0]} {rows[top][1]}".strip()
    out.layer_peak = max((a for a, r in zip(acts, rows) if r[0] != "forward" and r[1].startswith("L")),
                         default=0)
    out.peak_with_temporaries = max(a + t for a, t in zip(acts, temps))
    for phase in ("forward", "recompute", "backward"):
        out.flops[phase] = sum(v for k, v in counter.by_key.items() if k[0] == phase)
    out.events = events_of(counter.runs)
    out.seconds = time.perf_counter() - start
    return out
