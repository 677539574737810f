"""Lab 04's ``check()``: the learner's online-softmax attention, against PyTorch's SDPA.

The learner writes

* ``online_softmax_attention(q, k, v, causal=False, block=32)`` -> ``(out, lse)``: q (b, a, s_q, d),
  k, v (b, kv, s_k, d) with kv dividing a (GQA); one pass over key blocks per query block with a
  running max and sum; ``lse`` (b, a, s_q) the logsumexp of each row's scaled scores;
* stretch: ``online_softmax_backward(dout, q, k, v, out, lse, causal=False, block=32)`` ->
  ``(dq, dk, dv)``, recomputing each tile's probabilities from ``lse``.

Graded in fp64 on shapes the lab never shows (GQA, lengths that are not multiples of the block,
query and key lengths that differ, causal and not), against ``F.scaled_dot_product_attention``
(and ``torch.logsumexp`` of the scores for ``lse``), tolerance 1e-9 absolute + 1e-9 relative;
the first case that fails names its worst element (index, got, expected). A forward that makes
any tensor with s_q x s_k elements per head, or any s_q x s_k tensor at all (the whole score
matrix, even built one head at a time), fails even when right.
"""

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gpumem.course.grading import Report, Row, call, kind, returned, run_case

LAB = "lab04_online_softmax"
ATOL = RTOL = 1e-9
# (batch, query heads, kv heads, s_q, s_k, head dim, causal, block)
CASES = ((1, 6, 2, 77, 77, 24, True, 16), (2, 4, 4, 50, 93, 8, False, 32),
         (1, 8, 1, 129, 129, 40, True, 32), (1, 3, 3, 40, 65, 16, True, 24))


def _inputs(case, seed):
    b, a, kv, sq, sk, d, causal, block = case
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=g, dtype=torch.float64)
               for shape in ((b, a, sq, d), (b, kv, sk, d), (b, kv, sk, d)))
    return q, k, v, torch.randn(b, a, sq, d, generator=g, dtype=torch.float64)


def _reference(q, k, v, dout, causal):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    rep = q.shape[1] // k.shape[1]
    scores = (q @ k.repeat_interleave(rep, 1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    return out.detach(), torch.logsumexp(scores, -1).detach(), [g.detach() for g in grads]


def _worst(name, got, want) -> str:
    """'' when within tolerance, else the worst element named."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"{name}: expected a tensor of shape {tuple(want.shape)}, got " + (
            f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else kind(got))
    if got.device != want.device:
        return f"{name}: expected a tensor on {want.device} (where q, k, v are), got one on {got.device}"
    err = (got.double() - want).abs() - (ATOL + RTOL * want.abs())
    if not bool((err <= 0).all()) or not bool(torch.isfinite(got).all()):
        err = torch.nan_to_num(err, nan=float("inf"))
        idx = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
        return f"{name}{list(idx)}: got {got[idx].item():.10g}, expected {want[idx].item():.10g}"
    return ""


class _Largest(TorchDispatchMode):
    """Records the most elements any tensor made inside has, per (batch x head) slice, and whether
    any tensor had s_q rows by s_k > block columns (a whole score matrix, even one head at a time)."""

    def __init__(self, heads, s_q: int = 0, s_k: int = 0, block: int = 0):
        super().__init__()
        self.heads, self.most, self.full_rows = heads, 0, False
        self.s_q, self.s_k, self.block = s_q, s_k, block

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel() // self.heads)
                if (t.dim() >= 2 and t.shape[-2] == self.s_q and t.shape[-1] == self.s_k
                        and self.s_k > self.block):
                    self.full_rows = True
        return out


def _describe(case) -> str:
    b, a, kv, sq, sk, d, causal, block = case
    return f"b{b} heads {a}/{kv} s_q {sq} s_k {sk} d {d}{' causal' if causal else ''} block {block}"


def check(ns: dict, show: bool = True) -> Report:
    """Grade ``online_softmax_attention`` (and the stretch ``online_softmax_backward``); never raises."""
    report = Report(LAB)
    fwd, bwd = ns.get("online_softmax_attention"), ns.get("online_softmax_backward")
    for i, case in enumerate(CASES):
        q, k, v, dout = _inputs(case, 100 + i)
        causal, block = case[6], case[7]
        out_ref, lse_ref, grads_ref = _reference(q, k, v, dout, causal)
        name = _describe(case)
        if fwd is None:
            report.rows.append(Row("online_softmax_attention", name, "todo", "define online_softmax_attention"))
        else:
            def forward(q=q, k=k, v=v, case=case, causal=causal, block=block, out_ref=out_ref, lse_ref=lse_ref):
                rec = _Largest(case[0] * case[1], case[3], case[4], block)
                with rec:                             # clones: changing its inputs changes no later case
                    got = call(fwd, q.clone(), k.clone(), v.clone(), causal, block)
                if not (isinstance(got, (tuple, list)) and len(got) == 2):
                    return "wrong", returned(got, "a tuple (out, lse)")
                bad = _worst("out", got[0], out_ref) or _worst("lse", got[1], lse_ref)
                if not bad and (rec.most >= case[3] * case[4] or rec.full_rows):
                    bad = (f"a tensor of {rec.most:,} elements per head was made: the whole "
                           f"{case[3]} x {case[4]} score matrix; work one block of keys at a time")
                return "wrong" if bad else "ok", bad
            run_case(report, "online_softmax_attention", name, forward)
        if bwd is None:
            report.rows.append(Row("online_softmax_backward", name, "todo", "define online_softmax_backward"))
            continue

        def backward(q=q, k=k, v=v, dout=dout, out_ref=out_ref, lse_ref=lse_ref, causal=causal, block=block,
                     grads_ref=grads_ref):
            got = call(bwd, *(t.clone() for t in (dout, q, k, v, out_ref, lse_ref)), causal, block)
            if not (isinstance(got, (tuple, list)) and len(got) == 3):
                return "wrong", returned(got, "a tuple (dq, dk, dv)")
            bad = next((m for m in (_worst(n, g, w) for n, g, w in zip(("dq", "dk", "dv"), got, grads_ref)) if m), "")
            return "wrong" if bad else "ok", bad
        run_case(report, "online_softmax_backward", name, backward)
    if show:
        print(report.summary())
    return report
