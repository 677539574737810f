"""Exact memory traces of one training step (forward, backward, AdamW step).

The step runs under PyTorch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``, a private
API: torch is pinned to 2.13.0 and ``tests/test_01_memory_anatomy.py`` tests this wrapper). On fake
tensors (``FakeTensorMode``) nothing is allocated, so a full Llama-3-70B step can be traced on
a laptop; on real tensors the same code measures a tiny model, and the two must agree.

:class:`PeakTracker` adds what MemTracker's snapshot lacks: each category's *own* peak and the
moment it happened (phase and innermost module). It also skips MemTracker's per-module peak
bookkeeping, which costs O(modules) per operator and made a naive 80-layer trace take minutes.

Categories: ``params``, ``grads``, ``optimizer`` (states that exist before the step: moments,
master weights), ``activations`` (made in forward or recompute), ``temporaries`` (made in
backward, and workspace made inside ``optimizer.step``). Which AdamW runs, and what workspace
each implementation allocates, is said in ``gpumem.memory.optim``.
"""

import contextlib
import itertools
import time
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _TOTAL_KEY

from . import models
from ..errors import one_of, positive_int
from .accounting import RECIPES
from .llama import Llama, recomputing
from .policies import ADAMW_IMPLS, KERNELS, NORMS, POLICIES
from .optim import MasterWeightAdamW, make_optimizer  # noqa: F401  (make_optimizer: measure uses it)

CATEGORIES = {"params": _MemRefType.PARAM, "grads": _MemRefType.GRAD,
              "optimizer": _MemRefType.OPT, "activations": _MemRefType.ACT,
              "temporaries": _MemRefType.TEMP}


def param_dtype(recipe: str) -> torch.dtype:
    """The dtype parameters are created in: fp32 for the fp32 recipe, bf16 for the others."""
    return torch.float32 if recipe == "fp32" else torch.bfloat16


@dataclass
class Moment:
    """When a peak happened: the phase of the step and the innermost module running."""
    phase: str      # forward | backward | optimizer
    module: str     # innermost module active, e.g. "layers.3.mlp.down"

    def __str__(self):
        return f"{self.phase} {self.module}".strip()


@dataclass
class Trace:
    """One traced training step: its settings, each category's peak bytes and moment, and the total peak."""
    model: str
    recipe: str
    kernel: str
    policy: str
    seq: int
    micro_batch: int
    norm: str = "fused"
    adamw: str = "for-loop"
    peaks: dict[str, int] = field(default_factory=dict)         # category -> own peak (bytes)
    peak_moments: dict[str, Moment] = field(default_factory=dict)
    total_peak: int = 0
    total_peak_moment: Moment | None = None
    at_total_peak: dict[str, int] = field(default_factory=dict)  # breakdown at that moment
    seconds: float = 0.0
    method: str = "full"
    timeline: list | None = None   # per operator, when traced with timeline.TimelineTracker
    at_moments: dict | None = None  # (phase, module) -> (largest total there, breakdown, when)

    def as_dict(self) -> dict:
        return {"model": self.model, "recipe": self.recipe, "kernel": self.kernel,
                "policy": self.policy, "seq": self.seq, "micro_batch": self.micro_batch,
                "norm": self.norm, "adamw": self.adamw,
                "peaks": dict(self.peaks),
                "peak_moments": {k: str(v) for k, v in self.peak_moments.items()},
                "total_peak": self.total_peak, "total_peak_moment": str(self.total_peak_moment),
                "at_total_peak": dict(self.at_total_peak),
                "seconds": round(self.seconds, 3), "method": self.method}


