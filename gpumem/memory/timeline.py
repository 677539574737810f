"""A memory timeline of one training step: bytes per category after every operator.

A peak is one number; the timeline shows how it comes about. :class:`TimelineTracker` is the
tracer of ``gpumem.memory.tracing`` recording, after each operator, the phase (forward,
backward, optimizer), the innermost module and the bytes of every category. :func:`record`
traces one step with it (fake tensors: a full Llama-3-70B step takes seconds).

:meth:`Timeline.zero3_per_gpu` turns the unsharded timeline into what one of N ZeRO-3 ranks
holds: parameters, gradients and optimizer states (and the optimizer's workspace, which works on
the shard) divided by N, the gradient shard held all step as DeepSpeed allocates it;
activations and the gradients of activations unchanged, since every
rank runs its own micro-batch; plus ZeRO-3's working set (``accounting.zero3_gathered``) where it
is alive: the reduce bucket all step, the gathered parameters of the steady replay module by
module, a fresh gradient in full at the operator that makes it. That view is derived from the
trace and DeepSpeed's rules, not traced; :func:`zero3_peak` reads one GPU's verdict off it.
"""

from dataclasses import dataclass, field
from functools import lru_cache

from . import accounting, models, tracing

CATEGORIES = tuple(tracing.CATEGORIES)


class TimelineTracker(tracing.PeakTracker):
    """PeakTracker that also records (phase, module, bytes per category) after every operator."""

    def __init__(self):
        super().__init__()
        self.timeline: list[tuple[str, str, tuple[int, ...]]] = []
        self._record = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # the optimizer's profiler markers run outside its step hooks: they allocate nothing and
        # would read as forward operators between backward and the step
        self._record = getattr(func, "namespace", "") != "profiler"
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        snap = next(iter(self._curr_mem_snap.values()), None)
        if snap is not None and self._record:
            m = self.moment()
            self.timeline.append((m.phase, m.module, tuple(snap.get(r, 0) for r in tracing.CATEGORIES.values())))


