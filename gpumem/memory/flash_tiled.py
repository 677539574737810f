"""FlashAttention's algorithm written in PyTorch: tiles, online softmax, recompute in backward.

Attention ``softmax(q k^T * scale) v`` is computed one (query block, key block) tile at a time.
For each query block the forward keeps a running row maximum ``m``, a running sum of
exponentials ``l`` and an unnormalised output ``acc``; when a new key block raises the maximum,
what was accumulated so far is rescaled by ``exp(m_old - m_new)`` (the *online softmax*,
Milakov & Gimelshein 2018, arXiv:1805.02867; Dao et al. 2022, arXiv:2205.14135). Nothing of size
s x s ever exists: only one tile of scores at a time.

The forward saves the output and one number per query row, ``lse = m + log(l)`` (the
logsumexp); the backward rebuilds every tile's probabilities exactly as ``exp(s - lse)`` and
uses ``D = rowsum(dO * O)`` (equal to rowsum(P * dP); FlashAttention-1, arXiv:2205.14135,
Appendix B.2, ``D_i = dO_i^T O_i``) for the softmax's backward, computed before the loops as
FlashAttention-2 does (arXiv:2307.08691). :class:`TiledAttention` is that pair as a
``torch.autograd.Function``: it saves q, k, v, the output and the logsumexp, nothing else.

Loop order: the forward has query blocks outside and key blocks inside, as FlashAttention-2's
forward. The backward here keeps the same query-outer order for simplicity, accumulating dK and
dV across query blocks; FlashAttention-2's backward (its Algorithm 2) puts key/value blocks
outside and query blocks inside, accumulating dQ (atomically, in fp32) instead.

Shapes: q (b, a, s_q, d); k, v (b, kv, s_k, d) with kv dividing a (grouped-query attention,
g = a // kv: key/value head j is shared by query heads j*g .. j*g + g - 1; K and V are never
copied to all heads). ``causal`` masks key j for query i when j > i (top-left aligned, as
PyTorch's ``is_causal``; flash_attn >= 2.1 aligns bottom-right when s_q != s_k, which PyTorch
spells ``torch.nn.attention.bias.causal_lower_right``). Sequence lengths need not be multiples
of the block. Arithmetic is fp32 inside (fp64 for fp64 inputs); the output and gradients come
back in the inputs' dtype.
"""

import math

import torch

BLOCK = 128


