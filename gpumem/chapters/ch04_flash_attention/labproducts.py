"""Lab 04's product rule, for :class:`.labexp2.Exp2Rule`: every tile made from both Q and K that a
product takes (P^T dO, dS K, dS^T Q) must be exp2's output in its PROB form (masked, cast, scaled,
times or plus a tensor made from neither: dS = P (dP - D)), whether the product is a matmul or not.

Review r27 took a decoy exp2 and P from a series to the matmuls; r28 the same with dO made "from Q".
Review r28 left open such a P taken to dV, dK and dQ with no matmul at all:
``(P * dO[..., c:c+1]).sum(-2)``, one column of d at a time (a broadcast multiply, then a sum over
the query axis: the same contraction as P^T dO), and rank-one updates ``P[r, :, None] * dO[r, None, :]`` added row by row.
So a product is: a matmul (:data:`.labops._MM`), a matrix-vector one (``mv``, ``addmv``, ``dot``,
``vdot``, ``addr``), or a multiply (``mul``; review r31: a division ``a / (1 / b)``, ``addcmul``,
``addcdiv``, ``lerp``) of a tile of P's family (:meth:`.labexp2.Exp2Rule.tile`) that is
not exp2's output by a tensor that is no such tile (dO, Q, K; a series' ``t * t`` is P's own
making), when its result is larger than the tile (the tile broadcast along an axis it lacks: an
outer product), or when what the multiply made (the result, its views, copies, joins and anything
made from it) is summed (``sum``, ``nansum``, ``mean``, ``cumsum`` over an axis longer than 1) or
added (``add``, ``sub``: rows added up one by one). Elementwise work on exp2's output is exp2's
output (PROB), so the honest algorithm's ``P * (dP - D)``, a mask, a row-wise scale, and products
written as broadcast sums of exp2's P, pass.
"""

from types import MappingProxyType

import torch

from .labops import _ADD, PROB, QK, _MM, _SAME, _flat, _ptr

_MATS = frozenset({"mv", "dot", "vdot", "addmv", "addr",           # matrix-vector products, beside _MM,
                   "addmm_", "baddbmm_", "addbmm_", "addmv_", "addr_"})   # and the in-place ones (review r31)
_ADDED = frozenset({"addmm", "baddbmm", "addbmm", "addmv", "addr", "addmm_", "baddbmm_", "addbmm_", "addmv_", "addr_"})
_SUMS = frozenset({"sum", "nansum", "mean", "cumsum", "cumsum_"})   # a sum of a multiply: a product
# multiplies, and where their factors are (review r31: a / (1 / b), addcmul and lerp are multiplies too)
_MULS = MappingProxyType({**dict.fromkeys(("mul", "mul_", "div", "div_", "true_divide", "true_divide_"), slice(0, 2)),
                         **dict.fromkeys(("addcmul", "addcmul_", "addcdiv", "addcdiv_"), slice(1, 3)),
                         **dict.fromkeys(("lerp", "lerp_"), slice(0, 3))})   # read-only
SUMMED = " written as a broadcast multiply and a sum (no matmul)"
OUTER = " written as a broadcast multiply, an outer product (no matmul)"


def _reduces(args, kwargs) -> bool:
    """A sum over an axis longer than 1 (every axis when none is named)."""
    x = args[0]
    dims = args[1] if len(args) > 1 else (kwargs or {}).get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if not dims:
        return any(s > 1 for s in x.shape)
    return any(isinstance(i, int) and -x.dim() <= i < max(x.dim(), 1) and x.dim() and x.shape[i] > 1 for i in dims)


class Products:
    """The products of one call; ``rule``: its :class:`.labexp2.Exp2Rule` (tags, P's family, marks)."""

    def __init__(self, rule):
        self.rule = rule
        self.made: dict[int, str] = {}     # storage of a multiply that a sum makes a product -> the tile

    def _bad(self, t, family: bool) -> bool:
        """``t`` is made from both Q and K and is not exp2's output (``family``: and a tile of P's family)."""
        bits, form = self.rule._tag(t)
        return bits == QK and form != PROB and (not family or _ptr(t) in self.rule.tiles)

    def note(self, op: str, args, kwargs, out) -> None:
        """Mark (``unused``) a product of ``op`` that took a tile made from Q and K other than exp2's
        output; remember the storages whose sum would be one. Before the op's own tags are written."""
        ts = [t for t in _flat(args) if isinstance(t, torch.Tensor) and t.numel()]
        outs = [t for t in _flat([out]) if isinstance(t, torch.Tensor) and t.numel()]
        keep = next((self.made[_ptr(t)] for t in ts if _ptr(t) in self.made), None)   # made from such a multiply
        why = ""
        if op in _MM or op in _MATS:
            pair = args[1:3] if op in _ADDED else args[:2]
            why = next((f"a tile of shape {tuple(t.shape)}" for t in pair if self._bad(t, False)), "")
        elif keep is not None and ((op in _SUMS and _reduces(args, kwargs)) or op in _ADD):
            why = keep + "|" + SUMMED                # summed over an axis, or added up piece by piece
        elif op in _MULS and sum(isinstance(t, torch.Tensor) for t in args[_MULS[op]]) >= 2:
            pair = [t for t in args[_MULS[op]] if isinstance(t, torch.Tensor)]
            tile = next((t for t in pair if self._bad(t, True)), None)
            others = [t for t in pair if t is not tile]               # dO, Q or K: no tile (a series' t * t is)
            if tile is not None and all(_ptr(o) not in self.rule.tiles for o in others):
                keep = f"a tile of shape {tuple(tile.shape)}"
                if any(t.numel() > tile.numel() for t in outs):
                    why = keep + "|" + OUTER
        shared = {_ptr(t) for t in ts}
        for t in outs:
            if keep is not None:
                self.made[_ptr(t)] = keep
            elif op not in _SAME or _ptr(t) not in shared:      # a view keeps its storage's standing
                self.made.pop(_ptr(t), None)
        if why:
            self.rule.mark("unused", why)