class PeakTracker(MemTracker):
    """MemTracker keeping per-category peaks with their moments (global numbers only)."""

    def __init__(self):
        super().__init__()
        self.cat_peaks: dict[str, tuple[int, Moment]] = {}
        self.total: tuple[int, Moment, dict] = (0, Moment("", ""), {})
        self.first: dict[str, int] | None = None   # categories when the step began
        # every moment's own largest total: (phase, module) -> (total, breakdown, order seen)
        self.at_moments: dict[tuple[str, str], tuple[int, dict, int]] = {}
        self.updates = 0
        self._entered: dict[str, int] = {}   # module name -> when it was last entered
        self._clock = itertools.count()

    def _pre_fw_hook(self, module, inputs) -> None:
        self._entered[self._mod_tracker.get_known_fqn(module)] = next(self._clock)
        super()._pre_fw_hook(module, inputs)

    def _pre_bw_hook(self, module, args) -> None:
        if module is not None:
            self._entered[self._mod_tracker.get_known_fqn(module)] = next(self._clock)
        super()._pre_bw_hook(module, args)

    def moment(self) -> Moment:
        """Phase and the module entered last of those still running. (ModTracker's ``parents`` is a
        set; in backward it can hold several modules of one depth, e.g. a layer's gate and up
        projections, so "the deepest name" would depend on the set's order.)"""
        phase = "optimizer" if self._in_opt else ("backward" if self._mod_tracker.is_bw else "forward")
        names = [p for p in self._mod_tracker.parents if p != "Global"]
        inner = max(names, key=lambda n: (self._entered.get(n, -1), n.count(".")), default="")
        # the root module's own code (final norm done, head done) is the loss
        return Moment(phase, inner.split(".", 1)[1] if "." in inner else "loss" if inner else "")

    def _track(self, reftype, t):
        # New tensors inside optimizer.step are workspace; the states were created before the
        # traced step and stay tracked as Optstate.
        if reftype == _MemRefType.OPT:
            reftype = _MemRefType.TEMP
        # MemTracker spots recomputation only while the first re-run *module* is active; the
        # checkpoint's own recompute context (see llama.ckpt) marks all of it.
        elif reftype == _MemRefType.TEMP and recomputing():
            reftype = _MemRefType.ACT
        super()._track(reftype, t)

    def retag(self, t: torch.Tensor, category: str) -> None:
        self._update_and_maybe_create_winfos(t, CATEGORIES[category])

    def _update_peak_stats(self, peak_state) -> None:
        snap = next(iter(self._curr_mem_snap.values()), None)
        if snap is None:
            return
        if self.first is None:
            self.first = {n: snap.get(r, 0) for n, r in CATEGORIES.items()}
        self.updates += 1
        moment = self.moment()
        for name, ref in CATEGORIES.items():
            if snap.get(ref, 0) > self.cat_peaks.get(name, (-1,))[0]:
                self.cat_peaks[name] = (snap[ref], moment)
        total, key = snap[_TOTAL_KEY], (moment.phase, moment.module)
        if total > self.at_moments.get(key, (-1,))[0]:
            breakdown = {n: snap.get(r, 0) for n, r in CATEGORIES.items()}
            self.at_moments[key] = (total, breakdown, self.updates)
            if total > self.total[0]:
                self.total = (total, moment, breakdown)


def build(cfg: models.ModelConfig, recipe: str, fake: bool, seed: int = 0, norm: str = "fused",
          adamw: str = "for-loop"):
    """Model, optimizer and a batch of tokens; under ``fake``, nothing is allocated."""
    return build_with(lambda: Llama(cfg, norm), recipe, fake, seed, adamw)


def build_with(make_model, recipe: str, fake: bool, seed: int = 0, adamw: str = "for-loop"):
    """``make_model()`` and its optimizer in the recipe's dtype, under fake tensors if ``fake``
    (the course's Llama here, transformers' own model in ``hf_trace``); returns them and the mode."""
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    old = torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(param_dtype(recipe))
    try:
        with mode:
            model = make_model()
            opt = make_optimizer(model, recipe, adamw)
    finally:
        torch.set_default_dtype(old)
    return model, opt, mode


def training_step(model, opt, tokens, targets, kernel: str, policy: str):
    """One forward, backward and optimizer step, gradients freed after; returns the loss."""
    loss = model(tokens, targets, kernel=kernel, policy=policy)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def validate(recipe: str, kernel: str, policy: str, seq, micro_batch, norm: str = "fused",
             adamw: str = "for-loop") -> tuple[int, int]:
    """Check the trace settings (UsageError on bad ones); returns seq and micro-batch as positive ints."""
    one_of(recipe, RECIPES, "recipe")
    one_of(kernel, KERNELS, "attention kernel")
    one_of(policy, POLICIES, "checkpoint policy")
    one_of(norm, NORMS, "norm")
    one_of(adamw, ADAMW_IMPLS, "AdamW implementation")
    return positive_int(seq, "sequence length"), positive_int(micro_batch, "micro-batch")


def trace_step(cfg: models.ModelConfig | str, recipe: str = "mixed", kernel: str = "flash",
               policy: str = "none", seq: int = 4096, micro_batch: int = 1,
               fake: bool = True, seed: int = 0, tracker_cls: type = PeakTracker,
               norm: str = "fused", adamw: str = "for-loop") -> Trace:
    """Run one training step of ``cfg`` under :class:`PeakTracker` and return its :class:`Trace`."""
    cfg = models.get(cfg) if isinstance(cfg, str) else cfg
    seq, micro_batch = validate(recipe, kernel, policy, seq, micro_batch, norm, adamw)
    start = time.perf_counter()
    model, opt, mode = build(cfg, recipe, fake, seed, norm, adamw)
    with mode:
        gen = None if fake else torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab, (micro_batch, seq + 1), generator=gen)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)  # data, untracked
        tracker = tracker_cls()
        tracker.track_external(model, opt)
        if isinstance(opt, MasterWeightAdamW):
            opt.on_fp32_grad = lambda t: tracker.retag(t, "grads")
        with tracker:
            training_step(model, opt, inputs, targets, kernel, policy)
    out = Trace(cfg.name, recipe, kernel, policy, seq, micro_batch, norm, adamw, method="full",
                timeline=getattr(tracker, "timeline", None))
    for name in CATEGORIES:
        out.peaks[name], out.peak_moments[name] = tracker.cat_peaks.get(name, (0, Moment("", "")))
        if tracker.first and out.peaks[name] == tracker.first[name]:   # never grew: held all along
            out.peak_moments[name] = Moment("whole step", "")
    out.total_peak, out.total_peak_moment, out.at_total_peak = tracker.total
    out.at_moments = tracker.at_moments
    out.seconds = time.perf_counter() - start
    return out
