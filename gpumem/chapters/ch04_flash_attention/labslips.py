"""Lab 04's hints for slips in the backward that leave only a wrong number to see (review r22).

The kernel rebuilds P in base 2: exp2(S * scale * log2 e - lse * log2 e). A logsumexp left in base
e (times 1 instead of log2 e), converted twice or divided instead of multiplied gives
P' = exp(S - alpha * lse) with alpha = ln 2, log2 e or (ln 2)^2: every gradient then matches the
reference rebuilt with that alpha (:func:`gpumem.chapters.ch04_flash_attention.labref.key_block`'s
``lse_scale``), which :func:`lse_base` tries once a case has failed. ``ORDER``: the gradients are
compared dv first, since dV = P^T dO depends on P alone; a wrong dv points at P, a right dv with a
wrong dk or dq at dS. Expected values, as everywhere in this lab, are made after the call. A hint names the slip, not
its fix: cell 2 asks what the lse must become (review r28).
"""

import math

import torch

from . import labref

ORDER = (2, 1, 0)                 # dv, dk, dq: the one that depends on P alone first
LN2 = math.log(2)
SLIPS = ((LN2, "your exponent and your lse are in different bases"),
         (1 / LN2, "the lse was taken to base 2 twice (log2 e once too often)"),
         (LN2 * LN2, "the lse was divided by log2 e where it should be multiplied"))


def first_wrong(names, got, want) -> str:
    """'' or the first element out of tolerance, trying the gradients in :data:`ORDER`, with what
    the wrong numbers share (:func:`pattern`)."""
    for i in ORDER:
        bad = labref.first_wrong(names[i], got[i], want[i])
        if bad:
            return bad + pattern(names, got, want, i)
    return ""


def pattern(names, got, want, i: int) -> str:
    """What a wrong gradient's numbers share, in words that point at the slip without naming the
    fix (review r32 #4): one ratio got / expected on every element (a scale left out, or put in
    twice: which factor it is, the learner works out, review r34 #3), or, with grouped KV heads, dQ
    right for some query heads only (each query head paired with the wrong KV head)."""
    g, w = got[i].detach().double(), want[i].double()
    live = w.abs() > 1e-12
    words = ""
    if g.shape == w.shape and bool(live.any()) and bool(torch.isfinite(g).all()):
        ratios = g[live] / w[live]
        r = float(ratios.median())
        if abs(r - 1) > 1e-3 and bool(((ratios - r).abs() <= 1e-6 * abs(r)).all()):
            words = f"; got / expected is {r:.6g} on every element"      # r34 #3: which factor, the learner's
    dq, dk = got[0], got[1]
    if dq.dim() == 4 and dk.dim() == 4 and dk.shape[1] < dq.shape[1] and dq.shape == want[0].shape:
        right = [h for h in range(dq.shape[1]) if not labref.first_wrong(names[0], dq[:, h], want[0][:, h])]
        if 0 < len(right) < dq.shape[1]:
            words += (f"; {names[0]} is right for query head{'s' if len(right) > 1 else ''} "
                      f"{', '.join(map(str, right))} only, of {dq.shape[1]}: which key and value head "
                      f"does each query head use?")
    return words


def lse_base(names, got, q, k, v, dout, mask, j0: int, j1: int) -> str:
    """'' or which base slip every returned gradient of keys ``j0:j1`` matches, with '. ' after it."""
    for alpha, why in SLIPS:
        slipped = labref.key_block(q, k, v, dout, mask, j0, j1, lse_scale=alpha)
        if not first_wrong(names, got, slipped):
            return f"these are the gradients of P = exp(S - {alpha:.4f} lse), not exp(S - lse): {why}. "
    return ""
