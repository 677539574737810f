"""Lab 04's provenance rule, a base of :class:`.labexp2.Exp2Rule` (review r31 #1).

The product rule (:mod:`.labproducts`) names ops, and a product written with none of them passed
(``((P + y)^2 - (P - y)^2) / 4``, ``prod`` of a stack, an add in log space). So: one product of
exp2's output with tensors made from Q or from K (not both) is *grad*; adds, sums, joins, partial writes
into a buffer of zeros and products with tensors made from neither keep it (:meth:`Provenance._grad`).
Every other tensor made from both Q and K and in no form poisons what it reaches, and what the call
returns must be grad (:meth:`Provenance.unmade`). A write through ``out=`` is a write; index_select by an
index made from Q or K, and ``where`` on a condition that is no mask of the tile or of P (*cond*), keep
no form (:class:`.labexp2.Exp2Rule`).
"""

import torch

from .labops import COND, FOLDED, GRAD, PROB, QK, RAW, READY, _DIVIDES, _FACTORS, _LINEAR, _flat


class Provenance:
    """The forms GRAD and COND, masks, and the check of what a call returns (needs ``self._tag``)."""

    def _compared(self, every) -> str | None:
        """COND for a comparison of a score tile, P or a mask with numbers or tensors made from neither
        Q nor K (``s == -inf``, ``p.isnan()``), else None (review r31 #1: a mask of numbers made by
        another road may not choose a tile's numbers)."""
        tags = [self._tag(t) for t in every]
        ok = any(f in (RAW, FOLDED, READY, PROB, COND) for _, f in tags) and \
            all(f in (RAW, FOLDED, READY, PROB, COND) or b == 0 for b, f in tags)
        return COND if ok else None

    def _grad(self, op, args, every) -> str | None:
        """GRAD or None for an op the other forms leave without one (review r31 #1, the provenance rule).
        GRAD: one product of exp2's output (PROB) with tensors made from Q or from K (not both: dS K,
        dS^T Q, P^T dO), then adds, sums, joins and products with tensors made from neither (a scale).
        A tensor made from both Q and K with no such form (P from a series, a division, ...) poisons
        what it reaches; so does any other op on GRAD (a square, a root, GRAD times GRAD)."""
        tags = [self._tag(t) for t in every]
        if any(b == QK and f not in (PROB, GRAD) for b, f in tags) or not any(f in (PROB, GRAD) for _, f in tags):
            return None
        if op in _LINEAR:
            side = 0
            for b, f in tags:
                side |= 0 if f in (PROB, GRAD) else b
            return GRAD if side != QK else None
        where = _FACTORS.get(op)
        if where is None:
            return None
        factors = [t for t in args[where] if isinstance(t, torch.Tensor)]
        derived = [t for t in factors if self._tag(t)[1] in (PROB, GRAD)]
        if len(derived) != 1 or (op in _DIVIDES and factors[-1] is derived[0] and len(factors) > 1):
            return None                             # P times P, or a division by P: no product of the rule
        side = 0
        for t in factors:
            side |= 0 if t is derived[0] else self._tag(t)[0]
        return GRAD if (side == 0 or (side != QK and self._tag(derived[0])[1] == PROB)) else None

    def unmade(self, names, got) -> str:
        """'' or which returned tensor (dV's first) is made from both Q and K but is not GRAD (nor PROB):
        not made from exp2's output by products and sums alone (review r31 #1)."""
        pairs = sorted(zip(names, got), key=lambda p: p[0][:2] != "dv")
        for name, t in pairs:
            bits, form = self._tag(t)
            if bits == QK and form not in (PROB, GRAD):
                return (f"{name} is made from both Q and K, but not from exp2's output by products and sums "
                        f"alone. Which tile did your kernel make without exp2, and how does it reach {name}?")
        return ""

    def _masked(self, op, args):
        """(bits, form) of a mask or ``where``: a choice by a condition that is no mask of the tile or of P
        keeps no form (review r31)."""
        x, rest = args[0], list(_flat(args[1:]))
        xb, xf = self._tag(x)
        if op == "where":                          # where(cond, a, b): the tile is a or b
            (ab, af), (bb, bf) = self._tag(args[1]), self._tag(args[2])
            xf, other = (af, bb) if af in (RAW, FOLDED, READY, PROB, GRAD) else (bf, ab)
            if xb == QK and xf != COND and self._tag(x)[1] != COND:
                return xb | ab | bb, None           # review r31: a choice made by numbers of another road
            return xb | ab | bb, (xf if other != QK else None)     # the condition's bits too (review r15 #1)
        others = 0
        for t in rest:
            tb, tf = self._tag(t)
            others |= 0 if tf == COND and t.dtype == torch.bool else tb     # a mask of the tile or of P
        return xb | others, (xf if others != QK else None)
