"""Review r23's honest lab 04 kernels written with torch.einsum, one head at a time (a test input)."""
import math

import torch


def key_block_backward(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    g = a // kv
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(d)
    c = scale * 1.4426950408889634
    dqs = []
    dks = [torch.zeros(b, n, d, dtype=ct, device=q.device) for _ in range(kv)]
    dvs = [torch.zeros(b, n, d, dtype=ct, device=q.device) for _ in range(kv)]
    first = min((j0 // block) * block, s_q) if causal else 0
    for h in range(a):
        t = h // g
        kh, vh = k_blk[:, t].to(ct), v_blk[:, t].to(ct)
        rows = [torch.zeros(b, first, d, dtype=ct, device=q.device)]
        for i0 in range(first, s_q, block):
            i1 = min(i0 + block, s_q)
            qh, doh = q[:, h, i0:i1].to(ct), dout[:, h, i0:i1].to(ct)
            x = torch.einsum("bid,bjd->bij", qh, kh) * c - lse[:, h, i0:i1, None].to(ct) * 1.4426950408889634
            if causal:
                x = x.masked_fill(torch.arange(j0, j0 + n, device=q.device)[None] > torch.arange(i0, i1, device=q.device)[:, None], -math.inf)
            p = torch.exp2(x)
            dvs[t] = dvs[t] + torch.einsum("bij,bid->bjd", p, doh)
            ds = p * (torch.einsum("bid,bjd->bij", doh, vh) - delta[:, h, i0:i1, None].to(ct)) * scale
            rows.append(torch.einsum("bij,bjd->bid", ds, kh))
            dks[t] = dks[t] + torch.einsum("bij,bid->bjd", ds, qh)
        dqs.append(torch.cat(rows, 1))
    return torch.stack(dqs, 1), torch.stack(dks, 1).to(k_blk.dtype), torch.stack(dvs, 1).to(v_blk.dtype)

def flash_backward(dout, q, k, v, out, lse, causal=False, block=32):
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    delta = (dout.to(ct) * out.to(ct)).sum(-1)
    s_k = k.shape[2]
    dq = torch.zeros(q.shape, dtype=ct, device=q.device)
    dks, dvs = [], []
    for j0 in range(0, s_k, block):
        dqp, dkb, dvb = key_block_backward(q, k[:, :, j0:j0 + block], v[:, :, j0:j0 + block], dout, lse, delta, j0, causal, block)
        dq += dqp
        dks.append(dkb)
        dvs.append(dvb)
    if not dks:
        return dq.to(q.dtype), torch.zeros_like(k), torch.zeros_like(v)
    return dq.to(q.dtype), torch.cat(dks, 2), torch.cat(dvs, 2)
