"""The full-depth trace of a Llama step, composed from three shallow traces (``trace_fast``).

Tracing all 80 layers of Llama-3-70B on fake tensors takes several times longer than tracing 4, 6
and 8 and extrapolating: every layer adds the same bytes, so each category's peak is affine in the
depth. The total peak is the subtle part: its moment can move with depth, so every moment the
probes share is carried to full depth on its own (:func:`_largest_moment`). ``tracer.trace_step``
does the tracing; tests compare this composition with full traces byte for byte.
"""

import time

from . import models, tracer as tracing
from .tracer import CATEGORIES, Moment, Trace, validate


def _layer_index(moment: Moment) -> int | None:
    parts = moment.module.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[0] == "layers" else None


def _extend_moment(moments: list[Moment], depths: list[int], n_layers: int) -> Moment:
    """Carry a probe's moment to the full depth: a layer counted from the start or the end."""
    first = moments[0]
    idx = [_layer_index(m) for m in moments]
    if idx[0] is None or any(m.phase != first.phase for m in moments):
        return first
    rest = first.module.split(".", 2)[2:]
    if len(set(d - 1 - i for d, i in zip(depths, idx))) == 1:
        i = n_layers - 1 - (depths[0] - 1 - idx[0])
    elif len(set(idx)) == 1:
        i = idx[0]
    else:
        return Moment(first.phase, "layers.?")
    return Moment(first.phase, ".".join(["layers", str(i), *rest]))


def trace_fast(cfg: models.ModelConfig | str, recipe: str = "mixed", kernel: str = "flash",
               policy: str = "none", seq: int = 4096, micro_batch: int = 1, norm: str = "fused",
               adamw: str = "for-loop") -> Trace:
    """The full-depth trace, composed from three shallow ones.

    Every layer of a Llama adds the same bytes to each category, so each peak is affine in the
    depth L. Checkpoint policies that alternate (every-2, every-other) repeat every two layers,
    so the probes are L0, L0+2, L0+4 with L0 of L's parity (4 or 5: each probe has two layers
    inside the stack beside the first and the last). The third probe checks that the second
    differences are zero; if one is not, the full trace runs instead (``method`` says which).

    The total peak is not one affine function: its moment can move with depth (at 70B in pure
    bf16 the states outgrow the activations, and the peak moves from the start of backward to
    its end). So every moment the probes share is carried to L on its own, and the largest
    wins (:func:`_largest_moment`). Tests compare this with full traces byte for byte.
    """
    cfg = models.get(cfg) if isinstance(cfg, str) else cfg
    seq, micro_batch = validate(recipe, kernel, policy, seq, micro_batch, norm, adamw)
    opts = dict(norm=norm, adamw=adamw)
    L = cfg.n_layers
    d0 = 4 if L % 2 == 0 else 5
    depths = [d0, d0 + 2, d0 + 4]
    if L <= depths[-1]:
        return tracing.trace_step(cfg, recipe, kernel, policy, seq, micro_batch, **opts)
    start = time.perf_counter()
    probes = [tracing.trace_step(models.with_layers(cfg, d), recipe, kernel, policy, seq, micro_batch, **opts)
              for d in depths]
    redo = (cfg, recipe, kernel, policy, seq, micro_batch, start, opts)

    def extend(values: list[int]) -> int | None:
        step = values[1] - values[0]
        if values[2] - values[1] != step or step % 2:
            return None
        return values[0] + step // 2 * (L - d0)

    out = Trace(cfg.name, recipe, kernel, policy, seq, micro_batch, norm, adamw, method="composed")
    for name in CATEGORIES:
        value = extend([p.peaks[name] for p in probes])
        if value is None:
            return _fallback(*redo)
        out.peaks[name] = value
        out.peak_moments[name] = _extend_moment([p.peak_moments[name] for p in probes], depths, L)
    best = _largest_moment(probes, depths, L, extend)
    states = out.peaks["params"] + out.peaks["optimizer"]   # alive the whole step
    if best is None or best[0] < states:
        return _fallback(*redo)
    out.total_peak, out.total_peak_moment, out.at_total_peak = best
    out.seconds = time.perf_counter() - start
    return out


def _moment_keys(phase: str, module: str, depth: int) -> list[tuple]:
    """The names a moment keeps at every depth: a layer's moment counted from the first layer and
    from the last (a moment in layer i of a d-layer probe is both ``("first", i)`` and
    ``("last", d - 1 - i)``), any other moment (embedding, loss, optimizer) by its own name."""
    parts = module.split(".", 2)
    if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit():
        i, rest = int(parts[1]), tuple(parts[2:])
        role = "first layer" if i == 0 else "last layer" if i == depth - 1 else "inside"
        return [(phase, "first", i, rest, role), (phase, "last", depth - 1 - i, rest, role)]
    return [(phase, module)]


def _key_moment(key: tuple, n_layers: int) -> Moment:
    if len(key) == 2:
        return Moment(*key)
    phase, end, i, rest, _ = key
    return Moment(phase, ".".join(["layers", str(i if end == "first" else n_layers - 1 - i), *rest]))


def _largest_moment(probes: list[Trace], depths: list[int], n_layers: int, extend):
    """The total peak at full depth: every moment the probes share, carried to ``n_layers`` on its
    own, and the largest taken (the earliest of equals, as a full trace reports it).

    Inside the stack a moment's bytes are affine in the layer's index (within each parity, for
    alternating policies) and in the depth, so the largest over all layers is at the first or last
    two inside layers or at the first or last layer itself, which every probe has in the same role
    (a key names the role, so a layer that is inside one probe and the stack's end in another is
    not compared). A moment whose bytes do not grow linearly returns None (the caller traces in full)."""
    seen = []
    for p, d in zip(probes, depths):
        table = {}
        for (phase, module), value in p.at_moments.items():
            for key in _moment_keys(phase, module, d):
                table[key] = value
        seen.append(table)
    best = None
    for key in set(seen[0]).intersection(*seen[1:]):
        total = extend([t[key][0] for t in seen])
        if total is None:
            return None
        order = seen[-1][key][2]
        if best is None or (total, -order) > (best[0], -best[3]):
            parts = {name: extend([t[key][1][name] for t in seen]) for name in CATEGORIES}
            if None in parts.values():
                return None
            best = (total, _key_moment(key, n_layers), parts, order)
    return None if best is None else best[:3]


def _fallback(cfg, recipe, kernel, policy, seq, micro_batch, start, opts) -> Trace:
    full = tracing.trace_step(cfg, recipe, kernel, policy, seq, micro_batch, **opts)
    full.method = "full (probes were not linear)"
    full.seconds = time.perf_counter() - start
    return full