@dataclass
class Timeline:
    """One step's bytes per category after every operator (index = operator number)."""
    label: str
    phases: list[str]
    modules: list[str]
    series: dict[str, list[int]]
    trace: tracing.Trace | None = None
    notes: list[str] = field(default_factory=list)
    index: list[int] | None = None   # operator numbers in the full step (None: 0, 1, 2, ...)

    def __len__(self) -> int:
        return len(self.phases)

    def operators(self) -> list[int]:
        """The operator number in the full step of each entry (a thinned timeline skips some)."""
        return list(range(len(self))) if self.index is None else list(self.index)

    def total(self, i: int) -> int:
        """Bytes held after operator ``i``, all categories together."""
        return sum(s[i] for s in self.series.values())

    def at(self, i: int) -> dict[str, int]:
        """Bytes per category after operator ``i``."""
        return {k: s[i] for k, s in self.series.items()}

    def peak(self) -> int:
        """Index of the operator after which the most bytes are held (the first, on a tie)."""
        return max(range(len(self)), key=lambda i: (self.total(i), -i))

    def spans(self) -> list[tuple[str, int, int]]:
        """(phase, first index, last index) for each run of one phase."""
        out: list[tuple[str, int, int]] = []
        for i, p in enumerate(self.phases):
            if out and out[-1][0] == p:
                out[-1] = (p, out[-1][1], i)
            else:
                out.append((p, i, i))
        return out

    def moments(self) -> dict[str, int]:
        """Named moments of the step: index of each, for "who holds what, when"."""
        spans = {p: (a, b) for p, a, b in self.spans()}   # one span per phase in a plain step
        out = {"forward begins": 0}
        for phase in ("forward", "backward", "optimizer"):
            if phase in spans:
                a, b = spans[phase]
                out[f"{phase} peak"] = max(range(a, b + 1), key=lambda i: (self.total(i), -i))
                out[f"{phase} ends"] = b
        return out

    def thinned(self, points: int = 3000) -> "Timeline":
        """At most about ``points`` operators, keeping the fullest of each bucket (peaks survive)."""
        k = max(1, -(-len(self) // points))
        keep = [max(range(a, min(a + k, len(self))), key=self.total) for a in range(0, len(self), k)]
        ops = self.operators()
        return Timeline(self.label, [self.phases[i] for i in keep], [self.modules[i] for i in keep],
                        {c: [s[i] for i in keep] for c, s in self.series.items()}, self.trace,
                        self.notes + [f"every {k} operators, the fullest kept"] if k > 1 else self.notes,
                        [ops[i] for i in keep])

    def window(self, phase: str) -> "Timeline":
        """Only the operators of one phase (e.g. ``"optimizer"``), numbered as in the full step."""
        keep = [i for i, p in enumerate(self.phases) if p == phase]
        ops = self.operators()
        return Timeline(f"{self.label}, {phase} only", [self.phases[i] for i in keep],
                        [self.modules[i] for i in keep], {c: [s[i] for i in keep] for c, s in self.series.items()},
                        self.trace, self.notes, [ops[i] for i in keep])

    def zero3_per_gpu(self, gpus: int, gathered: accounting.GatheredBytes,
                      cfg: models.ModelConfig | None = None) -> "Timeline":
        """What one of ``gpus`` ZeRO-3 ranks holds at each moment (see the module docstring).

        The gradient shard is held all step, as DeepSpeed allocates it (its flat partition buffer,
        ``stage3.py`` 791-793). The working set (``accounting.zero3_gathered``) is placed where it
        is alive, not added as one constant: the reduce bucket all step; gathered parameters in
        forward and backward, per module from the steady replay when ``cfg`` is given (else its
        peak throughout); a gradient in full only at the operator that makes it (the traced
        growth of ``grads``), since the trace already holds a gradient still being computed among
        its temporaries (no double count)."""
        def split(values):
            return [accounting.shard(v, gpus) for v in values]
        s = self.series
        temps = [accounting.shard(t, gpus) if p == "optimizer" else t for p, t in zip(self.phases, s["temporaries"])]
        # DeepSpeed allocates the gradient partition once (stage3.py grad_partitions_flat_buffer,
        # every parameter's shard) and keeps it all step: the shard of every gradient, held from
        # the first operator; a fresh full gradient comes on top at the operator that makes it
        whole = max((g for g, p in zip(s["grads"], self.phases) if p == "backward"), default=0)
        grads = [max(accounting.shard(whole, gpus), g) for g in split(s["grads"])]
        for i in range(1, len(self)):
            fresh = s["grads"][i] - s["grads"][i - 1]
            if self.phases[i] == "backward" and fresh > 0:
                grads[i] += fresh
        if cfg is not None and gathered.steady:
            from . import zero3_schedule
            elem = gathered.grad // max(1, cfg.largest_layer_params())
            by = zero3_schedule.gathered_by_moment(cfg, None, elem)
            params, last = [], 0
            for phase, module in zip(self.phases, self.modules):
                last = 0 if phase == "optimizer" else by.get((phase, module), last)
                params.append(last)
        else:
            params = [0 if p == "optimizer" else gathered.gathered for p in self.phases]
        working = [g + gathered.reduce for g in params]
        series = {"params": split(s["params"]), "grads": grads, "optimizer": split(s["optimizer"]),
                  "activations": list(s["activations"]), "temporaries": temps, "gathered": working}
        return Timeline(f"{self.label}, ZeRO-3 per GPU of {gpus}", self.phases, self.modules, series,
                        self.trace, self.notes + ["derived: sharded states / N, activations as traced, "
                                                  "+ the ZeRO-3 working set where it is alive"], self.index)


def zero3_peak(cfg: models.ModelConfig | str, recipe: str = "mixed", policy: str = "none", gpus: int = 8,
               seq: int = 4096, kernel: str = "flash", tl: "Timeline | None" = None) -> dict:
    """One ZeRO-3 GPU's peak, judged from its timeline (every operator of a full step): ``total``
    bytes, ``phase``, ``module``, ``operator``, the bytes per category ``at`` that moment and the
    working set used (``working_set``). The one verdict every chapter quotes for a ZeRO-3 fit.
    ``tl``: this step's unsharded timeline when already recorded (``record`` with these settings)."""
    cfg = models.get(cfg) if isinstance(cfg, str) else cfg
    ws = accounting.zero3_gathered(cfg, recipe)
    z = (tl or recorded(cfg, recipe, kernel, policy, seq)).zero3_per_gpu(gpus, ws, cfg)
    i = z.peak()
    return {"total": z.total(i), "phase": z.phases[i], "module": z.modules[i], "operator": i,
            "operators": len(z), "at": z.at(i), "working_set": ws, "timeline": z}


def record(cfg: models.ModelConfig | str, recipe: str = "mixed", kernel: str = "flash",
           policy: str = "none", seq: int = 4096, micro_batch: int = 1, norm: str = "fused",
           adamw: str = "for-loop") -> Timeline:
    """Trace one full training step of ``cfg`` (every layer, fake tensors) with its timeline."""
    tr = tracing.trace_step(cfg, recipe, kernel, policy, seq, micro_batch, tracker_cls=TimelineTracker,
                            norm=norm, adamw=adamw)
    rows = tr.timeline or []
    series = {c: [r[2][j] for r in rows] for j, c in enumerate(CATEGORIES)}
    return Timeline(f"{tr.model}, {recipe}, checkpoint {policy}", [r[0] for r in rows],
                    [r[1] for r in rows], series, tr)


def recorded(cfg: models.ModelConfig | str, recipe: str = "mixed", kernel: str = "flash",
             policy: str = "none", seq: int = 4096) -> Timeline:
    """:func:`record`, kept for the process: a full 70B timeline takes seconds and several
    chapters' figures read the same one (treat it as read-only). A model named or given as its
    config is one entry."""
    return _recorded(models.get(cfg) if isinstance(cfg, str) else cfg, recipe, kernel, policy, seq)


@lru_cache(maxsize=6)
def _recorded(cfg: models.ModelConfig, recipe: str, kernel: str, policy: str, seq: int) -> Timeline:
    return record(cfg, recipe, kernel, policy, seq)
