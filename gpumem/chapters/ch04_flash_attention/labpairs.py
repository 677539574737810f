"""Lab 04: which scores of a call (query row x key x head) a Q K^T product holds, so that exp2 is
counted over DISTINCT visible scores (review r16 #2: the same tile's product, recomputed again and
again and exp2'd each time, met a count that keyed each product by the call that made it).

:class:`Pairs` knows the call's Q and K. For a product the exp2 rule calls a score tile (plain or
c2-scaled Q against plain or c2-scaled K, in either order, ``mm``/``bmm``/``addmm``/``baddbmm``),
it finds each operand row among Q's rows and K's rows (by value: a view, copy, cast, GQA expansion
or c2-scaling of a row is that row) and gives every element of the product the id of its (query
row, key) pair; a pair across batches or across heads that do not share the key head, one the
causal mask hides, or a row that is no row of Q or K, is no score (-1). :meth:`take` credits the
pairs an exp2 reaches that no exp2 reached before, so a tile taken again, or recomputed, counts once.
"""

import torch

_TOL = 1e-4                  # relative: a row cast to fp32, or scaled by c2 and back, is that row


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    return t.detach().reshape(-1, d).to(torch.float64)


def _direction(d: int) -> torch.Tensor:
    """A fixed unit vector of ``d`` elements (float64) that the rows are projected on."""
    v = torch.cos(torch.arange(1, d + 1, dtype=torch.float64) * 0.7548776662466927) + 1.6180339887498949
    return v / v.norm()


def _sorted_projection(ref: torch.Tensor, direction: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ref``'s projections on ``direction``, sorted, and the order (row indices)."""
    return torch.sort(ref @ direction, stable=True)


def _candidates(proj, tol, sorted_proj, order) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row (``proj`` its projection, ``tol`` its distance tolerance), the rows of ``ref``
    whose projection is within ``tol`` of it (a row within ``tol`` of it in distance is, as the
    direction has length 1), as (indices, valid): (rows, most) each, ascending indices first."""
    slack = tol * (1 + 1e-9) + 1e-12 * proj.abs()               # the projections' own rounding
    lo = torch.searchsorted(sorted_proj, proj - slack, side="left")
    hi = torch.searchsorted(sorted_proj, proj + slack, side="right")
    most = int((hi - lo).max()) if proj.numel() else 0
    at = lo[:, None] + torch.arange(most)
    valid = at < hi[:, None]
    cand = order[at.clamp(max=max(0, order.numel() - 1))]
    cand = cand.masked_fill(~valid, order.numel())               # sorts last; masked out below
    cand, _ = cand.sort(-1)                                      # the lowest index wins a tie
    valid = cand < order.numel()
    return cand.clamp(max=max(0, order.numel() - 1)), valid


class Pairs:
    """Scores of one call: ``q`` (b, a, s_q, d), ``k`` (b, kv, n, d); ``hidden`` (s_q, n) the causal
    mask (True: that key is not visible to that query row), or None; ``scale`` the c2 of a scaled
    operand."""

    def __init__(self, q, k, scale: float, hidden=None):
        b, a, s_q, d = q.shape
        kv, n = k.shape[1], k.shape[2]
        self.d, self.scale, self.nk = d, scale, b * kv * n
        self.q, self.k = _rows(q, d), _rows(k, d)
        qi = torch.arange(b * a * s_q)
        ki = torch.arange(b * kv * n)
        q_head = (qi // (a * s_q)) * kv + (qi // s_q % a) // max(1, a // kv)    # (batch, key head) it meets
        k_head = ki // n
        ok = q_head[:, None] == k_head[None, :]
        if hidden is not None:
            ok &= ~hidden.to(torch.bool)[qi % s_q][:, ki % n]
        self.ok = ok.reshape(-1)                          # pair id -> a visible score of the call
        self.seen = torch.zeros_like(self.ok)             # pair id -> an exp2 reached it
        self._dir = _direction(d)                         # the rows' projections, Q's and K's sorted once
        self._sorted = (_sorted_projection(self.q, self._dir), _sorted_projection(self.k, self._dir))

    def _ids(self, x: torch.Tensor, ref: torch.Tensor, scaled: bool) -> torch.Tensor:
        """Index into ``ref`` of each row of ``x`` (..., rows, d), -1 where none matches: the nearest
        row of ``ref`` when it lies within the tolerance (the lowest index on a tie). Only rows whose
        projection on one fixed direction lies within the tolerance can match, so each row is
        measured against those alone (:func:`_candidates`; a ``torch.cdist`` against every row of
        Q or K was a quarter of a whole check)."""
        rows = _rows(x, self.d) / (self.scale if scaled else 1.0)
        if not rows.numel() or not ref.numel():
            return torch.full(x.shape[:-1], -1, dtype=torch.long)
        tol = _TOL * (1.0 + rows.norm(dim=-1))
        cand, valid = _candidates(rows @ self._dir, tol, *self._sorted[ref is self.k])
        if not cand.shape[1]:                         # no row of ref within reach of any row
            return torch.full(x.shape[:-1], -1, dtype=torch.long)
        dist = (ref[cand] - rows[:, None, :]).norm(dim=-1).masked_fill(~valid, float("inf"))
        best, at = dist.min(-1)
        idx = cand.gather(1, at[:, None])[:, 0]
        idx[~(best <= tol)] = -1
        return idx.reshape(x.shape[:-1])

    def product(self, a, b, q_first: bool, a_scaled: bool, b_scaled: bool):
        """Pair ids of ``a @ b`` (2-D or batched 3-D), Q's operand first if ``q_first``."""
        if a.dim() != b.dim() or a.dim() not in (2, 3):
            return None
        bt = b.transpose(-1, -2)                          # (..., n, d): one row per column of b
        if q_first:
            qid, kid = self._ids(a, self.q, a_scaled), self._ids(bt, self.k, b_scaled)
            pid = qid[..., :, None] * self.nk + kid[..., None, :]
            bad = (qid[..., :, None] < 0) | (kid[..., None, :] < 0)
        else:
            kid, qid = self._ids(a, self.k, a_scaled), self._ids(bt, self.q, b_scaled)
            pid = qid[..., None, :] * self.nk + kid[..., :, None]
            bad = (qid[..., None, :] < 0) | (kid[..., :, None] < 0)
        pid = pid.masked_fill(bad, 0)
        return pid.masked_fill(bad | ~self.ok[pid], -1)

    def take(self, pid, most: int) -> int:
        """Credit at most ``most`` visible pairs of ``pid`` no exp2 reached yet; how many."""
        if pid is None or most <= 0:
            return 0
        new = pid.reshape(-1)
        new = new[new >= 0].unique()
        new = new[~self.seen[new]][:most]
        self.seen[new] = True
        return int(new.numel())