def _grouped(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q (b, a, s, d) viewed as (b, kv, g, s, d): the g query heads of each key/value head."""
    b, a, s, d = q.shape
    kv = k.shape[1]
    if a % kv:
        raise ValueError(f"query heads ({a}) must be a multiple of key/value heads ({kv})")
    return q.reshape(b, kv, a // kv, s, d)


def _acc(t: torch.Tensor) -> torch.dtype:
    """The dtype arithmetic runs in: fp32 for bf16, fp16 and fp32 inputs, fp64 for fp64."""
    return torch.promote_types(t.dtype, torch.float32)


def _tile_scores(q_blk, k_blk, scale, causal, i0, j0):
    """Scores of one tile in the accumulation dtype: (b, kv, g, Bq, d) x (b, kv, Bk, d) ->
    (b, kv, g, Bq, Bk), with keys after their query set to -inf when causal."""
    acc = _acc(q_blk)
    s = (q_blk.to(acc) @ k_blk.to(acc)[:, :, None].transpose(-1, -2)) * scale   # (b, kv, g, Bq, Bk)
    if causal:
        rows = torch.arange(i0, i0 + s.shape[-2], device=s.device)[:, None]
        cols = torch.arange(j0, j0 + s.shape[-1], device=s.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    return s


def _key_blocks(i0: int, i1: int, s_k: int, block: int, causal: bool):
    """Start and end of every key block that query rows i0..i1-1 can see."""
    last = min(s_k, i1) if causal else s_k
    return [(j0, min(j0 + block, s_k)) for j0 in range(0, last, block)]


def tiled_forward(q, k, v, causal: bool = False, block: int = BLOCK, scale: float | None = None,
                  block_q: int | None = BLOCK):
    """Output (b, a, s_q, d) in q's dtype and logsumexp (b, a, s_q) in fp32 (fp64 for fp64), one
    tile of ``block_q`` query rows (None: all) by ``block`` keys at a time."""
    b, a, s_q, d = q.shape
    bq = block_q or s_q
    s_k = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qg = _grouped(q, k)                                              # (b, kv, g, s_q, d)
    out = torch.empty(qg.shape, dtype=q.dtype, device=q.device)      # (b, kv, g, s_q, d)
    lse = torch.empty(qg.shape[:-1], dtype=_acc(q), device=q.device)        # (b, kv, g, s_q)
    for i0 in range(0, s_q, bq):
        i1 = min(i0 + bq, s_q)
        q_blk = qg[..., i0:i1, :]                                    # (b, kv, g, Bq, d)
        m = torch.full(q_blk.shape[:-1] + (1,), float("-inf"), dtype=_acc(q), device=q.device)  # running max
        l = torch.zeros_like(m)                                      # running sum of exp
        acc = torch.zeros(q_blk.shape, dtype=_acc(q), device=q.device)         # unnormalised output
        for j0, j1 in _key_blocks(i0, i1, s_k, block, causal):
            s = _tile_scores(q_blk, k[:, :, j0:j1], scale, causal, i0, j0)     # (b, kv, g, Bq, Bk)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # a row with nothing seen yet
            p = torch.exp(s - m_safe)                                # (b, kv, g, Bq, Bk)
            correction = torch.exp(m - m_safe)                       # rescales what came before
            l = l * correction + p.sum(-1, keepdim=True)
            acc = acc * correction + p @ v[:, :, None, j0:j1].to(p.dtype)  # (b, kv, g, Bq, d)
            m = m_new
        out[..., i0:i1, :] = (acc / l).to(q.dtype)
        lse[..., i0:i1] = (m + torch.log(l)).squeeze(-1)
    return out.reshape(b, a, s_q, d), lse.reshape(b, a, s_q)


def tiled_backward(dout, q, k, v, out, lse, causal: bool = False, block: int = BLOCK,
                   scale: float | None = None, block_q: int | None = BLOCK):
    """dq, dk, dv from the output's gradient, recomputing each tile's probabilities from lse."""
    b, a, s_q, d = q.shape
    bq = block_q or s_q
    s_k = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qg, dog = _grouped(q, k), _grouped(dout, k)                      # (b, kv, g, s_q, d)
    lse_g = lse.reshape(qg.shape[:-1] + (1,))                        # (b, kv, g, s_q, 1)
    acc = _acc(q)
    delta = (dog.to(acc) * _grouped(out, k).to(acc)).sum(-1, keepdim=True)   # D = rowsum(dO * O)
    dq = torch.zeros(qg.shape, dtype=acc, device=q.device)           # (b, kv, g, s_q, d)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)            # (b, kv, s_k, d)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    for i0 in range(0, s_q, bq):
        i1 = min(i0 + bq, s_q)
        q_blk, do_blk = qg[..., i0:i1, :], dog[..., i0:i1, :].to(acc)  # (b, kv, g, Bq, d)
        for j0, j1 in _key_blocks(i0, i1, s_k, block, causal):
            k_blk, v_blk = k[:, :, j0:j1], v[:, :, None, j0:j1].to(acc)
            p = torch.exp(_tile_scores(q_blk, k_blk, scale, causal, i0, j0) - lse_g[..., i0:i1, :])
            dv[:, :, j0:j1] += (p.transpose(-1, -2) @ do_blk).sum(2)  # sum over the group
            dp = do_blk @ v_blk.transpose(-1, -2)                    # (b, kv, g, Bq, Bk)
            ds = p * (dp - delta[..., i0:i1, :]) * scale             # softmax backward, scaled
            dq[..., i0:i1, :] += ds @ k_blk.to(acc)[:, :, None]
            dk[:, :, j0:j1] += (ds.transpose(-1, -2) @ q_blk.to(acc)).sum(2)
    return dq.reshape(b, a, s_q, d).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class TiledAttention(torch.autograd.Function):
    """Tiled attention whose backward recomputes the tiles: saves q, k, v, out and lse only."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool = False, block: int = BLOCK, scale: float | None = None,
                block_q: int | None = BLOCK):
        out, lse = tiled_forward(q, k, v, causal, block, scale, block_q)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block, ctx.scale, ctx.block_q = causal, block, scale, block_q
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = tiled_backward(dout.contiguous(), q, k, v, out, lse, ctx.causal, ctx.block,
                                    ctx.scale, ctx.block_q)
        return dq, dk, dv, None, None, None, None


def tiled_attention(q, k, v, causal: bool = False, block: int = BLOCK, scale: float | None = None,
                    block_q: int | None = BLOCK):
    """Attention of q (b, a, s_q, d) over k, v (b, kv, s_k, d), differentiable, O(s) memory.

    Tiles are ``block_q`` query rows (None: all of them) by ``block`` keys: the working set is
    one tile, constant in s for a fixed ``block_q``, s x ``block`` when the rows are not split."""
    if block <= 0 or (block_q is not None and block_q <= 0):
        raise ValueError(f"blocks must be positive numbers of rows, got {block} and {block_q}")
    return TiledAttention.apply(q, k, v, causal, block, scale, block_q)
