"""Lab 04's references, computed the plain way in fp64: the whole score matrix, ``torch.softmax``
and autograd (no SDPA, no tiles), so that they share no code with what they grade; and the
comparison that names the first element out of tolerance.

Masks are boolean (s_q, s_k), True where a query may NOT see a key. A row that sees no key at all
has output 0 and logsumexp -inf (the logsumexp of an empty set): the lab's convention for empty
shards and fully masked rows.
"""

import math

import torch

from gpumem.course.grading import kind

ATOL = RTOL = 1e-9


def causal_mask(s_q: int, s_k: int, q0: int = 0, k0: int = 0) -> torch.Tensor:
    """Query at position q0 + i may not see key k0 + j when k0 + j > q0 + i (top-left aligned)."""
    return (torch.arange(k0, k0 + s_k)[None, :] > torch.arange(q0, q0 + s_q)[:, None])


def _expand(k, heads):
    return k.repeat_interleave(heads // k.shape[1], 1)


def dense(q, k, v, mask=None):
    """(out, lse) of attention, differentiable: out (b, a, s_q, d), lse (b, a, s_q)."""
    s = q @ _expand(k, q.shape[1]).transpose(-1, -2) * q.shape[-1] ** -0.5
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    empty = torch.isinf(lse)[..., None]
    p = torch.where(empty, 0.0, torch.exp(s - lse.masked_fill(empty[..., 0], 0.0)[..., None]))
    return p @ _expand(v, q.shape[1]), lse


def grads(q, k, v, dout, mask=None):
    """(out, lse, dq, dk, dv): the forward, then autograd of the plain computation."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = dense(q, k, v, mask)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out.detach(), lse.detach(), dq, dk, dv


def _block(q, k, v, dout, mask, lse, delta, j0: int, j1: int, lse_scale: float = 1.0):
    """(dq_part, dk_blk, dv_blk) of keys j0..j1-1 in fp64, given the row vectors lse and D:
    P = exp(S - lse_scale * lse), dS = P (dP - D); dq_part = c dS_j K_j, dk = c dS_j^T Q, dv = P_j^T dO,
    the g query heads of a key/value head summed."""
    a, c, kv = q.shape[1], q.shape[-1] ** -0.5, k.shape[1]
    q, k, v, dout, lse, delta = (t.double() for t in (q, k, v, dout, lse, delta))
    kj, vj = _expand(k, a)[:, :, j0:j1], _expand(v, a)[:, :, j0:j1]
    s = q @ kj.transpose(-1, -2) * c
    if mask is not None:
        s = s.masked_fill(mask[:, j0:j1], float("-inf"))
    p = torch.exp(s - lse_scale * lse[..., None])
    ds = p * (dout @ vj.transpose(-1, -2) - delta[..., None])
    fold = lambda t: t.reshape(t.shape[0], kv, a // kv, *t.shape[2:]).sum(2)   # sum the group
    return c * ds @ kj, fold(c * ds.transpose(-1, -2) @ q), fold(p.transpose(-1, -2) @ dout)


def key_block(q, k, v, dout, mask, j0: int, j1: int, lse_scale: float = 1.0):
    """(dq_part, dk_blk, dv_blk) for keys j0..j1-1 from the softmax backward written out, with
    lse and D = rowsum(dO O) of the plain forward; ``lse_scale`` != 1: the probabilities a kernel
    rebuilds from the lse scaled by it (the lse in the wrong base), D still the true one."""
    with torch.no_grad():
        out, lse = dense(q, k, v, mask)
        return _block(q, k, v, dout, mask, lse, (dout * out).sum(-1), j0, j1, lse_scale)


def kernel_grads(q, k, v, dout, out, lse, mask=None):
    """(dq, dk, dv) in fp64 from exactly what a bf16 kernel is given: bf16 ``q, k, v, dout, out``
    and an fp32 ``lse`` (D made from the bf16 out): what a kernel computing in fp32 approaches, so
    that its dQ, cast once, is this rounded to bf16 (review r22: FA-2 keeps dQ's sum in fp32)."""
    with torch.no_grad():
        delta = (dout.double() * out.double()).sum(-1)
        return _block(q, k, v, dout, mask, lse, delta, 0, k.shape[2])


# what a nan where a number is expected most likely means, by the merge case's kind (review r31 #2: an
# unshifted exp(lse) overflows on the "large" case, whose rows all see keys; the -inf wording sent the
# learner after empty rows there)
_NANS = {
    "": "a row that sees no key has an lse of -inf, and -inf - (-inf) is nan: guard such rows",
    "rows with no key": "a row that sees no key has an lse of -inf, and -inf - (-inf) is nan: guard such rows",
    "causal": "a row that sees no key of a shard has an lse of -inf there, and -inf - (-inf) is nan: "
              "guard such rows",
    "large": "every row here sees keys, but its lse is near 1,000; exp of it is inf in fp64, and inf / inf "
             "is nan. What does your merge exponentiate?",
    "plain": "every row here sees keys: which step of your merge makes 0 / 0, inf / inf or -inf - (-inf)?",
}


def first_wrong(name: str, got, want, kind: str = "") -> str:
    """'' when every element is within ATOL + RTOL |want| (a -inf expected must be -inf), else the
    FIRST element out of tolerance in row-major order, with how many are. ``kind``: the merge case's
    (labcases.MERGE), which words the hint for a nan."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"{name}: expected a tensor of shape {tuple(want.shape)}, got " + (
            f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else kind(got))
    if got.device != want.device:
        return f"{name}: expected a tensor on {want.device} (where the inputs are), got one on {got.device}"
    got_d = got.detach().double()
    inf = torch.isinf(want)
    ok = torch.where(inf, got_d == want, (got_d - want).abs() <= ATOL + RTOL * want.abs())
    if bool(ok.all()):
        return ""
    bad = (~ok).flatten().nonzero()
    idx = tuple(int(i) for i in torch.unravel_index(bad[0, 0], ok.shape))
    more = f" (first of {len(bad):,} wrong elements)" if len(bad) > 1 else ""
    g, w = got_d[idx].item(), want[idx].item()
    nan = (f" (nan: {_NANS.get(kind, _NANS[''])})"
           if math.isnan(g) and math.isfinite(w) else "")          # review r22: the likeliest merge slip
    return f"{name}{list(idx)}: got {g:.10g}, expected {w:.10g}{nan}{more}"
