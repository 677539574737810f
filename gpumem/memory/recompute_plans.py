"""Checkpoint plans for any depth: which layers re-run in backward, as data (torch-free).

A plan names the segments whose inputs are the only tensors kept for backward (each segment is
re-run in backward), and two finer kinds of recomputation inside a layer:

* ``none``: nothing recomputed.
* ``full``: every layer its own segment (Megatron ``--recompute-granularity full
  --recompute-method uniform --recompute-num-layers 1``, HF ``gradient_checkpointing_enable()``).
* ``every-K`` (K >= 2): segments of K consecutive layers (``every-2`` is the tracer's policy).
* ``every-other``: layers 0, 2, 4, ... checkpointed alone, the others kept (torchtitan
  ``selective_ac_option="2"``).
* ``sqrt``: Chen et al.'s segments of about sqrt(n) layers (arXiv:1604.06174).
* ``selective``: Megatron's selective recomputation: only attention's core (the scores, softmax
  and their product with V) is re-run; q, k and v are kept.
* ``sac``: PyTorch's selective activation checkpointing on every layer, with a policy that keeps
  every matmul's output (and the attention kernel's) and re-runs the pointwise ops.

``gpumem.memory.recompute`` runs a plan on the course's Llama; ``recompute_cost`` counts its
bytes and FLOPs from the formulas.
"""

import math
import re
from dataclasses import dataclass

from ..errors import UsageError

NAMED = ("none", "full", "every-2", "every-other", "sqrt", "selective", "sac")
_EVERY = re.compile(r"^every-(\d+)$")


@dataclass(frozen=True)
class Plan:
    """Segments re-run whole in backward, and whether attention's core or pointwise ops are re-run."""
    name: str
    n_layers: int
    segments: tuple[tuple[int, ...], ...] = ()
    core: bool = False     # Megatron selective: the attention core of every layer is re-run
    sac: bool = False      # PyTorch SAC on every layer: matmul outputs kept, pointwise ops re-run

    def checkpointed(self) -> set[int]:
        """Layers inside some segment (their forward runs twice)."""
        return {i for seg in self.segments for i in seg}

    def kept(self) -> list[int]:
        """Layers that keep what they save (run once)."""
        return [i for i in range(self.n_layers) if i not in self.checkpointed()]

    def describe(self) -> str:
        """The plan in words, for tables and diagrams."""
        if self.core:
            return "every layer keeps q, k, v; attention's core re-runs in backward"
        if self.sac:
            return "every layer keeps its matmul outputs; pointwise ops re-run in backward"
        if not self.segments:
            return "every layer keeps what it saves"
        lengths = sorted({len(s) for s in self.segments})
        kept = len(self.kept())
        return (f"{len(self.segments)} segment(s) of {'/'.join(map(str, lengths))} layer(s)"
                + (f", {kept} layer(s) not checkpointed" if kept else ""))


def sqrt_length(n_layers: int) -> int:
    """Chen et al.'s segment length for ``n_layers`` equal layers: sqrt(n), rounded."""
    return max(1, round(math.sqrt(n_layers)))


def segments_of(k: int, n_layers: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive segments of ``k`` layers (the last may be shorter)."""
    return tuple(tuple(range(i, min(i + k, n_layers))) for i in range(0, n_layers, k))


def accepted() -> str:
    """The plan names a user may give, in one phrase."""
    return ", ".join(NAMED) + ", every-K (K >= 2)"


def plan(name: str, n_layers: int) -> Plan:
    """The :class:`Plan` called ``name`` for a model of ``n_layers`` layers; UsageError otherwise."""
    every = _EVERY.match(name) if isinstance(name, str) else None
    if name not in NAMED and not (every and int(every.group(1)) >= 2):
        raise UsageError(f"unknown checkpoint plan {name!r}; accepted: {accepted()}")
    if name == "none":
        return Plan(name, n_layers)
    if name == "selective":
        return Plan(name, n_layers, core=True)
    if name == "sac":
        return Plan(name, n_layers, segments_of(1, n_layers), sac=True)
    if name == "full":
        return Plan(name, n_layers, segments_of(1, n_layers))
    if name == "every-other":
        return Plan(name, n_layers, tuple((i,) for i in range(0, n_layers, 2)))
    if name == "sqrt":
        return Plan(name, n_layers, segments_of(sqrt_length(n_layers), n_layers))
    return Plan(name, n_layers, segments_of(int(every.group(1)), n_layers))


def from_segments(segments, n_layers: int, name: str = "custom") -> Plan:
    """A plan from a list of segments (lists of consecutive layer indices, each layer in at most
    one); UsageError naming the first bad segment otherwise."""
    seen: set[int] = set()
    out = []
    for seg in segments:
        seg = tuple(seg)
        if not seg or any(not isinstance(i, int) or isinstance(i, bool) for i in seg):
            raise UsageError(f"segment {list(seg)!r}: give a non-empty list of layer indices")
        if any(i < 0 or i >= n_layers for i in seg) or list(seg) != list(range(seg[0], seg[0] + len(seg))):
            raise UsageError(f"segment {list(seg)!r}: layers must be consecutive, from 0 to {n_layers - 1}")
        if seen & set(seg):
            raise UsageError(f"segment {list(seg)!r}: layer {min(seen & set(seg))} is in two segments")
        seen |= set(seg)
        out.append(seg)
    return Plan(name, n_layers, tuple(sorted(out)))


def first_layers(count: int, n_layers: int) -> Plan:
    """Checkpoint the first ``count`` layers, each alone; keep the rest (cheapest placement of
    ``count`` re-runs: a re-run happens when only the layers before it hold activations)."""
    return Plan(f"first-{count}", n_layers, segments_of(1, n_layers)[:count])
