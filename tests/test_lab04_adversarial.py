"""Lab 04's grader against the cheapest submissions that skip the mechanism (issue 21).

Each submission below gets the right numbers (the row fails on the rule, not on a value: the
grader compares values first) or is a learner's likely slip; each must fail with a row saying
what was skipped. The solution passes (tests/test_labs.py); so must a blocked implementation that
keeps an index vector as long as the keys. The references are checked against SDPA here, which
the grader itself never calls.
"""

import inspect
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import ROOT
from gpumem import chapters
from gpumem.chapters.ch04_flash_attention import labcases, labcheck, labgpu, labref, labshape
from gpumem.course.grading import Report
from gpumem.memory import flash_tiled
from test_labs import notebook_namespace

_NS: dict = {}
LOG2E = math.log2(math.e)              # kernels the grader must pass take exp2, log2 e folded in


def solution() -> dict:
    if not _NS:
        _NS.update(notebook_namespace(ROOT / "solutions" / "lab04_online_softmax.ipynb"))
    return dict(_NS)


def _flash_row(cheat, cases=(0,)):
    """The first flash_backward row of the solution's flash_backward calling ``cheat`` (:func:`_with_kernel`)."""
    return rows({"flash_backward": _with_kernel(cheat), "key_block_backward": cheat}, "flash_backward", cases)[0]


def rows(ns: dict, function: str, cases=(0,)):
    """The rows of ``function`` on the given cases, graded as check() does (one case by default:
    the whole check is exercised by tests/test_labs.py and the GPU-skip test below)."""
    report = Report(labcheck.LAB)
    table = {"key_block_backward": (labcheck.BACKWARD, labcheck._key_blocks_rows),
             "flash_backward": (labcheck.BACKWARD, labcheck._flash_rows),
             "merge_partials": (labcheck.MERGE, labcheck._merge_rows),
             "ring_attention": (labcheck.RING, labcheck._ring_rows)}
    cases_of, grade = table[function]
    for i in cases:
        extra = {"inner": ns.get("key_block_backward")} if function == "flash_backward" else {}
        grade(report, ns[function], cases_of[i], 100 + i, **extra)
    return report.rows


def _expanded(q, k, v):
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), q.shape[-1] ** -0.5


def _fold(t, kv):
    return t.reshape(t.shape[0], kv, -1, *t.shape[2:]).sum(2)


def _masked(s, causal, i0, j0=0):
    if causal:
        rows_ = torch.arange(i0, i0 + s.shape[-2])[:, None]
        s = s.masked_fill(torch.arange(j0, j0 + s.shape[-1])[None, :] > rows_, -math.inf)
    return s


def _rows_backward(dout, q, k, v, causal, step):
    """The exact backward over groups of ``step`` query rows, each against ALL keys at once."""
    kk, vv, c = _expanded(q, k, v)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(kk), torch.zeros_like(vv)
    for i0 in range(0, q.shape[2], step):
        qb, dob = q[:, :, i0:i0 + step], dout[:, :, i0:i0 + step]
        p = _masked(qb @ kk.transpose(-1, -2) * c, causal, i0).softmax(-1)
        dv += p.transpose(-1, -2) @ dob
        dp = dob @ vv.transpose(-1, -2)
        ds = p * (dp - (p * dp).sum(-1, keepdim=True)) * c
        dq[:, :, i0:i0 + step] = ds @ kk
        dk += ds.transpose(-1, -2) @ qb
    return dq, _fold(dk, k.shape[1]), _fold(dv, k.shape[1])


def softmax_per_query_block(dout, q, k, v, out, lse, causal=False, block=32):
    return _rows_backward(dout, q, k, v, causal, block)


def row_at_a_time(dout, q, k, v, out, lse, causal=False, block=32):
    """Every query row alone against all keys (graded on case 4: 41 rows)."""
    return _rows_backward(dout, q, k, v, causal, 1)


def aten_flash_with_sdpa_autograd(dout, q, k, v, out, lse, causal=False, block=32):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    kk, vv, _ = _expanded(q, k, v)
    o = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kk, vv, 0.0, causal)[0]
    return torch.autograd.grad(o, (q, k, v), dout)


def sdpa_with_gqa(dout, q, k, v, out, lse, causal=False, block=32):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return torch.autograd.grad(o, (q, k, v), dout)


def autograd_of_full_attention(dout, q, k, v, out, lse, causal=False, block=32):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    kk, vv, c = _expanded(q, k, v)
    o = _masked(q @ kk.transpose(-1, -2) * c, causal, 0).softmax(-1) @ vv
    return torch.autograd.grad(o, (q, k, v), dout)


def chapter_query_outer(dout, q, k, v, out, lse, causal=False, block=32):
    return flash_tiled.tiled_backward(dout, q, k, v, out, lse, causal, block, block_q=block)


@pytest.mark.parametrize("cheat, case, says", [
    (softmax_per_query_block, 3, "65 keys side by side, more than one block (24)"),
    (row_at_a_time, 3, "65 keys side by side, more than one block (24)"),
    # After other labs' graders ran in this process (the whole suite), the dispatch layer names
    # the aten op before the Python-level check does: either message refuses SDPA. These three take
    # autograd's backward, and the GQA expansion of a K that requires grad comes first: the autograd
    # rule (review r19) may name it first.
    (aten_flash_with_sdpa_autograd, 0, ("_scaled_dot_product_flash_attention_for_cpu", "it used autograd")),
    (sdpa_with_gqa, 0, ("SDPA is not allowed", "it used autograd")),
    (autograd_of_full_attention, 0, ("the whole 77 x 73 score matrix", "it used autograd")),
], ids=lambda x: getattr(x, "__name__", "")[:24] if callable(x) else "")
def test_backward_that_skips_the_tiles_fails_with_the_reason(cheat, case, says):
    got = rows({"flash_backward": cheat}, "flash_backward", (case,))
    assert got and all(r.status == "wrong" for r in got), [r.detail for r in got]
    says = (says,) if isinstance(says, str) else says
    assert any(s in got[0].detail for s in says), got[0].detail


def test_chapter_query_outer_backward_is_switched_off():
    ns = solution()
    ns["flash_backward"] = chapter_query_outer                      # right numbers, no key-outer loop
    got = rows(ns, "flash_backward")
    assert all(r.status == "error" for r in got), [r.detail for r in got]
    assert "write the key-block loop yourself: flash_tiled.tiled_backward is off" in got[0].detail


def test_key_block_with_all_query_rows_at_once_fails():
    right = solution()["key_block_backward"]

    def whole_column(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        return right(q, k_blk, v_blk, dout, lse, delta, j0, causal, q.shape[2])   # one query block
    got = rows({"key_block_backward": whole_column}, "key_block_backward")
    assert all(r.status == "wrong" for r in got)
    assert "more than 16 query rows against the key block" in got[0].detail, got[0].detail


def test_first_wrong_element_is_named_not_the_worst():
    right = solution()["key_block_backward"]

    def off(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        dq, dk, dv = right(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
        dk = dk.clone()
        dk[0, 1, 2, 3] += 1e-3                                     # first wrong in row-major order
        dk[0, 1, 5, 0] += 1.0                                      # the worst
        return dq, dk, dv
    detail = rows({"key_block_backward": off}, "key_block_backward")[0].detail
    assert detail.startswith("key block 0:16: dk_blk[0, 1, 2, 3]: got ") and "(first of 2 wrong elements)" in detail


def test_blocked_backward_with_a_key_index_vector_passes():
    """A correct blocked backward may keep an index vector as long as the keys (not scores)."""
    ns = solution()
    right = ns["key_block_backward"]

    def with_index(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        torch.arange(j0 + k_blk.shape[2] + 200)                    # longer than any block
        return right(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
    ns["key_block_backward"] = with_index
    got = rows(ns, "key_block_backward", (2,)) + rows(ns, "flash_backward", (2,))
    assert got and all(r.status == "ok" for r in got), [r.detail for r in got]


def merge_by_average(parts):
    return torch.stack([o for o, _ in parts]).mean(0), torch.stack([l for _, l in parts]).amax(0)


def merge_without_the_max(parts):
    w = torch.stack([torch.exp(l) for _, l in parts])               # overflows near lse 1,000
    out = (w[..., None] * torch.stack([o for o, _ in parts])).sum(0) / w.sum(0)[..., None]
    return out, torch.log(w.sum(0))


def merge_by_softmax_of_lse(parts):
    lses = torch.stack([l for _, l in parts])
    w = lses.softmax(0)                                             # NaN where every shard is empty
    return (w[..., None] * torch.stack([o for o, _ in parts])).sum(0), torch.logsumexp(lses, 0)


@pytest.mark.parametrize("merge, case, says", [
    (merge_by_average, 0, "out[0, 0, 0, 0]: got"),
    (merge_without_the_max, 2, "got nan, expected"),
    (merge_by_softmax_of_lse, 3, "out[0, 0, 0, 0]: got nan, expected 0"),
], ids=["average", "no-max", "all-empty-row"])
def test_wrong_merges_are_named(merge, case, says):
    got = rows({"merge_partials": merge}, "merge_partials", (case,))[0]
    assert got.status == "wrong" and says in got.detail, got.detail


def test_the_nan_hint_of_a_merge_fits_the_case():
    """Review r31 #2: the unshifted merge gives inf / inf on the "large" case (lses near 1,000; every
    row sees keys), and its hint blamed rows with no key. The hint now fits the case's kind; the
    empty-row case keeps the -inf wording."""
    got = rows({"merge_partials": merge_without_the_max}, "merge_partials", (2,))[0]
    assert got.status == "wrong" and "got nan" in got.detail, got.detail
    assert "every row here sees keys, but its lse is near 1,000" in got.detail and "-inf - (-inf)" not in got.detail
    assert "exp(" not in got.detail.split("(nan:")[1], got.detail          # no formula, a question
    got = rows({"merge_partials": merge_by_softmax_of_lse}, "merge_partials", (3,))[0]
    assert "got nan" in got.detail and "a row that sees no key has an lse of -inf" in got.detail, got.detail


def ring_by_joining_shards(q, k_shards, v_shards, rank, causal=False, block=32):
    k, v = torch.cat(k_shards, 2), torch.cat(v_shards, 2)          # every key in one tensor
    q0 = sum(s.shape[2] for s in k_shards[:rank])
    if not causal:
        return flash_tiled.tiled_forward(q, k, v, False, block, block_q=block)
    padded = torch.cat([q.new_zeros(*q.shape[:2], q0, q.shape[-1]), q], 2)   # rows at global positions
    out, lse = flash_tiled.tiled_forward(padded, k, v, True, block, block_q=block)
    return out[:, :, q0:], lse[:, :, q0:]


def ring_with_plain_softmax(q, k_shards, v_shards, rank, causal=False, block=32):
    merge, parts, q0 = solution()["merge_partials"], [], sum(s.shape[2] for s in k_shards[:rank])
    for r, (k_r, v_r) in enumerate(zip(k_shards, v_shards)):
        if k_r.shape[2] == 0 or (causal and r > rank):
            continue
        kk, vv, c = _expanded(q, k_r, v_r)
        s = q @ kk.transpose(-1, -2) * c                            # all of the shard's keys at once
        if causal and r == rank:
            s = _masked(s, True, q0, q0)
        parts.append((s.softmax(-1) @ vv, torch.logsumexp(s, -1)))
    return merge(parts)


@pytest.mark.parametrize("ring, says", [
    (ring_by_joining_shards, "the shards were joined, merge partials instead"),
    (ring_with_plain_softmax, "keys side by side, more than one block"),
], ids=["joined", "plain-softmax"])
def test_ring_that_skips_the_merge_or_the_tiles_fails(ring, says):
    solution()                      # read before grading: run alone (-k), the notebook ran inside the ring
    got = rows({"ring_attention": ring}, "ring_attention")
    assert got and all(r.status == "wrong" for r in got), [r.detail for r in got]
    assert says in got[0].detail, got[0].detail


def test_references_agree_with_sdpa_and_the_empty_convention():
    """The grader's plain references against SDPA (which the grader never runs), and the
    convention of an empty shard: lse -inf, out 0."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 30, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 37, 8, generator=g, dtype=torch.float64) for _ in range(2))
    out, lse = labref.dense(q, k, v, labref.causal_mask(30, 37))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    dout = torch.randn(1, 4, 30, 8, generator=g, dtype=torch.float64)
    _, _, dq, dk, dv = labref.grads(q, k, v, dout, labref.causal_mask(30, 37))
    parts = [labref.key_block(q, k, v, dout, labref.causal_mask(30, 37), j0, min(j0 + 16, 37)) for j0 in (0, 16, 32)]
    torch.testing.assert_close(sum(p[0] for p in parts), dq)
    torch.testing.assert_close(torch.cat([p[1] for p in parts], 2), dk)
    torch.testing.assert_close(torch.cat([p[2] for p in parts], 2), dv)
    empty_out, empty_lse = labref.dense(q, k[:, :, :0], v[:, :, :0])
    assert bool((empty_out == 0).all()) and bool((empty_lse == -math.inf).all())
    # the bf16 cases' reference, given exact out and lse, is the exact gradient (SDPA's autograd)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad(F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, enable_gqa=True),
                               (qr, kr, vr), dout)
    for got, w in zip(labref.kernel_grads(q, k, v, dout, out, lse, labref.causal_mask(30, 37)), want):
        torch.testing.assert_close(got, w)


def test_without_cuda_the_gpu_part_says_it_is_skipped(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = chapters.check_lab("lab04_online_softmax", {"merge_partials": solution()["merge_partials"]})
    assert not any(r.function == "measure_on_gpu" for r in report.rows)
    assert "GPU part: skipped: no CUDA device here" in capsys.readouterr().out


def test_unwritten_gpu_part_adds_no_row_even_with_cuda(monkeypatch):
    """The GPU part is optional: with CUDA (faked) and measure_on_gpu still a TODO, no row."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(labgpu, "_inputs", lambda: tuple(torch.zeros(1, 1, 4, 2) for _ in range(5)) + (None,))
    monkeypatch.setattr(labgpu, "_own_peak", lambda *args: (0, 1.0))   # no CUDA to measure with

    def todo(*args):
        raise NotImplementedError
    report = Report(labcheck.LAB)
    line = labgpu.grade(report, {"flash_backward": solution()["flash_backward"], "measure_on_gpu": todo})
    assert report.rows == [] and line.startswith("optional and not written yet")


@pytest.mark.gpu
def test_gpu_flash_backward_against_sdpa_flash(gpu_record):
    """On CUDA: the solution's measure and backward pass the GPU row; numbers are recorded."""
    ns = solution()
    report = Report(labcheck.LAB)
    line = labgpu.grade(report, ns)
    row = report.rows[-1]
    assert row.function == "measure_on_gpu" and row.status == "ok", (row.detail, line)
    r = labgpu.compare(ns["measure_on_gpu"], ns["flash_backward"])
    gpu_record("lab04.flash_backward_peak_bytes_s4096", r["peak"], "B")
    gpu_record("lab04.flash_backward_ms_s4096", r["ms"], "ms")
    gpu_record("lab04.sdpa_flash_backward_peak_bytes_s4096", r["sdpa_peak"], "B")
    gpu_record("lab04.sdpa_flash_backward_ms_s4096", r["sdpa_ms"], "ms")
    assert r["peak"] < labgpu.naive_probability_bytes(16, 4096)


# ---- second review: ways out of the watch, borrowed backwards, the causal skip, the first case ----

def _dense_numpy(dout, q, k, v, causal):
    """The whole backward in NumPy (what the watch cannot see), fp64."""
    import numpy as np
    qn, kn, vn, don = (t.numpy() for t in (q, *_expanded(q, k, v)[:2], dout))
    c = q.shape[-1] ** -0.5
    s = qn @ kn.swapaxes(-1, -2) * c
    if causal:
        s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = don @ vn.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * c
    dq, dk, dv = ds @ kn, ds.swapaxes(-1, -2) @ qn, p.swapaxes(-1, -2) @ don
    return torch.from_numpy(dq), _fold(torch.from_numpy(dk), k.shape[1]), _fold(torch.from_numpy(dv), k.shape[1])


def numpy_backward(dout, q, k, v, out, lse, causal=False, block=32):
    return _dense_numpy(dout, q, k, v, causal)


def numpy_via_array(dout, q, k, v, out, lse, causal=False, block=32):
    import numpy as np
    arrays = [np.asarray(t) for t in (dout, q, k, v)]                # __array__, no .numpy()
    return _dense_numpy(*(torch.tensor(a) for a in arrays), causal)


def numpy_via_lists(dout, q, k, v, out, lse, causal=False, block=32):
    back = [torch.tensor(t.tolist(), dtype=t.dtype) for t in (dout, q, k, v)]   # out and back in
    return autograd_of_full_attention(*back[:1], *back[1:], None, None, causal)


@pytest.mark.parametrize("cheat, says", [
    (numpy_backward, "it took the numbers out of torch ("),
    (numpy_via_array, ("it took the numbers out of torch (", "from Python data (torch.tensor of a list)")),
    (numpy_via_lists, ("it took the numbers out of torch (tolist", "from Python data (torch.tensor of a list)")),
], ids=["numpy", "array", "tolist"])
def test_backward_computed_outside_torch_fails(cheat, says):
    """Which way out is named first (Tensor.numpy, or torch.from_numpy on the way back) depends on
    which guards ran earlier in the process; each names a way out of torch."""
    got = rows({"flash_backward": cheat}, "flash_backward")[0]
    says = (says,) if isinstance(says, str) else says
    assert got.status in ("wrong", "error") and any(s in got.detail for s in says), got.detail


def test_returned_tensor_made_outside_any_op_is_named():
    """Even with every way out missed, a returned tensor no watched op made is caught."""
    from gpumem.chapters.ch04_flash_attention.labguard import Watch
    q = torch.zeros(1, 1, 4, 2, dtype=torch.float64)
    with Watch(4, 4, 2, 2, 1) as w:
        made = q + 1
    stray = torch.zeros(3, dtype=torch.float64)                     # made outside the watch
    assert w.foreign((made,)) == "" and "was not made by any torch op" in w.foreign((made, stray))


def test_numbers_read_as_tensor_split_lengths_are_refused():
    """Review r18 #1: K's numbers read into Python as the lengths of ``tensor_split``'s chunks (ATen
    reads a tensor of indices from memory, with no op the watch sees), to be rebuilt later with no K
    in their history (``ones(n).sum()``). Splitting by a tensor is refused at the call, unit and row.
    Run in a fresh interpreter, as the grading process is one: only the function-level watch can see
    the split, and after some of this file's hostile tests torch's function modes no longer run in
    this process (the full make test run: "DID NOT RAISE")."""
    import subprocess
    code = "import sys\nsys.path.insert(0, 'tests')\nimport test_lab04_adversarial as t\nt._tensor_split_read_out()\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def _tensor_split_read_out():
    from gpumem.chapters.ch04_flash_attention.labguard import Watch
    k = torch.rand(1, 1, 4, 2, dtype=torch.float64)
    with Watch(4, 4, 2, 16, 1, allowed=(k,)) as w:
        codes = (k.flatten() * 1000).long().cumsum(0)
        with pytest.raises(RuntimeError):
            [c.shape[0] for c in torch.arange(9).tensor_split(codes)]
        by_count = torch.arange(9).tensor_split(3)                  # by a number: no tensor read
    assert "tensor_split by a tensor of indices" in w.broken and len(by_count) == 3

    def split_then_solve(dout, q, k, v, out, lse, causal=False, block=32):
        codes = (k[:, :, :block].abs() * 100).long().reshape(-1).cumsum(0)     # one block: no wide tensor
        torch.arange(codes.numel()).tensor_split(codes)
        return solution()["flash_backward"](dout, q, k, v, out, lse, causal, block)
    got = rows({**solution(), "flash_backward": split_then_solve}, "flash_backward")[0]
    assert got.status in ("wrong", "error") and "tensor_split by a tensor of indices" in got.detail, got.detail


def autograd_key_block(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """Review r19's submission: every rule kept (tiles, exp2 with the fold, the causal skip), but dQ,
    dK and dV come from autograd's backward of a surrogate loss, sum(dO * PV) - sum(D * P)."""
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    c2 = (1.0 / math.sqrt(d)) * math.log2(math.e)
    kb, vb = k_blk.to(ct).detach().requires_grad_(), v_blk.to(ct).detach().requires_grad_()
    dq, dk, dv = (torch.zeros(t.shape, dtype=ct) for t in (q, k_blk, v_blk))
    cols = torch.arange(j0, j0 + n)
    with torch.enable_grad():
        for i0 in range((j0 // block) * block if causal else 0, s_q, block):
            i1 = min(s_q, i0 + block)
            qt = q[:, :, i0:i1].to(ct).detach().requires_grad_()
            s2 = qt @ kb.repeat_interleave(a // kv, 1).transpose(-1, -2) * c2
            if causal:
                s2 = s2.masked_fill(cols[None, :] > torch.arange(i0, i1)[:, None], float("-inf"))
            p = torch.exp2(s2 - lse[:, :, i0:i1, None].to(ct) * math.log2(math.e))
            loss = (dout[:, :, i0:i1].to(ct) * (p @ vb.repeat_interleave(a // kv, 1))).sum() \
                - (delta[:, :, i0:i1, None].to(ct) * p).sum()
            gq, gk, gv = torch.autograd.grad(loss, (qt, kb, vb))
            dq[:, :, i0:i1] = gq
            dk += gk
            dv += gv
    return dq.to(q.dtype), dk.to(k_blk.dtype), dv.to(v_blk.dtype)


def test_a_key_block_backward_by_autograd_is_refused():
    got = rows({**solution(), "key_block_backward": autograd_key_block}, "key_block_backward")[0]
    assert got.status in ("wrong", "error") and "it used autograd" in got.detail, got.detail


def test_flash_backward_that_borrows_the_chapter_backward_is_refused():
    """Counted calls of key_block_backward on one-row slices, then the chapter's query-outer
    backward through a reference saved before grading: the saved reference refuses too."""
    right, saved = solution()["key_block_backward"], flash_tiled.tiled_backward

    def decoy(dout, q, k, v, out, lse, causal=False, block=32):
        delta = (dout * out).sum(-1)
        for j0 in range(0, k.shape[2], block):
            right(q[:, :, -1:], k[:, :, j0:j0 + block], v[:, :, j0:j0 + block], dout[:, :, -1:],
                  lse[:, :, -1:], delta[:, :, -1:], j0, False, block)
        return saved(dout, q, k, v, out, lse, causal, block, block_q=block)
    got = rows({"flash_backward": decoy, "key_block_backward": right}, "flash_backward")[0]
    assert got.status == "error" and "write the key-block loop yourself: flash_tiled.tiled_backward" in got.detail


def test_key_block_that_borrows_the_chapter_backward_is_refused():
    """One key block through the chapter's backward with a fake out whose rowsum(dO*O) is delta."""
    def borrowed(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        fake = torch.zeros_like(dout)
        fake[..., 0] = delta / dout[..., 0]
        return flash_tiled.tiled_backward(dout, q, k_blk, v_blk, fake, lse, False, block, block_q=block)
    got = rows({"key_block_backward": borrowed}, "key_block_backward")[0]
    assert got.status == "error" and "flash_tiled.tiled_backward is off while lab 04 is graded" in got.detail


def test_flash_backward_whose_answer_is_not_its_key_blocks_fails():
    """Decoy calls of key_block_backward (counted) while the work runs through a renamed copy."""
    import types
    ns = solution()
    right = ns["key_block_backward"]
    copy = types.FunctionType(right.__code__.replace(co_name="copy"), right.__globals__)
    flash = ns["flash_backward"]

    def decoy(dout, q, k, v, out, lse, causal=False, block=32):
        delta = (dout * out).sum(-1)
        for j0 in range(0, k.shape[2], block):                      # the counted calls, thrown away
            right(q, k[:, :, j0:j0 + block], v[:, :, j0:j0 + block], dout, lse, delta * 0, j0, causal, block)
        flash.__globals__["key_block_backward"] = copy
        try:
            return flash(dout, q, k, v, out, lse, causal, block)
        finally:
            flash.__globals__["key_block_backward"] = right
    got = rows({"flash_backward": decoy, "key_block_backward": right}, "flash_backward")[0]
    assert got.status == "wrong" and "dq is not the sum of the dq_part that key_block_backward returned" \
        in got.detail, got.detail


def _key_block(q, k_blk, v_blk, dout, lse, delta, j0, causal, block, first, prep=lambda t: t, fold=True):
    """The key-block kernel written out, its query loop starting at row ``first(j0)``; ``prep``
    applied to each tile of q and dout (a copy, say); ``fold`` False: exp2 of (S c - lse) log2 e."""
    b, a, s_q, d = q.shape
    kv, n, c = k_blk.shape[1], k_blk.shape[2], d ** -0.5
    kk, vv = (t.repeat_interleave(a // kv, 1) for t in (k_blk, v_blk))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(kk), torch.zeros_like(vv)
    for i0 in range(first(j0, block) if causal else 0, s_q, block):
        i1 = min(i0 + block, s_q)
        qt, dot = prep(q[:, :, i0:i1]), prep(dout[:, :, i0:i1])
        if fold:
            s = _masked(qt @ kk.transpose(-1, -2) * (c * LOG2E), causal, i0, j0)  # exp2, log2 e folded
            p = torch.exp2(s - lse[:, :, i0:i1, None] * LOG2E)
        else:
            p = torch.exp2((_masked(qt @ kk.transpose(-1, -2) * c, causal, i0, j0) - lse[:, :, i0:i1, None]) * LOG2E)
        dv += p.transpose(-1, -2) @ dot
        ds = p * (dot @ vv.transpose(-1, -2) - delta[:, :, i0:i1, None]) * c
        dk += ds.transpose(-1, -2) @ qt
        dq[:, :, i0:i1] = ds @ kk
    return dq, _fold(dk, kv), _fold(dv, kv)


def test_key_block_without_the_causal_skip_fails():
    def every_query_block(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        return _key_block(q, k_blk, v_blk, dout, lse, delta, j0, causal, block, lambda j0, bl: 0)
    got = rows({"key_block_backward": every_query_block}, "key_block_backward")[0]
    assert got.status == "wrong" and "causal key block from key 32: it worked on query rows 0:16" in got.detail \
        and "skip the query blocks above the diagonal" in got.detail, got.detail
    skip = lambda j0, bl: j0 // bl * bl
    ok = {"key_block_backward": lambda q, kb, vb, do, l, dl, j0, causal=False, block=32: _key_block(
        q, kb, vb, do, l, dl, j0, causal, block, skip)}
    assert all(r.status == "ok" for r in rows(ok, "key_block_backward", (0, 1))), "the written-out kernel"


def test_key_block_that_slices_the_rows_from_j0_passes():
    """A correct causal kernel may cut lse, delta, q, dout at row j0 (a vector of 45 query rows is
    not 45 keys side by side)."""
    ns = solution()
    right = ns["key_block_backward"]

    def from_j0(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        if not causal or j0 >= q.shape[2]:
            return right(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
        lse_t, delta_t = lse[:, :, j0:], delta[:, :, j0:]
        dq_t, dk, dv = right(q[:, :, j0:], k_blk, v_blk, dout[:, :, j0:], lse_t, delta_t, 0, True, block)
        return torch.cat([q.new_zeros(*q.shape[:2], j0, q.shape[-1]), dq_t], 2), dk, dv
    ns["key_block_backward"] = from_j0
    got = rows(ns, "key_block_backward", (0, 2)) + rows(ns, "flash_backward", (0,))
    assert got and all(r.status == "ok" for r in got), [r.detail for r in got]


@pytest.fixture(scope="module")
def whole_check():
    """One whole check, the slowest thing in this file, shared by the two tests below (each ran
    its own before): ``merge_partials`` wrong on every case, and a ``flash_backward`` that
    computes its answer, then zeroes every input in place."""
    ns = solution()
    right = ns["flash_backward"]

    def vandal(dout, q, k, v, out, lse, causal=False, block=32):
        grads = right(dout, q, k, v, out, lse, causal, block)
        for t in (dout, q, k, v, out, lse):
            t.mul_(0)
        return grads
    ns["merge_partials"], ns["flash_backward"] = merge_by_average, vandal
    return chapters.check_lab("lab04_online_softmax", ns, show=False)


def test_each_function_stops_at_its_first_failing_case(whole_check):
    merge = [r for r in whole_check.rows if r.function == "merge_partials"]
    assert [r.status for r in merge] == ["wrong"] and len(whole_check.rows) == 22    # 4 + 6 + 1 + 4 + 4 + 3
    assert all(r.status == "ok" for r in whole_check.rows if r.function != "merge_partials")


def test_inputs_changed_in_place_change_no_later_check(whole_check):
    """(From tests/test_labs_hostile.py.) A backward that zeroes q, k, v, dout, out, lse in place
    after computing its answer must not make its own row, graded on the same inputs, or any later
    case look wrong: all 6 flash_backward rows pass, and so do the ring and part 5 after them."""
    flash = [r for r in whole_check.rows if r.function == "flash_backward"]
    assert len(flash) == 6 and all(r.status == "ok" for r in flash), [r.detail for r in flash]
    assert all(r.status == "ok" for r in whole_check.rows if r.function != "merge_partials")


def test_the_graders_own_gpu_measurement_is_off_during_the_learners_call():
    """``measure_on_gpu = lambda fn, *a: (labgpu._own_peak(fn, *a)[0], 1.0)`` cannot borrow it,
    even through a reference saved before grading."""
    saved = labgpu._own_peak
    with labgpu.guard(), pytest.raises(RuntimeError, match="measure it yourself: labgpu._own_peak is the grader"):
        saved(print)
    assert labgpu._own_peak.__code__.co_name == "_own_peak"        # restored after


def test_key_block_that_copies_each_tile_before_the_work_still_needs_the_skip():
    """``.contiguous()`` of every query tile (a copy) does not hide the work on it."""
    def copying(skip):
        return lambda q, kb, vb, do, l, dl, j0, causal=False, block=32: _key_block(
            q, kb, vb, do, l, dl, j0, causal, block, skip, lambda t: t.contiguous())
    got = rows({"key_block_backward": copying(lambda j0, bl: 0)}, "key_block_backward")[0]
    assert got.status == "wrong" and "it worked on query rows 0:16" in got.detail, got.detail
    fine = rows({"key_block_backward": copying(lambda j0, bl: j0 // bl * bl)}, "key_block_backward", (0, 2))
    assert all(r.status == "ok" for r in fine), [r.detail for r in fine]


def dlpack_round_trip(dout, q, k, v, out, lse, causal=False, block=32):
    """Out through DLPack, the work in NumPy, back in through DLPack and a clone."""
    import numpy as np
    arrays = [np.from_dlpack(t) for t in (dout, q, k, v)]
    return tuple(torch.from_dlpack(a).clone() for a in arrays)


def dlpack_capsule(dout, q, k, v, out, lse, causal=False, block=32):
    return tuple(torch.utils.dlpack.to_dlpack(t) for t in (dout, q, k))


@pytest.mark.parametrize("cheat, says", [
    (dlpack_round_trip, "it took the numbers out of torch ("),     # __dlpack__, or from_dlpack back
    (dlpack_capsule, "it took the numbers out of torch (torch.to_dlpack is off"),
], ids=["np.from_dlpack", "to_dlpack"])
def test_dlpack_is_a_way_out_too(cheat, says):
    before = torch.utils.dlpack.to_dlpack, torch.from_dlpack, torch.from_numpy
    got = rows({"flash_backward": cheat}, "flash_backward")[0]
    assert got.status == "error" and says in got.detail, got.detail
    assert (torch.utils.dlpack.to_dlpack, torch.from_dlpack, torch.from_numpy) == before   # restored


def test_bf16_accumulators_fail_the_bf16_case():
    """fp32 tiles, but dK and dV summed across query blocks in bf16 (the inputs' dtype)."""
    ns = solution()

    def bf16_sums(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        b, a, s_q, d = q.shape
        kv, n, c, acc = k_blk.shape[1], k_blk.shape[2], d ** -0.5, torch.promote_types(q.dtype, torch.float32)
        kk, vv = (t.repeat_interleave(a // kv, 1).to(acc) for t in (k_blk, v_blk))
        dq = torch.zeros(q.shape, dtype=acc)
        dk, dv = (torch.zeros(b, kv, n, d, dtype=q.dtype) for _ in range(2))
        for i0 in range(j0 // block * block if causal else 0, s_q, block):
            qt, dot = q[:, :, i0:i0 + block].to(acc), dout[:, :, i0:i0 + block].to(acc)
            p = torch.exp2(_masked(qt @ kk.transpose(-1, -2) * (c * LOG2E), causal, i0, j0)
                           - lse[:, :, i0:i0 + block, None] * LOG2E)
            dv += _fold(p.transpose(-1, -2) @ dot, kv).to(q.dtype)              # summed in bf16
            ds = p * (dot @ vv.transpose(-1, -2) - delta[:, :, i0:i0 + block, None].to(acc)) * c
            dk += _fold(ds.transpose(-1, -2) @ qt, kv).to(q.dtype)
            dq[:, :, i0:i0 + block] = ds @ kk
        return dq, dk, dv                                               # dq_part in fp32, as asked
    ns["key_block_backward"] = scope = ns["flash_backward"].__globals__   # the notebook's globals
    right, scope["key_block_backward"] = scope["key_block_backward"], bf16_sums
    try:
        ns["key_block_backward"] = bf16_sums
        assert all(r.status == "ok" for r in rows(ns, "flash_backward", (0, 1))), "fine in fp64"
        report = Report(labcheck.LAB)
        labcheck._flash_rows(report, ns["flash_backward"], labcheck.BF16, 104, inner=bf16_sums)
    finally:
        scope["key_block_backward"] = right
    got = report.rows[0]
    assert got.status == "wrong" and got.detail.startswith("dk: relative error 0.00") \
        and "and every sum across blocks (dQ over key blocks, dK and dV over query blocks) in fp32" in got.detail, got.detail


# ---- third review: threads, the watch switched off, the ring's calls, the skip by work, dQ in bf16 ----

from torch._C import DisableTorchFunction as _SAVED_OFF                  # saved before grading
from torch.utils._python_dispatch import _disable_current_modes as _saved_modes_off


def _whole_rows(q, k_blk, v_blk, dout, lse, delta, j0, causal):
    """One key block's exact backward, every query row at once (what the watch must not see)."""
    kk, vv, c = _expanded(q, k_blk, v_blk)
    p = torch.exp(_masked(q @ kk.transpose(-1, -2) * c, causal, 0, j0) - lse[..., None])
    ds = p * (dout @ vv.transpose(-1, -2) - delta[..., None]) * c
    return ds @ kk, _fold(ds.transpose(-1, -2) @ q, k_blk.shape[1]), _fold(p.transpose(-1, -2) @ dout, k_blk.shape[1])


def in_a_thread(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    import threading
    box = []
    worker = threading.Thread(target=lambda: box.append(_whole_rows(q, k_blk, v_blk, dout, lse, delta, j0, causal)))
    worker.start()
    worker.join()
    return tuple(t.clone() for t in box[0])


def modes_off_at_call_time(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        got = _whole_rows(q, k_blk, v_blk, dout, lse, delta, j0, causal)
    return tuple(t.clone() for t in got)


def modes_off_saved_before(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    with _saved_modes_off(), _SAVED_OFF():
        got = _whole_rows(q, k_blk, v_blk, dout, lse, delta, j0, causal)
    return tuple(t.clone() for t in got)


def in_a_pool(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        return tuple(t * 1 for t in pool.submit(_whole_rows, q, k_blk, v_blk, dout, lse, delta, j0, causal).result())


def modes_off_then_a_list(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    with _saved_modes_off(), _SAVED_OFF():
        lists = [t.tolist() for t in _whole_rows(q, k_blk, v_blk, dout, lse, delta, j0, causal)]
    return tuple(torch.tensor(x, dtype=q.dtype) for x in lists)


@pytest.mark.parametrize("cheat, status, says", [
    (in_a_thread, "error", "it started a thread (Thread.start is off while lab 04 is graded)"),
    (in_a_pool, "error", "it started a thread (Thread.start is off while lab 04 is graded)"),
    (modes_off_then_a_list, "wrong", "it built a tensor of 9,240 numbers from Python data (torch.tensor of a list)"),
    (modes_off_at_call_time, "error", "it switched the grader's watch off "
     "(torch.utils._python_dispatch._disable_current_modes is off"),
    (modes_off_saved_before, "wrong", "that is no input and that no torch op in the call made"),
], ids=["thread", "pool", "list", "modes-off", "saved-modes-off"])
def test_work_the_watch_cannot_see_fails(cheat, status, says):
    got = rows({"key_block_backward": cheat}, "key_block_backward")[0]
    assert got.status == status and says in got.detail, got.detail


def no_skip_by_index_select(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """Every query block, picked with index_select (no slice of Q for the watch to place)."""
    b, a, s_q, d = q.shape
    kk, vv, c = _expanded(q, k_blk, v_blk)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(kk), torch.zeros_like(vv)
    for i0 in range(0, s_q, block):
        idx = torch.arange(i0, min(i0 + block, s_q))
        qt, dot = q.index_select(2, idx), dout.index_select(2, idx)
        p = torch.exp2(_masked(qt @ kk.transpose(-1, -2) * (c * LOG2E), causal, i0, j0)   # exp2 done right
                       - lse.index_select(2, idx)[..., None] * LOG2E)
        ds = p * (dot @ vv.transpose(-1, -2) - delta.index_select(2, idx)[..., None]) * c
        dq[:, :, i0:i0 + block] = ds @ kk
        dk += ds.transpose(-1, -2) @ qt
        dv += p.transpose(-1, -2) @ dot
    return dq, _fold(dk, k_blk.shape[1]), _fold(dv, k_blk.shape[1])


def test_no_causal_skip_is_seen_by_its_work_not_its_slices():
    got = rows({"key_block_backward": no_skip_by_index_select}, "key_block_backward")[0]
    assert got.status == "wrong" and got.detail.startswith(
        "key block 64:73: causal key block from key 64: it took exp for 77 query rows x 9 keys x 6 heads, "
        "but only the 13 rows from 64 on see any of its keys; skip the query blocks"), got.detail


def test_dq_summed_in_bf16_fails_the_many_key_blocks_case():
    ns = solution()
    kbb = ns["key_block_backward"]

    def bf16_dq(dout, q, k, v, out, lse, causal=False, block=32):
        delta = (dout.float() * out.float()).sum(-1)
        dq, dk, dv = torch.zeros_like(q), torch.empty_like(k), torch.empty_like(v)   # dq in bf16
        for j0 in range(0, k.shape[2], block):
            part, dk[:, :, j0:j0 + block], dv[:, :, j0:j0 + block] = kbb(
                q, k[:, :, j0:j0 + block], v[:, :, j0:j0 + block], dout, lse, delta, j0, causal, block)
            dq += part
        return dq, dk, dv
    report = Report(labcheck.LAB)
    labcheck._flash_rows(report, bf16_dq, labcheck.BF16_DQ, 105, inner=kbb)
    got = report.rows[0]
    assert got.status == "wrong" and got.detail.startswith("dq: relative error 0.00") \
        and "against the exact dQ rounded once to bf16" in got.detail \
        and "dQ's partial sums stay in fp32" in got.detail, got.detail


def ring_of_unit_dims(q, k_shards, v_shards, rank, causal=False, block=32):
    """The shards joined behind two unit dims, whole-row attention one query at a time."""
    b, a, s_q, d = q.shape
    q0 = sum(k.shape[2] for k in k_shards[:rank])
    kk = torch.cat([k[..., None, None] for k in k_shards], 2)
    vv = torch.cat([v[..., None, None] for v in v_shards], 2)
    kk, vv = kk.repeat_interleave(a // kk.shape[1], 1), vv.repeat_interleave(a // vv.shape[1], 1)
    outs, lses = [], []
    for i in range(s_q):
        s = (q[:, :, i, None, :, None, None] * kk).sum(3, keepdim=True) / math.sqrt(d)
        if causal:
            s = s.masked_fill((torch.arange(kk.shape[2]) > q0 + i).reshape(-1, 1, 1, 1), -math.inf)
        m = s.amax(2, keepdim=True)
        e = torch.exp(s - m)
        outs.append(((e * vv).sum(2) / e.sum(2)).reshape(b, a, 1, d))
        lses.append((m + torch.log(e.sum(2, keepdim=True))).reshape(b, a, 1))
    return torch.cat(outs, 2), torch.cat(lses, 2)


def ring_with_extra_shard(q, k_shards, v_shards, rank, causal=False, block=32):
    merge, parts = solution()["merge_partials"], []
    for r, (k_r, v_r) in enumerate(zip(k_shards, v_shards)):
        if k_r.shape[2]:
            part = flash_tiled.tiled_forward(q, k_r, v_r, causal and r >= rank, block, block_q=block)
            if not (causal and r > rank):
                parts.append(part)                                   # computed, then thrown away
    return merge(parts)


def ring_with_inline_merge(q, k_shards, v_shards, rank, causal=False, block=32):
    parts = [flash_tiled.tiled_forward(q, k_r, v_r, causal and r == rank, block, block_q=block)
             for r, (k_r, v_r) in enumerate(zip(k_shards, v_shards)) if k_r.shape[2] and not (causal and r > rank)]
    lses = torch.stack([l for _, l in parts])
    lse = torch.logsumexp(lses, 0)
    return (torch.exp(lses - lse)[..., None] * torch.stack([o for o, _ in parts])).sum(0), lse


def ring_through_empty_shard(q, k_shards, v_shards, rank, causal=False, block=32):
    parts = [flash_tiled.tiled_forward(q, k_r, v_r, causal and r == rank, block, block_q=block)
             for r, (k_r, v_r) in enumerate(zip(k_shards, v_shards)) if not (causal and r > rank)]
    lses = torch.stack([l for _, l in parts])
    lse = torch.logsumexp(lses, 0)
    return (torch.exp(lses - lse)[..., None] * torch.stack([o for o, _ in parts])).sum(0), lse


@pytest.mark.parametrize("ring, case, says", [
    (ring_of_unit_dims, 0, "shard 0 (keys 0:30) was not computed with the given tiled_forward"),
    (ring_with_extra_shard, 0, "it ran tiled_forward on shard 2 (keys 53:94), which comes after rank 1's"),
    (ring_with_inline_merge, 0, "it never called merge_partials"),
    (ring_through_empty_shard, 1, "shard 1 is empty (0 keys): tiled_forward gives out NaN (0/0)"),
], ids=["unit-dims", "extra-shard", "inline-merge", "empty-shard"])
def test_ring_is_graded_by_its_calls(ring, case, says):
    got = rows({"ring_attention": ring}, "ring_attention", (case,))[0]
    assert got.status == "wrong" and says in got.detail, got.detail


def test_drawn_cases_keep_what_the_fixed_ones_test():
    from gpumem.chapters.ch04_flash_attention import labcases
    for seed in range(40):
        drawn = labcases.draw(seed)
        for fixed, (b, a, kv, sq, sk, d, causal, block) in zip(labcases.BACKWARD, drawn["BACKWARD"]):
            assert a % kv == 0 and (a > kv) == (fixed[1] > fixed[2]) and causal == fixed[6]
            assert sk % block >= 9 and sq != sk
        for fixed, (b, a, kv, lengths, rank, d, causal, block) in zip(labcases.RING, drawn["RING"]):
            assert a % kv == 0 and lengths[rank] > 0 and (0 in lengths) == (0 in fixed[3])
        merge = drawn["MERGE"]
        assert 0 in merge[1][4] and merge[3][5] == "rows with no key" and merge[3][6] >= 1
    assert labcases.draw(1) == labcases.draw(1) and labcases.draw(1) != labcases.draw(2)


class _Made(TorchDispatchMode):
    """Every tensor an op returns, as (shape, dtype): what the watch's shape rules are shown."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.made.append((tuple(t.shape), t.dtype))
        return out


def _merge_made(merge, b, a, s_q, d, n) -> list:
    parts = [(torch.zeros(b, a, s_q, d, dtype=torch.float64), torch.zeros(b, a, s_q, dtype=torch.float64))
             for _ in range(n)]
    with _Made() as seen:
        merge(parts)
    return seen.made


def _flagged(watch, made) -> str:
    for shape, dtype in made:
        labshape.shape(watch, torch.empty(shape, dtype=dtype, device="meta"))
        if watch.broken:
            return f"{shape}: {watch.broken}"
    return ""


def test_the_solutions_merge_is_never_taken_for_a_score_matrix():
    """r5 expert #1: the stacked partials (n, b, a, s_q, d) hold n x d numbers per query row and
    head; with n x d >= s_k the old per-head count called them the whole score matrix (83 of 2,000
    draws failed the solution). Every ring and merge case of 2,000 draws, the solution's own merge
    tensors shown to the grader's watch for that case (shapes only, no grading)."""
    merge, empty, cache = solution()["merge_partials"], torch.empty(0), {}
    stacked = 0
    for seed in range(2000):
        drawn = labcases.draw(seed)
        for case in drawn["RING"]:
            b, a, _, lengths, rank, d, causal, _ = case
            n = sum(1 for r, m in enumerate(lengths) if m and not (causal and r > rank))
            key = (b, a, lengths[rank], d, n)
            made = cache[key] = cache.get(key) or _merge_made(merge, *key)
            stacked += n * d >= sum(lengths)
            bad = _flagged(labcheck.ring_watch(case, empty, [], []), made)
            assert not bad, (seed, case, bad)
        for case in drawn["MERGE"]:
            b, heads, s_q, d, lengths, _, _ = case
            key = (b, heads, s_q, d, len(lengths))
            made = cache[key] = cache.get(key) or _merge_made(merge, *key)
            bad = _flagged(labcheck.merge_watch(case, []), made)
            assert not bad, (seed, case, bad)
    assert stacked > 50                        # the draws do reach the shapes that used to be flagged
    for shape in ((1, 3, 13 * 30), (1, 3, 13, 30), (2, 1, 3, 30, 13)):   # a score matrix still is one
        watch = labcheck.ring_watch((1, 3, 1, (13, 17), 0, 16, False, 16), empty, [], [])
        assert "the whole 13 x 30 score matrix" in _flagged(watch, [(shape, torch.float64)]), shape


def _found(*names):
    """What the grader's frames hold under ``names`` while the learner's function runs, or None."""
    frame = sys._getframe(2)
    while frame is not None:
        hit = [frame.f_locals[n] for n in names if n in frame.f_locals]
        if len(hit) == len(names):
            return tuple(hit)
        frame = frame.f_back
    return None


def merge_from_the_stack(parts):
    return _found("out", "lse") or parts[0]


def test_the_expected_answer_is_not_on_the_stack_during_the_call():
    """r5 expert #4 (lab 03's #2 here): the expected out and lse are made after the learner's call
    returns, so a merge or a ring that walks up the frames for them would find nothing; since review
    r13 #3 the walk itself is refused (the labs' audit hook), and the row names it."""
    got = rows({"merge_partials": merge_from_the_stack}, "merge_partials")[0]
    assert got.status == "error" and "sys._getframe" in got.detail, got.detail
    ns = solution()
    inner, found = ns["ring_attention"], _found

    def ring(q, k_shards, v_shards, rank, causal=False, block=32):
        found("out", "lse")
        return inner(q, k_shards, v_shards, rank, causal, block)
    ns["ring_attention"] = types.FunctionType(ring.__code__, ns, "ring_attention", ring.__defaults__,
                                              ring.__closure__)
    got = rows(ns, "ring_attention")[0]
    assert got.status == "error" and "sys._getframe" in got.detail, got.detail


def _chapter_backward_key_block(tb):
    """r5 expert #2: the chapter's query-outer backward on the rows from j0, with a made-up O."""
    def key_block_backward(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        i0 = min(j0, q.shape[2]) if causal else 0
        qs, ds = q[..., i0:, :], dout[..., i0:, :]
        ls, de = lse[..., None][..., i0:, :], delta[..., None][..., i0:, :]
        out = ds * (de / (ds * ds).sum(-1, keepdim=True))           # any O with rowsum(dO * O) = D
        dq, dk, dv = tb(ds, qs, k_blk, v_blk, out, ls, causal, block, None, block)
        return torch.cat([q.new_zeros(q.shape[:2] + (i0, q.shape[3])), dq], 2), dk, dv
    return key_block_backward


def _rebuilt():
    return types.FunctionType(flash_tiled.tiled_backward.__code__, flash_tiled.__dict__)


def _pasted():
    scope = dict(vars(flash_tiled))
    exec(inspect.getsource(flash_tiled.tiled_backward).replace("def tiled_backward", "def _tb"), scope)
    return scope["_tb"]


def _mutated():
    """The r6 expert's route: the chapter's module re-parsed, every ``return X`` made ``return _id(X)``
    and a return added at the end of every function, then run under another name (no suffix of any
    code object is the chapter's any more; copy_watch's similarity match still finds it)."""
    import ast

    class Wrap(ast.NodeTransformer):
        def visit_Return(self, node):
            node.value = ast.Call(ast.Name("_id", ast.Load()), [node.value or ast.Constant(None)], [])
            return node

        def visit_FunctionDef(self, node):
            self.generic_visit(node)
            node.body.append(ast.parse("return _id(None)").body[0])
            return node
    tree = ast.fix_missing_locations(Wrap().visit(ast.parse(inspect.getsource(flash_tiled))))
    scope = {"_id": lambda x: x, "__name__": "mine"}
    exec(compile(tree, "<mine>", "exec"), scope)
    return scope["tiled_backward"]


@pytest.mark.parametrize("make, says", [
    (_rebuilt, "it ran flash_tiled.tiled_backward (its code, rebuilt into a function of yours)"),
    (_pasted, "it ran flash_tiled.tiled_backward (chapter 04's backward, copied under another name)"),
    (_mutated, "it ran flash_tiled.tiled_backward (chapter 04's backward, copied under another name)"),
], ids=["FunctionType", "pasted-source", "mutated-copy"])
def test_chapter_backward_rebuilt_or_pasted_before_the_check_is_refused(make, says):
    got = rows({"key_block_backward": _chapter_backward_key_block(make())}, "key_block_backward")[0]
    assert got.status in ("wrong", "error") and says in got.detail, got.detail


# ---- r7 review: exp2 with log2 e folded (what chapter 04's backward does not compute), part 5 ----

def _hoisted(fn):
    """Review r7's mut2: every number and string of ``fn``'s module hoisted into a global, a no-op
    call before every statement; behaviour unchanged."""
    import ast

    class K(ast.NodeTransformer):
        names: dict = {}

        def visit_Constant(self, node):
            if node.value is None or (isinstance(node.value, (int, float, str)) and not isinstance(node.value, bool)):
                return ast.copy_location(ast.Name(self.names.setdefault((type(node.value), node.value),
                                                                        f"_k{len(self.names)}"), ast.Load()), node)
            return node

        def visit_Expr(self, node):                                   # docstrings kept
            return node if isinstance(node.value, ast.Constant) else self.generic_visit(node)

        def generic_visit(self, node):
            super().generic_visit(node)
            for field in ("body", "orelse"):
                body = getattr(node, field, None)
                if isinstance(body, list) and body and isinstance(body[0], ast.stmt) and not isinstance(node, ast.Module):
                    setattr(node, field, [x for st in body for x in (ast.parse("_nop()").body[0], st)])
            return node
    k = K()
    tree = ast.fix_missing_locations(k.visit(ast.parse(inspect.getsource(sys.modules[fn.__module__]))))
    scope = {"_nop": lambda: None, "__name__": "mine", **{v: key[1] for key, v in k.names.items()}}
    exec(compile(tree, "<mine>", "exec"), scope)
    return scope[fn.__name__]


def test_mut2_copy_of_the_chapter_backward_is_named():
    got = rows({"key_block_backward": _chapter_backward_key_block(_hoisted(flash_tiled.tiled_backward))},
               "key_block_backward")[0]
    assert got.status in ("wrong", "error") and "chapter 04's backward, copied under another name" in got.detail, \
        got.detail


@pytest.mark.parametrize("make", [_pasted, lambda: _hoisted(flash_tiled.tiled_backward)], ids=["pasted", "mut2"])
def test_a_copy_the_copy_watch_misses_still_fails_on_its_exponentials(make, monkeypatch):
    """With the copy watch blinded (as a future transform might), chapter 04's backward still
    cannot answer: its probabilities come from exp, not FA-2's exp2 with log2 e folded in."""
    from gpumem.chapters.ch04_flash_attention import labblock
    monkeypatch.setattr(labblock, "no_copies", lambda flag: labblock.contextlib.nullcontext())
    got = rows({"key_block_backward": _chapter_backward_key_block(make())}, "key_block_backward")[0]
    assert got.status == "wrong" and got.detail.startswith("key block 0:16: it rebuilt P with exp, the natural base, "
                                                           "as chapter 04's backward does"), got.detail


def test_exp2_without_the_fold_fails_and_the_folded_kernel_passes():
    skip = lambda j0, bl: j0 // bl * bl
    unfolded = lambda q, kb, vb, do, l, dl, j0, causal=False, block=32: _key_block(
        q, kb, vb, do, l, dl, j0, causal, block, skip, fold=False)
    got = rows({"key_block_backward": unfolded}, "key_block_backward")[0]
    want = "it took exp2 of scores multiplied by log2(e) on its own (exp2 of a tensor of shape (1, 6, 16, 16))"
    assert got.status == "wrong" and want in got.detail, got.detail          # case 0: d = 20
    # review r31 #3: the verdict asks where log2(e) can go; it gives no formula and no folded scale
    c2 = f"{20 ** -0.5 * LOG2E:.6g}"                                       # 0.322596 (d = 20)
    assert "single multiply-add before exp2?" in got.detail and c2 not in got.detail and "exp2(S" not in got.detail


# ---- r8 review: the fold checked by data flow (cheat B: a paste with exp2(log2e * (...)) and a dummy fold) ----

def _cheat_b():
    """Review r8's cheat B: chapter 04's backward pasted with three one-line edits: exp made
    exp2(LOG2E * (...)) (unfolded), a dummy multiply by scale * log2 e of a scalar, and
    ``range(0, ...)`` made ``range(len(()), ...)`` (one fewer constant for the copy watch)."""
    body = inspect.getsource(flash_tiled.tiled_backward).replace("def tiled_backward(", "def _tb(")
    edits = (("p = torch.exp(_tile_scores(q_blk, k_blk, scale, causal, i0, j0) - lse_g[..., i0:i1, :])",
              "p = torch.exp2(LOG2E * (_tile_scores(q_blk, k_blk, scale, causal, i0, j0) - lse_g[..., i0:i1, :]))"),
             ("    acc = _acc(q)\n", "    acc = _acc(q)\n    _ = q.new_ones(()) * (scale * LOG2E)\n"),
             ("range(0, s_q, bq)", "range(len(()), s_q, bq)"))
    for old, new in edits:
        assert old in body, old
        body = body.replace(old, new)
    scope = {**vars(flash_tiled), "LOG2E": LOG2E}
    exec(body, scope)
    return scope["_tb"]


def test_cheat_b_is_refused_and_fails_the_fold_without_the_copy_watch(monkeypatch):
    got = rows({"key_block_backward": _chapter_backward_key_block(_cheat_b())}, "key_block_backward")[0]
    assert got.status in ("wrong", "error"), got.detail
    from gpumem.chapters.ch04_flash_attention import labblock
    monkeypatch.setattr(labblock, "no_copies", lambda flag: labblock.contextlib.nullcontext())
    got = rows({"key_block_backward": _chapter_backward_key_block(_cheat_b())}, "key_block_backward")[0]
    assert got.status == "wrong" and "it took exp2 of scores multiplied by log2(e) on its own" in got.detail, \
        got.detail


def _exp2_kernel(exponent):
    """The key-block kernel with its exponent written by ``exponent(qt, kk, lse_rows, c, causal, i0, j0)``."""
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        b, a, s_q, d = q.shape
        kv, c = k_blk.shape[1], d ** -0.5
        kk, vv = (t.repeat_interleave(a // kv, 1) for t in (k_blk, v_blk))
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(kk), torch.zeros_like(vv)
        for i0 in range(j0 // block * block if causal else 0, s_q, block):
            i1 = min(i0 + block, s_q)
            qt, dot = q[:, :, i0:i1], dout[:, :, i0:i1]
            p = torch.exp2(exponent(qt, kk, lse[:, :, i0:i1, None], c, causal, i0, j0))
            dv += p.transpose(-1, -2) @ dot
            ds = p * (dot @ vv.transpose(-1, -2) - delta[:, :, i0:i1, None]) * c
            dk += ds.transpose(-1, -2) @ qt
            dq[:, :, i0:i1] = ds @ kk
        return dq, _fold(dk, kv), _fold(dv, kv)
    return kernel


def _dummy_fold(qt, kk, l, c, causal, i0, j0):          # a fold on a scalar; the exponent unfolded
    _ = qt.new_ones(()) * (c * LOG2E)
    return (_masked(qt @ kk.transpose(-1, -2) * c, causal, i0, j0) - l) / math.log(2)


def _side_fold(qt, kk, l, c, causal, i0, j0):           # a folded tile made, another one exponentiated
    _ = qt @ kk.transpose(-1, -2) * (c * LOG2E)
    return (_masked(qt @ kk.transpose(-1, -2) * c, causal, i0, j0) - l) * 2.0 * (LOG2E / 2)   # log2 e in two


@pytest.mark.parametrize("exponent, says", [
    (_dummy_fold, "it took exp2 of scores multiplied by log2(e) on its own"),
    (_side_fold, "that does not come from the score tile Q K^T multiplied once by scale * log2(e)")],
    ids=["dummy-scalar-fold", "fold-of-another-tile"])
def test_a_fold_that_does_not_reach_the_exponential_fails(exponent, says):
    got = rows({"key_block_backward": _exp2_kernel(exponent)}, "key_block_backward")[0]
    assert got.status == "wrong" and says in got.detail, got.detail


def _einsum_where(qt, kk, l, c, causal, i0, j0):         # einsum, torch.where for the mask
    s = torch.einsum("bhqd,bhkd->bhqk", qt, kk) * (c * LOG2E)
    if causal:
        hide = torch.arange(j0, j0 + s.shape[-1])[None, :] > torch.arange(i0, i0 + s.shape[-2])[:, None]
        s = torch.where(hide, -math.inf, s)
    return s - l * LOG2E


def _in_place(qt, kk, l, c, causal, i0, j0):              # mul_ and sub_ on the tile
    s = qt @ kk.transpose(-1, -2)
    s.mul_(c * LOG2E)
    return _masked(s, causal, i0, j0).sub_(l * LOG2E)


@pytest.mark.parametrize("exponent", [
    lambda qt, kk, l, c, causal, i0, j0: _masked(qt @ kk.transpose(-1, -2) * (c * LOG2E), causal, i0, j0) - l * LOG2E,
    lambda qt, kk, l, c, causal, i0, j0: _masked((qt * (c * LOG2E)) @ kk.transpose(-1, -2), causal, i0, j0) - l * LOG2E,
    lambda qt, kk, l, c, causal, i0, j0: _masked(torch.baddbmm(
        (-l * LOG2E).expand(*qt.shape[:3], kk.shape[2]).flatten(0, 1), qt.flatten(0, 1),
        kk.transpose(-1, -2).flatten(0, 1), alpha=c * LOG2E).view(*qt.shape[:3], -1), causal, i0, j0),
    _einsum_where, _in_place],
    ids=["scores-times-c2", "q-times-c2", "baddbmm-alpha-c2", "einsum-where", "in-place"])
def test_folds_a_learner_may_write_pass(exponent):
    got = rows({"key_block_backward": _exp2_kernel(exponent)}, "key_block_backward", (0, 1))
    assert all(r.status == "ok" for r in got), [r.detail for r in got]


def _zig(function, fn, case, ring=None):
    from gpumem.chapters.ch04_flash_attention import labzig
    report = Report(labcheck.LAB)
    grade = labzig.order_rows if function == "shard_order" else labzig.count_rows
    grade(report, fn, case, 7, ring=ring or solution()["ring_attention"])
    return report.rows[0]


def test_contiguous_shard_order_is_unbalanced():
    """3 ranks, chunks of 5: chunk c's queries keep 25 c + 15 entries (c whole chunks, then its own
    lower triangle, 5 * 6 / 2); contiguous: rank 0 = 15 + 40 = 55, rank 2 = 115 + 140 = 255."""
    got = _zig("shard_order", lambda ranks: [c // 2 for c in range(2 * ranks)], (3, 5))
    assert got.status == "wrong" and got.detail == (
        "order [0, 0, 1, 1, 2, 2]: rank 0 keeps 55 score entries, rank 2 255 (chunks of 5, causal): not balanced"), got.detail
    assert _zig("shard_order", lambda r: [0, 1, 2, 2, 1, 0], (3, 5)).status == "ok"   # rank r: r and 2R-1-r
    bad = _zig("shard_order", lambda r: [0, 0, 0, 1, 2, 2], (3, 5))
    assert bad.status == "wrong" and "each of the 3 ranks must hold exactly two of the 6 chunks" in bad.detail


def test_counts_that_assume_the_contiguous_order_fail_on_a_balanced_one():
    contiguous = lambda owner, n: [(4 * r + 1) * n * n + n * (n + 1) for r in range(len(owner) // 2)]
    assert _zig("exp_counts", contiguous, (3, 5, "contiguous")).status == "ok"
    got = _zig("exp_counts", contiguous, (4, 6, "balanced"))
    assert got.status == "wrong" and got.detail.startswith("rank 0 (chunks ") and ", expected 294" in got.detail, \
        got.detail                                                   # (2R-1) n^2 + n (n+1) = 7 * 36 + 42 = 294


def test_counting_entry_by_entry_does_not_finish_on_a_long_sequence(monkeypatch):
    def brute(owner, n):
        counts = [0] * (len(owner) // 2)
        for c, r in enumerate(owner):
            for i in range(c * n, c * n + n):
                for _ in range(i + 1):
                    counts[r] += 1
        return counts
    assert _zig("exp_counts", brute, (3, 7, "shuffled")).status == "ok"
    monkeypatch.setenv("GPUMEM_CASE_SECONDS", "2")
    got = _zig("exp_counts", brute, labzig_case("long"))
    assert got.status == "error" and "took longer than 2 s" in got.detail, got.detail


def labzig_case(what):
    from gpumem.chapters.ch04_flash_attention import labzig
    return next(c for c in labzig.COUNTS if c[2] == what)


def test_part_5_counts_what_the_ring_ran():
    """A ring that also runs the shards after its queries (the causal skip missed) is named."""
    right = solution()["ring_attention"]
    extra = lambda q, ks, vs, rank, causal=False, block=32: right(q, ks, vs, len(ks) - 1, False, block) and \
        right(q, ks, vs, rank, causal, block)
    got = _zig("exp_counts", solution()["exp_counts"], (3, 5, "contiguous"), ring=extra)
    assert got.status == "wrong" and got.detail.startswith("your ring_attention for chunk 0 (of 6 chunks of 5 tokens, "
                                                           "causal) ran tiled_forward on 7 shards"), got.detail
    drawn = [__import__("random").Random(s) for s in range(20)]
    from gpumem.chapters.ch04_flash_attention import labzig
    for rng in drawn:
        zig = labzig.draw(rng)
        assert [c[2] for c in zig["COUNTS"]] == [c[2] for c in labzig.COUNTS]
        ranks, n, _ = zig["COUNTS"][3]
        assert 2 * ranks * n == 2 ** 20 and all(3 <= r <= 7 for r, _ in zig["ORDERS"])


def test_part_5_counts_are_not_on_the_stack_during_the_call():
    """exp_counts is called before the grader counts: a frame walk finds no expected list."""
    def from_the_stack(owner, n):
        frame = sys._getframe(1)
        while frame is not None:
            if "want" in frame.f_locals:
                return frame.f_locals["want"]
            frame = frame.f_back
        return None
    got = _zig("exp_counts", from_the_stack, (3, 5, "contiguous"))
    assert got.status == "wrong" and got.detail.startswith("expected a list of 3 counts"), got.detail


# ---- r8 review: part 5 answered by the grader's own functions (cheat C) ----

def test_part_5_from_the_graders_functions_is_refused():
    """Review r8's cheat C: labzig.by_hand as exp_counts, labzig.owners(R, "balanced") as
    shard_order; a function rebuilt on by_hand's code before the check is refused as well."""
    import random
    from gpumem.chapters.ch04_flash_attention import labzig
    got = _zig("exp_counts", labzig.by_hand, (3, 5, "contiguous"))
    assert got.status == "error" and "labzig.by_hand is the grader's own answer" in got.detail, got.detail
    got = _zig("shard_order", lambda r: labzig.owners(r, "balanced", random.Random(0)), (3, 5))
    assert got.status == "error" and "labzig.owners is the grader's own answer" in got.detail, got.detail
    rebuilt = types.FunctionType(labzig.by_hand.__code__, vars(labzig))
    got = _zig("exp_counts", rebuilt, (3, 5, "contiguous"))
    assert got.status == "error" and "labzig.by_hand is the grader's own answer" in got.detail, got.detail
    measure = lambda owner, n: labzig.measured(solution()["ring_attention"], owner, n, 0)[0]
    got = _zig("exp_counts", measure, (3, 5, "contiguous"))
    assert got.status == "error" and "labzig.measured is the grader's own answer" in got.detail, got.detail
    assert labzig.by_hand([0, 1, 1, 0], 3) == [39, 39]     # restored after: c 9 + 6 per chunk, 6 + 33, 15 + 24


def test_help_of_labzig_prints_no_answer():
    """help(labzig) shows docstrings: neither the balanced order nor the count per chunk."""
    import pydoc
    from gpumem.chapters.ch04_flash_attention import labzig
    text = pydoc.render_doc(labzig, renderer=pydoc.plaintext)
    for answer in ("2R-1", "2R - 1", "2 x CP - 1", "n (n + 1)", "n(n+1)", "c n^2", "lower triangle", "chunks r"):
        assert answer not in text, answer


# Review r10 of lab 04, C1: the learner's call took the grader's watch off the mode stack and
# rebound its verdict, then ran a dense column tile with exp and no causal skip (10 of 10 rows).
_STACK_AT = torch._C._get_dispatch_stack_at                         # saved before grading
import torch.fx.experimental.proxy_tensor  # noqa: E402,F401 (imported before grading, as a cell would)


def _blind(w):
    w.flag = lambda *a, **k: None
    w.foreign = lambda *a, **k: ""
    w.exp2 = None
    w.exps = 0


def _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal):
    """r10's C1 body: every query row against the key block at once, exp, no skip."""
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    kk, vv = k_blk.repeat_interleave(a // kv, 1), v_blk.repeat_interleave(a // kv, 1)
    s = q @ kk.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.arange(j0, j0 + n)[None, :] > torch.arange(s_q)[:, None], -math.inf)
    p = torch.exp(s - lse[..., None])
    ds = p * (dout @ vv.transpose(-1, -2) - delta[..., None]) / math.sqrt(d)
    fold = lambda t: t.reshape(b, kv, a // kv, n, d).sum(2)
    return ds @ kk, fold(ds.transpose(-1, -2) @ q), fold(p.transpose(-1, -2) @ dout)


def blinded_by_the_current_mode(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    import torch.utils._python_dispatch as _pd
    _blind(_pd._get_current_dispatch_mode())                        # r10's C1, as written
    return _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal)


def blinded_by_the_function_mode(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    _blind(torch.overrides._get_current_function_mode_stack()[-1].watch)
    return _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal)


def blinded_by_a_torch_helper(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    import torch.fx.experimental.proxy_tensor as proxy_tensor
    _blind(proxy_tensor.get_torch_dispatch_modes()[-1])           # torch code handing the stack on
    return _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal)


def blinded_quietly(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """The getter saved before the check; each refused rebinding caught."""
    w = _STACK_AT(torch._C._len_torch_dispatch_stack() - 1)
    for name in ("flag", "exps"):
        try:
            setattr(w, name, 0)
        except AttributeError:
            pass
    return _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal)


def blinded_past_setattr(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """The getter saved before the check; the instance written without __setattr__."""
    w = _STACK_AT(torch._C._len_torch_dispatch_stack() - 1)
    object.__setattr__(w, "flag", lambda *a, **k: None)
    vars(w)["exp2"] = None
    object.__setattr__(w, "foreign", lambda *a, **k: "")
    return _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal)


@pytest.mark.parametrize("cheat, status, says", [
    (blinded_by_the_current_mode, "error", "it reached for the grader's watch "
     "(torch.utils._python_dispatch._get_current_dispatch_mode is off while lab 04 is graded)"),
    (blinded_by_the_function_mode, "error", "it reached for the grader's watch "
     "(torch.overrides._get_current_function_mode_stack is off while lab 04 is graded)"),
    (blinded_by_a_torch_helper, "error", "it reached for the grader's watch "
     "(torch.utils._python_dispatch._get_current_dispatch_mode_stack is off while lab 04 is graded)"),
    (blinded_quietly, "wrong", "it rebound the grader's watch (Watch.flag)"),
    (blinded_past_setattr, "wrong", "it rebound the grader's watch (Watch.exp2, Watch.flag, Watch.foreign)"),
], ids=["r10-C1", "function-mode", "torch-helper", "setattr-caught", "object-setattr"])
def test_a_watch_reached_from_the_call_cannot_be_blinded(cheat, status, says):
    got = rows({"key_block_backward": cheat}, "key_block_backward")[0]
    assert got.status == status and says in got.detail, got.detail
    got = _flash_row(cheat)                  # the solution's flash_backward calling the cheat: refused too
    assert got.status == status and says in got.detail, got.detail


def test_torch_reading_its_own_mode_stack_is_not_refused():
    """torch.get_default_device reads the function-mode stack itself: not the learner reaching."""
    right = solution()["key_block_backward"]

    def asks_torch(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        assert torch.get_default_device().type == "cpu"
        return right(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
    got = rows({"key_block_backward": asks_torch}, "key_block_backward")[0]
    assert got.status == "ok", got.detail


# Review r10 of lab 04, C2: no loop over query blocks; the key block cut in halves so that no tile
# is (query rows x key block) wide, and dV, dK written as (dO^T P)^T, (Q^T dS)^T (10 of 10 rows).
def all_rows_half_key_blocks(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32, width=None):
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    acc = torch.promote_types(q.dtype, torch.float32)
    c2 = (1.0 / math.sqrt(d)) * math.log2(math.e)
    view = lambda t: t.reshape(b, kv, a // kv, s_q, -1).to(acc)
    qg, dog, dl = view(q), view(dout), view(delta[..., None])
    l2 = view(lse[..., None]) * math.log2(math.e)
    i0 = min((j0 // block * block) if causal else 0, s_q)
    dq, dks, dvs, h = torch.zeros_like(qg), [], [], width or max(1, n // 2)
    for c0 in range(0, n, h):
        c1 = min(c0 + h, n)
        kb, vb = k_blk[:, :, c0:c1].to(acc)[:, :, None], v_blk[:, :, c0:c1].to(acc)[:, :, None]
        s2 = qg[..., i0:, :] @ kb.transpose(-1, -2) * c2                  # (s_q - i0) x n/2: all rows
        if causal:
            s2 = s2.masked_fill(torch.arange(j0 + c0, j0 + c1)[None, :] > torch.arange(i0, s_q)[:, None], -math.inf)
        p = torch.exp2(s2 - l2[..., i0:, :])
        do = dog[..., i0:, :]
        dvs.append((do.transpose(-1, -2) @ p).sum(2).transpose(-1, -2))
        ds = p * (do @ vb.transpose(-1, -2) - dl[..., i0:, :]) / math.sqrt(d)
        dks.append((qg[..., i0:, :].transpose(-1, -2) @ ds).sum(2).transpose(-1, -2))
        dq[..., i0:, :] += ds @ kb
    return dq.reshape(q.shape).to(q.dtype), torch.cat(dks, 2).to(k_blk.dtype), torch.cat(dvs, 2).to(v_blk.dtype)


def all_rows_in_a_fifth_dimension(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """All query rows at once with the rows moved out of the last two dimensions: (.., s_q, 1, n)."""
    kk, vv, c = _expanded(q, k_blk, v_blk)
    s = (q[..., :, None, :] @ kk[:, :, None].transpose(-1, -2)) * (c * LOG2E)     # (b, a, s_q, 1, n)
    if causal:
        s = s.masked_fill(torch.arange(j0, j0 + k_blk.shape[2])[None, None, :]
                          > torch.arange(q.shape[2])[:, None, None], -math.inf)
    p = torch.exp2(s - lse[..., None, None] * LOG2E)
    dp = dout[..., :, None, :] @ vv[:, :, None].transpose(-1, -2)
    ds = p * (dp - delta[..., None, None]) * c
    dq = (ds @ kk[:, :, None]).squeeze(-2)
    dk = (ds.transpose(-1, -2) * q[..., :, None, :]).sum(2)
    dv = (p.transpose(-1, -2) * dout[..., :, None, :]).sum(2)
    return dq, _fold(dk, k_blk.shape[1]), _fold(dv, k_blk.shape[1])


def all_rows_key_pieces_of_width_d(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """C2 with the key block cut into pieces as wide as the head dimension (dQ's width)."""
    return all_rows_half_key_blocks(q, k_blk, v_blk, dout, lse, delta, j0, causal, block, width=q.shape[-1])


def all_rows_key_by_key(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """C2 with one key at a time against every query row."""
    return all_rows_half_key_blocks(q, k_blk, v_blk, dout, lse, delta, j0, causal, block, width=1)


@pytest.mark.parametrize("cheat, case, says", [
    (all_rows_half_key_blocks, 0, "a tile of shape (6, 77, 8) made from both Q and K"),
    (all_rows_in_a_fifth_dimension, 0, "a tile of shape (462, 1, 16) made from both Q and K"),
    (all_rows_key_pieces_of_width_d, 1, "a tile of shape (8, 50, 8) made from both Q and K"),   # d 8, block 32
    (all_rows_key_by_key, 0, "a tile of shape (6, 77, 1) made from both Q and K"),
], ids=["r10-C2", "fifth-dim", "width-d", "key-by-key"])
def test_all_query_rows_against_a_narrower_key_tile_fail(cheat, case, says):
    block = labcheck.BACKWARD[case][7]
    tail = f"more than {block} query rows against the key block at once; loop over query blocks of {block} rows"
    got = rows({"key_block_backward": cheat}, "key_block_backward", (case,))[0]
    assert got.status == "wrong" and says in got.detail and tail in got.detail, got.detail
    got = _flash_row(cheat, (case,))
    assert got.status == "wrong" and tail in got.detail, got.detail


_MASKED_RING = '''
def ring_attention(q, k_shards, v_shards, rank, causal=False, block=32):
    parts = []
    for r, (k_r, v_r) in enumerate(zip(k_shards, v_shards)):
        if k_r.shape[2] == 0 or (causal and r > rank):
            continue
        parts.append(tiled_forward(q, k_r, v_r, causal, block, block_q=block))   # every shard masked
    return merge_partials(parts)
'''


def test_every_draw_has_a_ring_case_that_catches_masking_every_visible_shard():
    """Review r10 defect 4: on about 4 % of draws no causal ring case had a non-empty shard before
    its rank, and a ring that masks every shard passed every ring row."""
    def catching(drawn):
        return [(i, c) for i, c in enumerate(drawn["RING"]) if c[6] and any(c[3][:c[4]])]
    assert all(catching(labcases.draw(seed)) for seed in range(1000))
    g = dict(solution()["ring_attention"].__globals__)
    exec(compile(_MASKED_RING, "<masked ring>", "exec"), g)
    for seed in range(2):
        drawn = labcases.draw(seed)
        i, case = catching(drawn)[0]
        report = Report(labcheck.LAB)
        labcheck._ring_rows(report, g["ring_attention"], case, drawn["seeds"][i])
        detail = report.rows[-1].detail
        assert report.rows[-1].status == "wrong" and "out[" in detail, detail
        r = next(r for r in range(case[4]) if case[3][r])                 # the first shard to name
        assert detail.startswith(f"shard {r} (keys 0:{case[3][r]}) lies wholly before rank {case[4]}'s queries, "
                                 f"yet was run with causal=True: what does tiled_forward's top-left mask hide "
                                 f"in it? "), detail
        assert "causal=False" not in detail and "needs the mask" not in detail, detail   # r28: no fix given


_LATER_RING = '''
def ring_attention(q, k_shards, v_shards, rank, causal=False, block=32):
    parts = []
    for r, (k_r, v_r) in enumerate(zip(k_shards, v_shards)):
        if k_r.shape[2] == 0:
            continue
        parts.append(tiled_forward(q, k_r, v_r, causal and r >= rank, block, block_q=block))  # later ones too
    return merge_partials(parts)
'''


def test_review_r37_a_shard_no_query_sees_is_named_before_the_values():
    """Review r37 #3 of lab 04: a ring that ran tiled_forward, masked, on the shards after the rank's
    own (cell 10: a non-empty shard none of your queries sees gets none) read only a wrong element.
    The row now names the first such shard and the rank's query positions, and asks; no fix is given."""
    g = dict(solution()["ring_attention"].__globals__)
    exec(compile(_LATER_RING, "<later ring>", "exec"), g)
    drawn = labcases.draw(0)
    i, case = next((i, c) for i, c in enumerate(drawn["RING"]) if c[6] and any(c[3][c[4] + 1:]))
    report = Report(labcheck.LAB)
    labcheck._ring_rows(report, g["ring_attention"], case, drawn["seeds"][i])
    detail, lengths, rank = report.rows[-1].detail, case[3], case[4]
    r = next(r for r in range(rank + 1, len(lengths)) if lengths[r])
    q0 = sum(lengths[:rank])
    assert report.rows[-1].status == "wrong" and detail.startswith(
        f"tiled_forward ran on shard {r} (keys {sum(lengths[:r])}:{sum(lengths[:r + 1])}), which lies wholly "
        f"after rank {rank}'s queries (positions {q0}:{q0 + lengths[rank]}): which of its keys does a query "
        f"of rank {rank} see? "), detail
    assert "skip" not in detail


def unfolded_then_cleared(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """exp2 without the fold, then the exp2 rule's verdict cleared through a saved getter."""
    got = _key_block(q, k_blk, v_blk, dout, lse, delta, j0, causal, block, lambda j, b: j // b * b, fold=False)
    w = _STACK_AT(torch._C._len_torch_dispatch_stack() - 1)
    for name, value in (("unfolded", ""), ("alone", False), ("tags", {})):
        try:
            setattr(w.exp2, name, value)
        except AttributeError:
            pass
    return got


def unfolded_then_cleared_in_its_dict(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    got = _key_block(q, k_blk, v_blk, dout, lse, delta, j0, causal, block, lambda j, b: j // b * b, fold=False)
    w = _STACK_AT(torch._C._len_torch_dispatch_stack() - 1)
    vars(w.exp2).update(unfolded="", alone=False)
    return got


@pytest.mark.parametrize("cheat, says", [
    (unfolded_then_cleared, "multiplied by log2(e) on its own"),
    (unfolded_then_cleared_in_its_dict, "it rebound the grader's watch (Exp2Rule.alone, Exp2Rule.unfolded)"),
], ids=["setattr", "vars"])
def test_the_exp2_verdict_cannot_be_cleared(cheat, says):
    got = rows({"key_block_backward": cheat}, "key_block_backward")[0]
    assert got.status == "wrong" and says in got.detail, got.detail


def patched_while_graded(module, name, value):
    """A kernel that patches the grader for the length of its call, restored before it returns."""
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        saved = getattr(module, name)
        setattr(module, name, value)
        try:
            return all_rows_half_key_blocks(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
        finally:
            setattr(module, name, saved)
    return kernel


@pytest.mark.parametrize("where, name, value, says", [
    ("labexp2.Exp2Rule", "tile", lambda *a, **k: "", "it patched the grader (Exp2Rule.tile)"),
    ("labexp2", "_flat", lambda xs: iter(()), "it patched the grader (labexp2._flat)"),
    ("labguard.Watch", "_after", lambda *a: None, "it patched the grader (Watch._after)"),
    ("labshape", "shape", lambda *a: None, "it patched the grader (labshape.shape)"),
], ids=["method", "helper", "watch", "shape-rules"])
def test_the_grader_patched_during_the_call_and_restored_is_named(where, name, value, says):
    from gpumem.chapters.ch04_flash_attention import labexp2, labguard
    owner = {"labexp2.Exp2Rule": labexp2.Exp2Rule, "labexp2": labexp2, "labguard.Watch": labguard.Watch,
             "labshape": labshape}[where]
    got = rows({"key_block_backward": patched_while_graded(owner, name, value)}, "key_block_backward")[0]
    assert got.status == "wrong" and says in got.detail, got.detail
    assert getattr(owner, name) is not value                           # restored by the kernel



def test_walking_up_to_the_watch_is_refused():
    """Review r13 #3: a key-block backward that computed a dense column with torch.exp, then walked
    ``sys._getframe(1).f_back`` up to the grader's frame and cleared the watch's verdict in its
    closure, passed all 10 rows of parts 1-2. The learner's call now runs under the labs' audit hook
    (gpumem.course.lab_audit): the first frame it reaches for is refused and named."""
    import sys
    right = solution()["key_block_backward"]

    def walker(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        frame = sys._getframe(1)
        while frame is not None and type(frame.f_locals.get("w")).__name__ != "Watch":
            frame = frame.f_back
        return right(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
    got = rows({"key_block_backward": walker}, "key_block_backward")[0]
    assert got.status != "ok" and "the grader's frames are off" in got.detail and "sys._getframe" in got.detail, got
    assert rows({"key_block_backward": right}, "key_block_backward")[0].status == "ok"


# Review r13 #1, cheat E: Q + 0.0 (bits still Q, form lost, so Q K^T was no "raw" tile), P as
# 1 / (cosh x - sinh x) (= e^x, no op the exp2 rule knew), all query rows at once, the key block in
# halves, no causal skip: 25/25. P's family is now decided by the Q|K bits; exp2 must have taken
# every visible score; any other transcendental op on scores is named.
def _all_rows_hyperbolic(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32, launder=True):
    b, a, s_q, d = q.shape
    kv, n, c = k_blk.shape[1], k_blk.shape[2], d ** -0.5
    view = lambda t: t.reshape(b, kv, a // kv, s_q, -1)
    qg, dog, dl, lg = view(q), view(dout), view(delta[..., None]), view(lse[..., None])
    qg = qg + 0.0 if launder else qg
    dq, dks, dvs, h = torch.zeros_like(qg), [], [], max(1, n // 2)
    for c0 in range(0, n, h):
        kb, vb = k_blk[:, :, c0:c0 + h, None].transpose(2, 3), v_blk[:, :, c0:c0 + h, None].transpose(2, 3)
        s = qg @ kb.transpose(-1, -2) * c
        if causal:
            s = s.masked_fill(torch.arange(j0 + c0, j0 + c0 + kb.shape[-2])[None, :] > torch.arange(s_q)[:, None],
                              -math.inf)
        x = s - lg
        p = 1.0 / (torch.cosh(x) - torch.sinh(x))
        dvs.append((dog.transpose(-1, -2) @ p).sum(2).transpose(-1, -2))
        ds = p * (dog @ vb.transpose(-1, -2) - dl) * c
        dks.append((qg.transpose(-1, -2) @ ds).sum(2).transpose(-1, -2))
        dq = dq + ds @ kb
    return dq.reshape(q.shape), torch.cat(dks, 2), torch.cat(dvs, 2)


def hyperbolic_laundered(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    return _all_rows_hyperbolic(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)


def hyperbolic_plain_q(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    return _all_rows_hyperbolic(q, k_blk, v_blk, dout, lse, delta, j0, causal, block, launder=False)


def _tiled(exp, taint=False):
    """The right tiles, loop and skip, with P = exp(S c - lse) taken by ``exp(s2, lse2)`` (base 2);
    ``taint``: dO made "from Q" by adding 0.0 * Q (review r28)."""
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        b, a, s_q, d = q.shape
        kv, n, c = k_blk.shape[1], k_blk.shape[2], d ** -0.5
        kk, vv = (t.repeat_interleave(a // kv, 1) for t in (k_blk, v_blk))
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(kk), torch.zeros_like(vv)
        for i0 in range(j0 // block * block if causal else 0, s_q, block):
            i1 = min(i0 + block, s_q)
            qt, dot = q[:, :, i0:i1], dout[:, :, i0:i1]
            dot = dot + 0.0 * qt if taint else dot
            s2 = _masked(qt @ kk.transpose(-1, -2) * (c * LOG2E), causal, i0, j0)
            p = exp(s2, lse[:, :, i0:i1, None] * LOG2E)
            dv += p.transpose(-1, -2) @ dot
            ds = p * (dot @ vv.transpose(-1, -2) - delta[:, :, i0:i1, None]) * c
            dk += ds.transpose(-1, -2) @ qt
            dq[:, :, i0:i1] = ds @ kk
        return dq, _fold(dk, kv), _fold(dv, kv)
    return kernel


def _series(x):
    """e^x without exp: a Taylor polynomial of x / 1024 (error ~1e-25), exact to ~1e-13 after 10 squarings."""
    y, t = x / 1024, 1.0
    for m in range(12, 0, -1):
        t = 1 + y / m * t
    return t


def _squared(s2, lse2):
    x = s2 / LOG2E - lse2 / LOG2E
    t = _series(x)
    for _ in range(10):
        t = t * t
    return torch.where(x == -math.inf, 0.0, t)


def _powered(s2, lse2):
    x = s2 / LOG2E - lse2 / LOG2E
    return torch.where(x == -math.inf, 0.0, torch.pow(_series(x), 1024))


def _glu_rows(s2, l2):
    """Review r24's P: a decoy exp2, then e^x = sigma(x) / sigma(-x) through glu, one query row at a time."""
    torch.exp2(s2 - l2)
    x, rows_ = (s2 - l2) / LOG2E, []
    for r in range(x.shape[-2]):
        xr = x[..., r, :]
        one = torch.ones_like(xr)
        rows_.append(F.glu(torch.stack([one, xr], -1), -1)[..., 0] / F.glu(torch.stack([one, -xr], -1), -1)[..., 0])
    return torch.stack(rows_, -2)


def _matrix_exp(s2, lse2):
    """Review r27's P: e^x as the exponential of a 1 x 1 matrix (``linalg.matrix_exp``)."""
    x = s2 / LOG2E - lse2 / LOG2E
    return torch.where(x == -math.inf, 0.0, torch.linalg.matrix_exp(x.clamp_min(-1e4)[..., None, None])[..., 0, 0])


_UNUSED = "a product (P^T dO, dS K or dS^T Q) took a tile of shape"


def _visible_of_first_key_block(case) -> int:
    """Heads x query rows x keys of block 0 each sees, counted by hand (top-left causal: i sees j <= i)."""
    b, a, kv, sq, sk, d, causal, block = case
    n = min(block, sk)
    return b * a * sum(min(i + 1, n) if causal else n for i in range(sq))


@pytest.mark.parametrize("cheat, says", [
    (hyperbolic_laundered, "made from both Q and K (scores, P, dP - D or dS) is larger than one 16 x 16 tile"),
    (hyperbolic_plain_q, "made from both Q and K (scores, P, dP - D or dS) is larger than one 16 x 16 tile"),
    (_tiled(lambda s2, l2: 1.0 / (torch.cosh((s2 - l2) / LOG2E) - torch.sinh((s2 - l2) / LOG2E))),
     "cosh on scores (numbers made from both Q and K): only exp2 may exponentiate"),
    (_tiled(_powered), "pow(x, 1024) on scores"),
    (_tiled(_squared), "it took exp2 of 0 distinct scores, fewer than the {:,} visible scores of the call"),
    # review r24: a decoy exp2 thrown away, P from elu's backward (e^x for x <= 0) or glu (sigma(x) / sigma(-x))
    (_tiled(lambda s2, l2: (torch.exp2(s2 - l2), torch.ops.aten.elu_backward(
        torch.ones_like(s2), 1.0, 1, 1.0, False, (s2 - l2) / LOG2E))[1]),
     "elu_backward on scores (numbers made from both Q and K): only exp2 may exponentiate"),
    (_tiled(_glu_rows), "glu on scores (numbers made from both Q and K): only exp2 may exponentiate"),
    # review r27: a decoy exp2 thrown away, P from linalg.matrix_exp of 1 x 1 matrices or a series
    (_tiled(lambda s2, l2: (torch.exp2(s2 - l2), _matrix_exp(s2, l2))[1]), _UNUSED),
    (_tiled(lambda s2, l2: (torch.exp2(s2 - l2), _squared(s2, l2))[1]), _UNUSED),
    # review r28: the same with dO made "from Q" (dO + 0.0 * Q), so P^T dO met no tensor made from neither
    (_tiled(lambda s2, l2: (torch.exp2(s2 - l2), _squared(s2, l2))[1], taint=True), _UNUSED),
], ids=["E", "E-plain-q", "cosh-in-tiles", "pow-series", "squarings", "elu-backward", "glu", "matrix-exp", "decoy-series",
        "decoy-series-taint"])
def test_an_exponential_that_is_not_exp2_or_a_laundered_q_fails(cheat, says):
    says = says.format(_visible_of_first_key_block(labcheck.BACKWARD[0]))
    got = rows({"key_block_backward": cheat}, "key_block_backward")[0]
    assert got.status == "wrong" and says in got.detail, got.detail
    got = _flash_row(cheat)
    assert got.status == "wrong", got.detail


def test_pow_of_two_is_exp2():
    """pow(2.0, x) with a Python base IS exp2 (torch computes 2^x; FA-2's point is the folded
    multiply-add before it, which the rule checks): it passes, folded; unfolded it fails."""
    folded = _tiled(lambda s2, l2: torch.pow(2.0, s2 - l2))
    assert all(r.status == "ok" for r in rows({"key_block_backward": folded}, "key_block_backward", (0, 1)))
    unfolded = _tiled(lambda s2, l2: torch.pow(2.0, (s2 / LOG2E - l2 / LOG2E) * LOG2E))
    got = rows({"key_block_backward": unfolded}, "key_block_backward")[0]
    assert got.status == "wrong" and "log2(e) on its own" in got.detail, got.detail


# Review r13 #2, cheat A: the `dispatch` cell of the watch's __torch_dispatch__ (a closure) swapped
# for a pass-through during the call and restored (25/25); the class attribute swapped the same way.
def _through(labguard):
    def through(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.numel():
                self.made.add(labguard._ptr(t))
        return out
    return through


def dispatch_cell_swapped(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    g = sys.modules["gpumem.chapters.ch04_flash_attention.labguard"]
    cells = dict(zip(g._DISPATCH.__code__.co_freevars, g._DISPATCH.__closure__))    # r13's A, as written
    saved = cells["dispatch"].cell_contents
    cells["dispatch"].cell_contents = _through(g)
    try:
        return _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal)
    finally:
        cells["dispatch"].cell_contents = saved


def dispatch_class_swapped(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    g = sys.modules["gpumem.chapters.ch04_flash_attention.labguard"]
    saved = vars(g.Watch)["__torch_dispatch__"]
    type.__setattr__(g.Watch, "__torch_dispatch__", _through(g))
    try:
        return _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal)
    finally:
        type.__setattr__(g.Watch, "__torch_dispatch__", saved)


def getter_read_from_the_stand_in(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """The real mode getter read out of the fence's stand-in (its closure before r13, its code's
    constants now), the watch had from it and its verdict and marks cleared in place."""
    import torch.utils._python_dispatch as pd
    stand_in = pd._get_current_dispatch_mode
    inner = [c.cell_contents for c in stand_in.__closure__] if stand_in.__closure__ else [
        x.__next__() for c in stand_in.__code__.co_consts if isinstance(c, tuple) for x in c if hasattr(x, "__next__")]
    real = next(f for f in inner if getattr(f, "__name__", "") == "_get_current_dispatch_mode")
    w, got = real(), _dense_column(q, k_blk, v_blk, dout, lse, delta, j0, causal)
    w.read.__closure__[0].cell_contents.update(broken="", exps=0)
    w.exp2.seen.__self__.update(plain="", unfolded="", alone=False)
    w.exp2.tiles.clear()
    return got


@pytest.mark.parametrize("cheat, says", [
    (dispatch_cell_swapped, "it read the code of the grader's _torch_dispatch while lab 04 was graded"),
    # the patch is named, or (after other tests in the same process: the full file in make test) the
    # watch still counted the call and names its missing exp2 first; refused either way
    (dispatch_class_swapped, ("it patched the grader (Watch.__torch_dispatch__) while lab 04 was graded",
                              "it took exp2 of 0 distinct scores")),
    (getter_read_from_the_stand_in, "it read the code of the grader's _refuse while lab 04 was graded"),
], ids=["r13-A", "class", "fence-code"])
def test_the_dispatch_swapped_during_the_call_is_named(cheat, says):
    from gpumem.chapters.ch04_flash_attention import labguard
    got = rows({"key_block_backward": cheat}, "key_block_backward")[0]
    says = (says,) if isinstance(says, str) else says
    assert got.status != "ok" and any(x in got.detail for x in says), got.detail
    assert labguard._DISPATCH.__closure__ is None and vars(labguard.Watch)["__torch_dispatch__"] is labguard._DISPATCH


# Review r15 of lab 04. Cheat F: a decoy (ONE genuine folded tile, exp2 of it ceil(need / tile)
# times, thrown away) met the count of exp2'd numbers; K rebuilt bit for bit through index_select's
# INDEX (nibble look-ups in arange(16)), whose bits the rule took from the table alone, so the dense
# cosh - sinh kernel on every query row made no "scores": 6/6 flash_backward rows in a real kernel.
# Cheat G: no launder, labops._SAME given bmm and mm for the length of the call (25/25).
def _decoy(q, k_blk, j0, causal, block):
    """F's decoy: the last query rows against the key block, folded, exp2'd until as many numbers
    as the call's visible scores (counted here by hand: top-left causal, row i sees key j <= i)."""
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    need = b * a * sum(max(0, min(j0 + n, i + 1) - j0) if causal else n for i in range(s_q))
    if need:
        r = min(block, s_q)
        qt = q[:, :, s_q - r:].reshape(b, kv, a // kv, r, d)
        tile = (qt @ k_blk[:, :, None].transpose(-1, -2)) * (d ** -0.5 * LOG2E)
        for _ in range(-(-need // tile.numel())):
            torch.exp2(tile)


def _nibbles(k):
    """K rebuilt exactly from its integer view, 4 bits at a time, as index_select(arange(16), 0, nibble)."""
    it = torch.int64 if k.dtype == torch.float64 else torch.int32
    iv, lut = k.contiguous().view(it), torch.arange(16, dtype=it)
    kl = torch.zeros(iv.shape, dtype=it)          # (zeros_like would inherit K's bits)
    for i in range(iv.element_size() * 2):
        nib = ((iv >> (4 * i)) & 15).reshape(-1).long()
        kl = kl | (torch.index_select(lut, 0, nib).reshape(iv.shape) << (4 * i))
    return kl.view(k.dtype)


def _bitwise_where(k):
    """K rebuilt exactly as a sum of torch.where(bit i of K, 2^i, 0): the bits sit in the condition."""
    it = torch.int64 if k.dtype == torch.float64 else torch.int32
    iv, zero = k.contiguous().view(it), torch.zeros((), dtype=it)
    kl = torch.zeros(iv.shape, dtype=it)
    for i in range(iv.element_size() * 8):
        kl = kl | torch.where(((iv >> i) & 1).bool(), torch.ones((), dtype=it) << i, zero)
    return kl.view(k.dtype)


def cheat_f(launder):
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        _decoy(q, k_blk, j0, causal, block)
        kc = launder(k_blk)
        assert torch.equal(kc, k_blk)
        return _all_rows_hyperbolic(q, kc, v_blk, dout, lse, delta, j0, causal, block, launder=False)
    return kernel


def cheat_g(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    from gpumem.chapters.ch04_flash_attention import labops
    _decoy(q, k_blk, j0, causal, block)
    added = {"bmm", "mm"} - labops._SAME
    try:
        labops._SAME.update(added)                 # frozen: AttributeError, and the kernel goes on
    except AttributeError:
        added = set()
    try:
        return _all_rows_hyperbolic(q, k_blk, v_blk, dout, lse, delta, j0, causal, block, launder=False)
    finally:
        if added:
            labops._SAME.difference_update(added)


@pytest.mark.parametrize("cheat", [cheat_f(_nibbles), cheat_f(_bitwise_where), cheat_g],
                         ids=["F-index_select", "F-where", "G-tables"])
def test_k_laundered_or_the_tables_mutated_during_the_call_fails(cheat):
    from gpumem.chapters.ch04_flash_attention import labops
    same = set(labops._SAME)
    says = "made from both Q and K (scores, P, dP - D or dS) is larger than one 16 x 16 tile"
    got = rows({"key_block_backward": cheat}, "key_block_backward")[0]
    assert got.status == "wrong" and says in got.detail, got.detail
    got = _flash_row(cheat)
    assert got.status == "wrong" and "made from both Q and K" in got.detail, got.detail
    assert set(labops._SAME) == same


def test_the_graders_op_tables_cannot_change():
    """Review r15 #2: every table the watch reads at an op is a frozenset (rebinding one is named by
    labseal.intact); the guards' tables of code objects are copied when the call starts."""
    from gpumem.chapters.ch04_flash_attention import labexp2, labguard, labops
    tables = [(labops, n) for n in ("_SAME", "_MM", "_ADD", "_REDUCE", "_MASK", "_OTHER")] + [(labexp2, "_PLAIN")] \
        + [(labguard, n) for n in ("_EXPS", "_COPIES", "_EXITS", "_FRESH", "_READS", "_PRINTS")]
    for module, name in tables:
        with pytest.raises(AttributeError):
            getattr(module, name).add("bmm")


@pytest.mark.parametrize("fresh", [False, True], ids=["one-tile-again", "fresh-copies"])
def test_exp2_of_one_tile_again_and_again_does_not_meet_the_count(fresh):
    """The right tiles with P by squarings of a series (no exp2: the 'squarings' cheat above) behind
    F's decoy: the decoy's tile counts once, and so do fresh copies of it (tile - 0.0 each time):
    exp2 counts the numbers of each Q K^T product once, however many tiles were made from it."""
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        b, a, s_q, d = q.shape
        kv, r = k_blk.shape[1], min(block, q.shape[2])
        tile = (q[:, :, s_q - r:].reshape(b, kv, a // kv, r, d) @ k_blk[:, :, None].transpose(-1, -2)) \
            * (d ** -0.5 * LOG2E)
        for _ in range(-(-_visible_of_first_key_block(labcheck.BACKWARD[0]) // tile.numel()) + 1):
            torch.exp2(tile - 0.0 if fresh else tile)
        return _tiled(_squared)(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
    b, a, kv, sq, sk, d, causal, block = labcheck.BACKWARD[0]
    tile = b * a * min(block, sq) * min(block, sk)                     # the decoy's numbers, by hand
    need = _visible_of_first_key_block(labcheck.BACKWARD[0])
    says = f"it took exp2 of {tile:,} distinct scores, fewer than the {need:,} visible scores of the call"
    got = rows({"key_block_backward": kernel}, "key_block_backward")[0]
    assert got.status == "wrong" and says in got.detail, got.detail


# Review r16 #2, cheat H2 (25/25 in a real kernel): F's decoy with the tile's PRODUCT made again each
# time (so each repetition was a new product for the exp2 count), K read out element by element
# through format(t, '.17e') (Tensor.__format__ was no counted read: its .item() ran with the function
# mode popped) and rebuilt from Python floats, d numbers per torch.tensor; then the dense cosh - sinh
# kernel on every query row. Now every route to a Python number ends in _local_scalar_dense, counted
# by the dispatch watch (a handful of numbers made from Q or K at most), printing a tensor is refused,
# and exp2 is counted over distinct visible (query row, key, head) scores.
def _recomputed_decoy(q, k_blk, j0, causal, block):
    """H2's decoy: the last query rows' product with the key block made afresh and exp2'd, until as
    many numbers as the call's visible scores (counted here by hand) were exponentiated."""
    b, a, s_q, d = q.shape
    kv, n, r = k_blk.shape[1], k_blk.shape[2], min(block, s_q)
    need = b * a * sum(max(0, min(j0 + n, i + 1) - j0) if causal else n for i in range(s_q))
    done = 0
    while done < need:
        qt = q[:, :, s_q - r:].reshape(b, kv, a // kv, r, d)
        t = (qt @ k_blk[:, :, None].transpose(-1, -2)) * (d ** -0.5 * LOG2E)
        torch.exp2(t)
        done += t.numel()


def _formatted(k):
    """K rebuilt from Python floats read through format(0-dim tensor, '.17e'), d numbers per tensor."""
    d, flat = k.shape[-1], k.reshape(-1)
    vals = [float(f"{flat[e]:.17e}") for e in range(flat.numel())]
    rows_ = [torch.tensor(vals[i:i + d], dtype=k.dtype) for i in range(0, len(vals), d)]
    return torch.stack(rows_).reshape(k.shape)


def _itemised(k):
    """The same with .item() (the 1,000-read budget once let 1,000 numbers of K through)."""
    d, flat = k.shape[-1], k.reshape(-1)
    vals = [flat[e].item() for e in range(flat.numel())]
    return torch.stack([torch.tensor(vals[i:i + d], dtype=k.dtype) for i in range(0, len(vals), d)]).reshape(k.shape)


def cheat_h2(launder):
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        _recomputed_decoy(q, k_blk, j0, causal, block)
        kc = launder(k_blk)
        return _all_rows_hyperbolic(q, kc, v_blk, dout, lse, delta, j0, causal, block, launder=False)
    return kernel


def test_h2_outside_the_grader_gets_the_right_numbers():
    """Without the watch, H2's laundered K is K bit for bit and its answer is the reference's: the
    rows below fail on the rules, not on the values."""
    case = labcheck.BACKWARD[0]
    q, k, v, dout, mask = labcheck._backward_inputs(case, 100)
    out, lse = labref.dense(q, k, v, mask)
    delta = (dout * out).sum(-1)
    kb, vb = k[:, :, :case[7]], v[:, :, :case[7]]
    assert torch.equal(_formatted(kb), kb) and torch.equal(_itemised(kb), kb)
    got = cheat_h2(_formatted)(q, kb, vb, dout, lse, delta, 0, case[6], case[7])
    for g, w in zip(got, labref.key_block(q, k, v, dout, mask, 0, case[7])):
        assert torch.allclose(g, w, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("launder, says", [
    (_formatted, "it printed or formatted a tensor (Tensor.__format__)"),
    (_itemised, "numbers made from Q or K into Python (Tensor.item, float, int or bool), more than 8"),
], ids=["H2-format", "H2-item"])
def test_h2_k_read_into_python_is_refused(launder, says):
    """Refused either way it reads K out; in make test's full file (other tests before it in the
    process) the format route can meet the read count first, which names the reads instead."""
    either = (says, "numbers made from Q or K into Python")
    got = rows({"key_block_backward": cheat_h2(launder)}, "key_block_backward")[0]
    assert got.status in ("wrong", "error") and any(s in got.detail for s in either), got.detail  # it raised
    ns = solution()
    flash = types.FunctionType(ns["flash_backward"].__code__, {**ns["flash_backward"].__globals__,
                                                               "key_block_backward": cheat_h2(launder)})
    got = rows({"flash_backward": flash, "key_block_backward": cheat_h2(launder)}, "flash_backward")[0]
    assert got.status in ("wrong", "error") and any(s in got.detail for s in either), got.detail


def test_exp2_of_a_tile_whose_product_is_made_again_counts_once():
    """H2's decoy without its launder, before the right tiles with P by squarings (no exp2): the
    decoy's product, made afresh each time, covers the last block of query rows once."""
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        _recomputed_decoy(q, k_blk, j0, causal, block)
        return _tiled(_squared)(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
    b, a, kv, sq, sk, d, causal, block = labcheck.BACKWARD[0]
    tile = b * a * min(block, sq) * min(block, sk)      # rows 61..76 see all of keys 0..15: all visible
    need = _visible_of_first_key_block(labcheck.BACKWARD[0])
    says = f"it took exp2 of {tile:,} distinct scores, fewer than the {need:,} visible scores of the call"
    got = rows({"key_block_backward": kernel}, "key_block_backward")[0]
    assert got.status == "wrong" and says in got.detail, got.detail


def _print_a_tile(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    print(q[:, :1, :2] @ k_blk[:, :1, :2].transpose(-1, -2))
    return _tiled(lambda s2, l2: torch.exp2(s2 - l2))(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)


def _a_few_reads(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    assert math.isfinite(float(k_blk[0, 0, 0, 0])) and bool((q[0, 0, 0] == q[0, 0, 0]).all())
    assert len(lse[0, 0, :3].tolist()) == 3 and all(int(x >= -1e9) for x in delta[0, 0, :5])
    return _tiled(lambda s2, l2: torch.exp2(s2 - l2))(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)


def test_printing_is_named_and_a_handful_of_reads_passes():
    """Printing a tile fails the case. Alone the row names the print; in make test's full file (other
    tests before it) torch's repr reaches the watch's switch first and the row names that (noted in
    the closing note of 2026-12-05 as a message to make order-proof)."""
    got = rows({"key_block_backward": _print_a_tile}, "key_block_backward")[0]
    assert got.status in ("wrong", "error") and (
        ("it printed or formatted a tensor (Tensor.__repr__)" in got.detail and "print in a cell of your own" in got.detail)
        or "it switched the grader's watch off" in got.detail), got.detail
    assert all(r.status == "ok" for r in rows({"key_block_backward": _a_few_reads}, "key_block_backward", (0, 1)))


def _liar(t):
    """Review r20: a tensor subclass made with ``type(...)`` inside the call, whose
    ``__torch_function__`` says True to ``.all()`` and 0.0 to ``float()``: zero gradients and a wrong
    merge graded 25/25 through the grader's own comparisons."""
    def lie(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "all":
            return True
        if name == "__float__":
            return 0.0
        ret = torch.Tensor.__torch_function__(func, (torch.Tensor,), args, kwargs or {})
        return ret.as_subclass(cls) if isinstance(ret, torch.Tensor) else ret
    return t.as_subclass(type("Liar", (torch.Tensor,), {"__torch_function__": classmethod(lie)}))


def merge_first_shard_as_a_liar(parts):
    return _liar(parts[0][0] * 1.0), _liar(parts[0][1] * 1.0)


def test_a_tensor_subclass_that_lies_to_the_comparisons_is_refused():
    """The liar's merge (first shard only) fails its first case, the row naming the subclass; a
    plain tensor of the same values fails as wrong (so the refusal, not luck, stops the liar)."""
    got = rows({"merge_partials": merge_first_shard_as_a_liar}, "merge_partials", (0,))[0]
    assert got.status in ("wrong", "error") and "a subclass of torch.Tensor" in got.detail, got.detail
    plain_ = rows({"merge_partials": lambda parts: (parts[0][0] * 1.0, parts[0][1] * 1.0)}, "merge_partials", (0,))[0]
    assert plain_.status == "wrong" and "subclass" not in plain_.detail, plain_.detail


PER_HEAD = '''
def key_block_backward(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    g = a // kv
    c = math.log2(math.e) / math.sqrt(d)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k_blk), torch.zeros_like(v_blk)
    first = j0 // block * block if causal else 0
    for h in range(a):
        kh, vh = k_blk[:, h // g:h // g + 1], v_blk[:, h // g:h // g + 1]
        for i0 in range(first, s_q, block):
            i1 = min(s_q, i0 + block)
            qi, doi = q[:, h:h + 1, i0:i1], dout[:, h:h + 1, i0:i1]
            x = qi @ kh.transpose(-1, -2) * c - lse[:, h:h + 1, i0:i1, None] * math.log2(math.e)
            if causal:
                x = x.masked_fill(torch.arange(j0, j0 + n)[None, :] > torch.arange(i0, i1)[:, None], -math.inf)
            p = torch.exp2(x)
            dv[:, h // g:h // g + 1] += p.transpose(-1, -2) @ doi
            ds = p * (doi @ vh.transpose(-1, -2) - delta[:, h:h + 1, i0:i1, None]) / math.sqrt(d)
            dq[:, h:h + 1, i0:i1] = ds @ kh
            dk[:, h // g:h // g + 1] += ds.transpose(-1, -2) @ qi
    return dq, dk, dv
'''


def test_a_per_head_loop_with_a_one_row_block_passes():
    """Review r22: an honest kernel looping over heads, then query blocks, was refused as "a tile
    of shape (1, 1, 97, 20)": its last query block has one row (97 = 4 x 24 + 1), whose dQ write
    (1, 1, 1, 20) lost its row among the leading ones and was taken for a tile, and so was dQ."""
    ns = {"math": math, "torch": torch, "__name__": "learner"}
    exec(compile(PER_HEAD, "<lab04_online_softmax.ipynb cell 3>", "exec"), ns)
    report = Report(labcheck.LAB)
    labcheck._key_blocks_rows(report, ns["key_block_backward"], (1, 6, 2, 97, 110, 20, True, 24), 5)
    assert [r.status for r in report.rows] == ["ok"] * len(report.rows), report.summary()


def test_a_nan_where_a_number_is_expected_says_where_nans_come_from():
    """Review r22: a merge with no guard for rows that see no key got only "got nan, expected 0"."""
    want = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    said = labref.first_wrong("out", torch.tensor([[float("nan"), 1.0]], dtype=torch.float64), want)
    assert said.startswith("out[0, 0]: got nan, expected 0") and "an lse of -inf" in said
    assert "lse of -inf" not in labref.first_wrong("out", torch.tensor([[0.5, 1.0]], dtype=torch.float64), want)


# ---- review r22: dQ's partial sums in fp32, hints for three slips, the library's pair count ----

def _with_kernel(kernel):
    """The solution's flash_backward calling ``kernel`` as its key_block_backward."""
    ns = solution()
    return types.FunctionType(ns["flash_backward"].__code__, {**ns["flash_backward"].__globals__,
                                                              "key_block_backward": kernel})


def test_dq_part_returned_in_bf16_fails_the_bf16_case():
    """r22 #3: the old contract (each output in its input's dtype) rounded every key block's dq_part
    to bf16 before the fp32 sum; FlashAttention-2 adds the fp32 share into dq_accum (fp32)."""
    right = solution()["key_block_backward"]

    def bf16_part(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        dq, dk, dv = right(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
        return dq.to(q.dtype), dk, dv
    report = Report(labcheck.LAB)
    labcheck._flash_rows(report, _with_kernel(bf16_part), labcheck.BF16_DQ, 106, inner=bf16_part)
    got = report.rows[0]
    assert got.status == "wrong" and got.detail.startswith(
        "key_block_backward returned dq_part in bfloat16: dQ's partial sums stay in fp32"), got.detail


@pytest.mark.parametrize("case", ["BF16", "BF16_DQ"])
def test_dq_part_rounded_through_bf16_fails_on_its_numbers(case):
    """A dq_part rounded to bf16 and handed back in fp32 (its dtype right) fails on dq's numbers:
    measured against the exact dQ rounded once to bf16, the fp32 route is off by at most 5e-5 of the
    norm, the rounded one by 0.0025 or more (labbf16's table), either side of 2^-11. Judged here
    outside the grader's watch, which the test above goes through."""
    from gpumem.chapters.ch04_flash_attention import labbf16
    kernel = solution()["key_block_backward"]
    (q, k, v, dout, out, lse), _ = labcheck._flash_case(getattr(labcheck, case), 103)
    block, delta = labcheck.BF16[7], (dout.float() * out.float()).sum(-1)
    parts = [(j0, kernel(q, k[:, :, j0:j0 + block], v[:, :, j0:j0 + block], dout, lse, delta, j0, False, block))
             for j0 in range(0, k.shape[2], block)]
    want = labref.kernel_grads(q, k, v, dout, out, lse)
    dk, dv = (torch.cat([p[i] for _, p in parts], 2) for i in (1, 2))
    for rounded in (False, True):
        calls = [(j0, ((p[0].bfloat16().float() if rounded else p[0]), p[1], p[2])) for j0, p in parts]
        dq = sum(p[0] for _, p in calls).bfloat16()
        got = labbf16.wrong((dq, dk, dv), want, calls)
        if rounded:
            assert got.startswith("dq: relative error 0.00") and "dQ's partial sums stay in fp32" in got, got
        else:
            assert got == "", got


def _lse_base(factor):
    """exp2 of the folded score tile minus the lse times ``factor`` (log2 e is right)."""
    return lambda qt, kk, l, c, causal, i0, j0: _masked(qt @ kk.transpose(-1, -2) * (c * LOG2E), causal, i0, j0) \
        - l * factor


@pytest.mark.parametrize("factor, alpha, says", [
    (1.0, "0.6931", "your exponent and your lse are in different bases"),
    (LOG2E * LOG2E, "1.4427", "the lse was taken to base 2 twice (log2 e once too often)"),
    (1 / LOG2E, "0.4805", "the lse was divided by log2 e where it should be multiplied"),
], ids=["base-e", "twice", "divided"])
def test_an_lse_in_the_wrong_base_is_named_and_dv_first(factor, alpha, says):
    """r22 #6: exp2(S c log2e - f lse) = exp(S c - f ln2 lse): f = 1 gives alpha = ln 2 = 0.6931,
    f = log2e^2 gives log2 e = 1.4427, f = 1/log2e gives (ln 2)^2 = 0.4805 (by hand). dv = P^T dO
    depends on P alone, so it is the element named; before, dq_part's first element was. r28: the
    base-e slip is named without its fix (cell 2 asks what the lse must become)."""
    got = rows({"key_block_backward": _exp2_kernel(_lse_base(factor))}, "key_block_backward")[0]
    assert "multiply it by log2 e" not in got.detail, got.detail
    assert got.status == "wrong" and got.detail.startswith(
        f"key block 0:16: these are the gradients of P = exp(S - {alpha} lse), not exp(S - lse): {says}. dv_blk["), \
        got.detail
    if factor == 1.0:                                # the outer loop names it too (case 1: not causal)
        kernel = _exp2_kernel(_lse_base(factor))
        got = rows({"flash_backward": _with_kernel(kernel), "key_block_backward": kernel}, "flash_backward", (1,))[0]
        assert got.status == "wrong" and got.detail.startswith(
            f"these are the gradients of P = exp(S - 0.6931 lse), not exp(S - lse): {says}. dv["), got.detail


# _MASKED_RING's ring with only the rank's own shard masked, causal or not
_OWN_SHARD_MASKED = _MASKED_RING.replace("tiled_forward(q, k_r, v_r, causal,", "tiled_forward(q, k_r, v_r, r == rank,")
assert _OWN_SHARD_MASKED != _MASKED_RING


def test_the_own_shard_masked_in_a_ring_that_is_not_causal_is_named():
    """r22: RING case 1 is not causal, shards 19/0/37/26, rank 2: shard 2 holds keys 19:56 (by hand)."""
    g = dict(solution()["ring_attention"].__globals__)
    exec(compile(_OWN_SHARD_MASKED, "<own shard masked>", "exec"), g)
    got = rows({"ring_attention": g["ring_attention"]}, "ring_attention", (1,))[0]
    assert got.status == "wrong" and got.detail.startswith(
        "shard 2 (keys 19:56, rank 2's own) was run with causal=True, but this ring is not causal"), got.detail


def test_part_5_from_the_librarys_pair_count_is_refused():
    """r22's weak shortcut: exp_counts from attention_flops.visible_pairs, chunk c's queries as the
    triangle of (c + 1) n minus that of c n, passed. Refused now, called through the module, through
    a reference saved before grading, rebuilt on its code, or through attention_flops(), which calls
    it; restored after: visible_pairs(4, 4, True) = 1 + 2 + 3 + 4 = 10."""
    from gpumem.memory import attention_flops
    saved = attention_flops.visible_pairs
    rebuilt = types.FunctionType(saved.__code__, vars(attention_flops), "rebuilt", saved.__defaults__)

    def counts(pairs):
        def exp_counts(owner, n):
            out = [0] * (len(owner) // 2)
            for c, r in enumerate(owner):
                out[r] += pairs((c + 1) * n, (c + 1) * n, True) - (pairs(c * n, c * n, True) if c else 0)
            return out
        return exp_counts
    by_flops = lambda s_q, s_k, causal: attention_flops.attention_flops("tiled", s_q, 1, 1, causal=causal,
                                                                        block=1)["forward"] // 4 if s_q else 0
    for pairs in (lambda *a: attention_flops.visible_pairs(*a), saved, rebuilt, by_flops):
        got = _zig("exp_counts", counts(pairs), (3, 5, "contiguous"))
        assert got.status == "error" and "attention_flops.visible_pairs is the library's count of causal pairs, " \
            "off while lab 04's part 5 is graded" in got.detail, got.detail
    assert attention_flops.visible_pairs(4, 4, True) == 10
    assert counts(saved)([0, 0, 1, 1], 2) == [(1 + 2) + (3 + 4), (5 + 6) + (7 + 8)]   # rows 0..7 see i + 1 keys


@pytest.mark.parametrize("kernel, function, case", [
    ("lab04_r23_per_head", "key_block_backward", (2, 2, 2, 81, 60, 20, False, 16)),     # seed 30's
    ("lab04_r23_einsum", "flash_backward", (1, 1, 1, 97, 90, 8, False, 32)),            # seed 1's
    ("lab04_r23_einsum", "key_block_backward", (1, 6, 3, 49, 59, 20, True, 16)),         # d over the block
])
def test_review_r23_honest_per_head_and_einsum_kernels_pass(kernel, function, case):
    """Review r23: an honest kernel that loops over heads (dq[:, h, i0:i1] += ..., no head axis in the
    view) was refused on 14 % of checks ("a tile of shape (2, 81, 20)": the heads were folded into
    d), and one written with einsum on 19 % (a one-row block contracts by a broadcast mul ending in 1;
    with d over the block, (keys, d, 1) was taken for a wide tile). Both pass the cases that refused
    them, graded as check() grades them."""
    path = ROOT / "tests" / "data" / f"{kernel}.py"
    ns = dict(solution())
    exec(compile(path.read_text(), str(path), "exec"), ns)
    report = Report(labcheck.LAB)
    grade = labcheck._key_blocks_rows if function == "key_block_backward" else labcheck._flash_rows
    extra = {"inner": ns["key_block_backward"]} if function == "flash_backward" else {}
    grade(report, ns[function], case, 100, **extra)
    assert report.rows and all(r.status == "ok" for r in report.rows), report.rows[:2]


# Review r28's open route: the product rule checked matmuls only. A decoy exp2 thrown
# away, P from a series (r27's "decoy-series"), and every product written without a matmul: a
# broadcast multiply by one column of dO, Q or K, then a sum over the query (or key) axis (or dV as
# rank-one updates, or rows of P scaled and added up). No matmul took a tile, so the forbidden P
# reached dV, dK and dQ, and the rows passed (status ok) before labproducts.
_BY = {"mul": lambda x, y: x * y, "div": lambda x, y: x / (1.0 / y),       # review r31: no mul at all
       "addcmul": lambda x, y: torch.addcmul(torch.zeros((), dtype=x.dtype), x, y),
       "lerp": lambda x, y: torch.lerp(torch.zeros((), dtype=x.dtype), y, x)}


def _summed(dv_by="columns", mul_by="mul", p_by=None):
    """The solution's key_block_backward with P from ``_squared`` (after a decoy exp2) and P^T dO,
    dS^T Q and dS K each a broadcast multiply and a sum, one column of d at a time; ``dv_by``: dV so
    ("columns"), as rank-one updates P[r, :, None] * dO[r, None, :] ("outer"), or as rows of P
    scaled by one number of dO each and added up ("rows")."""
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        b, a, s_q, d = q.shape
        kv, n = k_blk.shape[1], k_blk.shape[2]
        scale = 1.0 / math.sqrt(d)
        view = lambda t: t.reshape(b, kv, a // kv, s_q, -1)
        qg, dog, delta_g = view(q), view(dout), view(delta[..., None])
        lse2 = view(lse[..., None]) * LOG2E
        kb, vb = k_blk[:, :, None], v_blk[:, :, None]
        dq, dk, dv = torch.zeros_like(qg), torch.zeros(b, kv, n, d, dtype=q.dtype), torch.zeros(b, kv, n, d, dtype=q.dtype)
        for i0 in range(j0 // block * block if causal else 0, s_q, block):
            i1 = min(i0 + block, s_q)
            s2 = _masked(qg[..., i0:i1, :] @ kb.transpose(-1, -2) * (scale * LOG2E), causal, i0, j0)
            torch.exp2(s2 - lse2[..., i0:i1, :])                    # the decoy: thrown away
            p = (p_by or _squared)(s2, lse2[..., i0:i1, :])         # P by another road
            do, qt = dog[..., i0:i1, :], qg[..., i0:i1, :]
            ds = _BY[mul_by](p, do @ vb.transpose(-1, -2) - delta_g[..., i0:i1, :]) * scale
            cols = lambda x, y, axis: torch.stack([_BY[mul_by](x, y(c)).sum(axis) for c in range(d)], -1)
            if dv_by == "outer":
                for r in range(i1 - i0):
                    dv += (p[..., r, :, None] * do[..., r, None, :]).sum(2)
            elif dv_by == "rows":
                for r in range(i1 - i0):
                    dv += torch.stack([p[..., r, :] * do[..., r, c:c + 1] for c in range(d)], -1).sum(2)
            else:
                dv += cols(p, lambda c: do[..., c:c + 1], -2).sum(2)                # P^T dO, no matmul
            dk += cols(ds, lambda c: qt[..., c:c + 1], -2).sum(2)                   # dS^T Q
            dq[..., i0:i1, :] = cols(ds, lambda c: kb[..., c][..., None, :], -1)    # dS K
        return dq.reshape(q.shape), dk, dv
    return kernel


_SUMMED = "a product (P^T dO, dS K or dS^T Q) written as a broadcast multiply"


@pytest.mark.parametrize("dv_by, says", [
    ("columns", " and a sum (no matmul) took a tile of shape (1, 2, 3, 16, 16) made from Q and K that is not "
                "exp2's output"),
    ("outer", ", an outer product (no matmul) took a tile of shape (1, 2, 3, 16, 1) made from Q and K"),
    ("rows", " and a sum (no matmul) took a tile of shape (1, 2, 3, 16) made from Q and K"),
], ids=["columns", "outer", "rows"])
def test_a_decoy_p_contracted_by_a_broadcast_multiply_and_a_sum_fails(dv_by, says):
    cheat = _summed(dv_by)
    got = rows({"key_block_backward": cheat}, "key_block_backward")[0]
    assert got.status == "wrong" and _SUMMED + says in got.detail, (got.status, got.detail)
    if dv_by != "columns":       # flash_backward reaches the kernel the same way whichever dV it writes
        return
    got = _flash_row(cheat)
    assert got.status == "wrong", got.detail


@pytest.mark.parametrize("mul_by", ["div", "addcmul", "lerp"])
def test_a_decoy_p_contracted_by_a_division_or_addcmul_or_lerp_fails(mul_by):
    """Review r31 (25/25): the same kernel with every product written as a division by a reciprocal
    (or addcmul, lerp from zero) and a sum: the product rule named only mul. Also with P's squarings
    written as pow (_p_by_pow): ``t * t`` of one tensor is itself taken for a product (review r31 #1 check),
    so without it the rule must still find the division, addcmul or lerp."""
    for p_by in (None, _p_by_pow):
        got = rows({"key_block_backward": _summed(mul_by=mul_by, p_by=p_by)}, "key_block_backward")[0]
        assert got.status == "wrong" and _SUMMED in got.detail, (got.status, got.detail)


def test_the_honest_backward_written_with_broadcast_sums_passes():
    """The same kernel with P = exp2(...) itself (the rule's PROB form) passes: a broadcast multiply
    and a sum is a fine way to write the products, with exp2's probabilities."""
    honest = _summed()
    code = honest.__code__
    kernel = types.FunctionType(code, {**honest.__globals__, "_squared": lambda s2, l2: torch.exp2(s2 - l2)},
                                closure=honest.__closure__)
    assert all(r.status == "ok" for r in rows({"key_block_backward": kernel}, "key_block_backward", (0, 1)))


# ---- review r31 #1: routes to a product that no op list names. The product rule (labproducts) names the
# ops that multiply; each route below multiplies with none of them, and every one passed (status ok)
# before the provenance rule: what the kernel returns must come from exp2's output, by products and sums.

def _exp_of(x):
    """e^x without exp: _series of x, squared ten times by pow (``t * t`` of one tensor counts as a
    product of a tile by itself, and the sum after it is named: r28's rule, met by chance)."""
    t = _series(x)
    for _ in range(10):
        t = t ** 2
    return t


def _p_by_pow(s2, lse2):
    """_squared's P with its squarings written as pow(t, 2)."""
    x = s2 / LOG2E - lse2 / LOG2E
    return torch.where(x == -math.inf, 0.0, _exp_of(x))


def _prod_of_stacks(x, y):
    """x y as torch.prod over the pair stacked on a new last axis, half the keys at a time (one
    stack of the whole tile is twice a tile's numbers, which the tile rule refuses)."""
    h = x.shape[-1] // 2
    return torch.cat([torch.stack([x[..., :h], y[..., :h]], -1).prod(-1),
                      torch.stack([x[..., h:], y[..., h:]], -1).prod(-1)], -1)


_ROUTES = {
    "squares": lambda x, y: ((x + y) ** 2 - (x - y) ** 2) / 4,           # the polarization identity
    "prod-of-a-stack": lambda x, y: _prod_of_stacks(*torch.broadcast_tensors(x, y)),
}
_NOT_EXP2 = "is made from both Q and K, but not from exp2's output"


@pytest.mark.parametrize("route", list(_ROUTES))
def test_a_decoy_p_contracted_by_a_product_no_op_list_names_fails(route):
    """The decoy-series kernel (_summed) with every product x y written as ``_ROUTES[route]``: without
    the mul, div, addcmul or lerp that labproducts names. Outside the grader its numbers are right."""
    _BY[route] = _ROUTES[route]
    try:
        case = labcheck.BACKWARD[0]
        q, k, v, dout, mask = labcheck._backward_inputs(case, 100)
        out, lse = labref.dense(q, k, v, mask)
        n = case[7]
        kernel = _summed(mul_by=route, p_by=_p_by_pow)
        got = kernel(q, k[:, :, :n], v[:, :, :n], dout, lse, (dout * out).sum(-1), 0, case[6], n)
        for g, w in zip(got, labref.key_block(q, k, v, dout, mask, 0, n)):
            assert torch.allclose(g, w, atol=1e-9, rtol=1e-9)
        got = rows({"key_block_backward": _summed(mul_by=route, p_by=_p_by_pow)}, "key_block_backward")[0]
        assert got.status == "wrong" and _NOT_EXP2 in got.detail, (got.status, got.detail)
        got = _flash_row(_summed(mul_by=route, p_by=_p_by_pow))
        assert got.status == "wrong" and _NOT_EXP2 in got.detail, (got.status, got.detail)
    finally:
        del _BY[route]


def in_log_space(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    """Every product in log space: ln P = x = S c - lse is known, so P y = +-e^(x + ln|y|), with ln|y|
    of dO, Q or K (made from one of them only), the sign from a where, e^ by _exp_of; dS likewise
    (its sign is that of dP - D). No multiply of a tile, no exp2 output used (a decoy exp2 only)."""
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    kk, vv = (t.repeat_interleave(a // kv, 1) for t in (k_blk, v_blk))
    c = d ** -0.5
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(kk), torch.zeros_like(vv)

    def times(lx, neg, y):                  # +-e^(lx) y, summed later: no multiply by y
        e = _exp_of(lx + torch.log(y.abs()))
        return torch.where(lx == -math.inf, 0.0, torch.where(neg ^ (y < 0), -e, e))
    for i0 in range(j0 // block * block if causal else 0, s_q, block):
        i1 = min(i0 + block, s_q)
        qt, dot = q[:, :, i0:i1], dout[:, :, i0:i1]
        s2 = _masked(qt @ kk.transpose(-1, -2) * (c * LOG2E), causal, i0, j0)
        l2 = lse[:, :, i0:i1, None] * LOG2E
        torch.exp2(s2 - l2)                                             # the decoy
        x = s2 / LOG2E - l2 / LOG2E                                     # ln P
        g = dot @ vv.transpose(-1, -2) - delta[:, :, i0:i1, None]       # dP - D: dS = P g c
        lds, neg = x + torch.log(g.abs() * c), g < 0
        never = torch.zeros_like(g, dtype=torch.bool)
        dv += torch.stack([times(x, never, dot[..., j:j + 1]).sum(-2) for j in range(d)], -1)
        dk += torch.stack([times(lds, neg, qt[..., j:j + 1]).sum(-2) for j in range(d)], -1)
        dq[:, :, i0:i1] = torch.stack([times(lds, neg, kk[..., j][..., None, :]).sum(-1) for j in range(d)], -1)
    return dq, _fold(dk, kv), _fold(dv, kv)


def test_a_decoy_p_contracted_in_log_space_fails():
    """in_log_space, on a small case (its series make it slow under the watch); right outside the grader."""
    case = (1, 2, 1, 21, 16, 4, True, 8)
    q, k, v, dout, mask = labcheck._backward_inputs(case, 100)
    out, lse = labref.dense(q, k, v, mask)
    got = in_log_space(q, k[:, :, 8:16], v[:, :, 8:16], dout, lse, (dout * out).sum(-1), 8, True, 8)
    for g, w in zip(got, labref.key_block(q, k, v, dout, mask, 8, 16)):
        assert torch.allclose(g, w, atol=1e-9, rtol=1e-9)
    report = Report(labcheck.LAB)
    labcheck._key_blocks_rows(report, in_log_space, case, 100)
    assert report.rows[0].status == "wrong" and _NOT_EXP2 in report.rows[0].detail, report.rows[0]


def _overwritten(s2, l2):
    """exp2's output kept as a buffer, then overwritten with the series' P through out=."""
    p = torch.exp2(s2 - l2)
    torch.add(_p_by_pow(s2, l2), 0.0, out=p)
    return p


def test_exp2s_output_overwritten_through_out_is_not_exp2s_output():
    """A write through ``out=`` is a write: the buffer no longer holds exp2's numbers (it kept their form)."""
    got = rows({"key_block_backward": _tiled(_overwritten)}, "key_block_backward")[0]
    assert got.status == "wrong" and _UNUSED in got.detail, (got.status, got.detail)


# Review r31 #4: the g query heads of a key/value head packed into the rows of one tile (FA-3's pack_gqa
# layout, FA-2's seqlenq_ngroups_swapped): g x block rows against the key block. The review's kernel.
PACKED_GQA = '''def key_block_backward(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    g = a // kv
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    sc = d ** -0.5
    sc2 = sc * math.log2(math.e)
    kb, vb = k_blk.to(work), v_blk.to(work)                      # (b, kv, n, d), shared by g heads
    qg = q.to(work).view(b, kv, g, s_q, d)
    dog = dout.to(work).view(b, kv, g, s_q, d)
    lg = lse.to(work).view(b, kv, g, s_q) * math.log2(math.e)
    dg = delta.to(work).view(b, kv, g, s_q)
    dq = torch.zeros(b, kv, g, s_q, d, dtype=work, device=q.device)
    dk = torch.zeros(b, kv, n, d, dtype=work, device=q.device)
    dv = torch.zeros(b, kv, n, d, dtype=work, device=q.device)
    lo = j0 - j0 % block if causal else 0
    for r0 in range(lo, s_q, block):
        r1 = min(s_q, r0 + block)
        m = r1 - r0
        qt = qg[:, :, :, r0:r1].reshape(b, kv, g * m, d)         # g heads' rows packed
        dt = dog[:, :, :, r0:r1].reshape(b, kv, g * m, d)
        s = qt @ kb.transpose(-1, -2) * sc2
        if causal:
            rows = torch.arange(r0, r1, device=q.device).repeat(g).view(-1, 1)
            s = s.masked_fill(torch.arange(j0, j0 + n, device=q.device).view(1, -1) > rows, float("-inf"))
        p = torch.exp2(s - lg[:, :, :, r0:r1].reshape(b, kv, g * m, 1))
        dv += p.transpose(-1, -2) @ dt
        ds = p * (dt @ vb.transpose(-1, -2) - dg[:, :, :, r0:r1].reshape(b, kv, g * m, 1)) * sc
        dk += ds.transpose(-1, -2) @ qt
        dq[:, :, :, r0:r1] = (ds @ kb).view(b, kv, g, m, d)
    return dq.view(b, a, s_q, d), dk.to(k_blk.dtype), dv.to(v_blk.dtype)
'''


def test_heads_packed_into_the_rows_of_a_tile_are_named_as_rows():
    """The tile is g times taller than a block. key_block_backward names its query rows; flash_backward
    met P^T first, (b, kv, n, g x rows), and named those rows "keys side by side"."""
    ns = {"math": math, "torch": torch}
    exec(compile(PACKED_GQA, "<packed gqa>", "exec"), ns)
    kernel = ns["key_block_backward"]
    got = rows({"key_block_backward": kernel}, "key_block_backward")[0]            # case 0: g = 3, block 16
    # matmul runs as bmm over b x kv = 2 batches: 48 = 3 heads x 16 rows, against 16 keys
    assert got.status == "wrong" and "a tile of shape (2, 48, 16) was made: more than 16 query rows " \
        "against the key block at once" in got.detail, got.detail
    got = _flash_row(kernel)
    assert got.status == "wrong" and "keys side by side" not in got.detail, got.detail
    assert "a tile of shape (1, 2, 16, 48) was made: 48 query rows side by side" in got.detail, got.detail


# Review r31 #1, routes to exp2's form (PROB) for numbers exp2 did not make: before the provenance rule's
# fixes, where() kept its branch's form whatever its condition was made from, and index_select kept its
# table's form whatever its index was made from. Both kernels get the right numbers (P = e^x to ~1e-12)
# and passed (status ok).

def _by_binary_digits(s2, l2):
    """P as a product of e^(-2^k) for the binary digits of -x, each factor chosen by a where on the
    residual; the factors are exp2's output times 0, plus numbers (so they had exp2's form)."""
    p0 = torch.exp2(s2 - l2)                                  # the decoy: exp2's output
    x = s2 / LOG2E - l2 / LOG2E
    r = -torch.where(x == -math.inf, 0.0, x)                  # >= 0
    one = p0 * 0.0 + 1.0
    acc = one
    for k in range(6, -41, -1):
        c = r >= 2.0 ** k
        r = r - torch.where(c, 2.0 ** k, 0.0)
        acc = acc * (torch.where(c, one * math.exp(-2.0 ** k), 0.0) + torch.where(c, 0.0, one))
    return torch.where(p0 == 0, 0.0, acc)


def _by_tables(s2, l2):
    """P as a product of twelve table look-ups, e^(-j 2^(4 k - 40)) for the base-16 digits j of
    -x 2^40; each table (16 numbers: a tile's size) is exp2's output times 0 plus numbers, indexed one
    query row at a time."""
    p0 = torch.exp2(s2 - l2)
    x = s2 / LOG2E - l2 / LOG2E
    n = torch.floor((-torch.where(x == -math.inf, 0.0, x)).clamp_min(0.0) * 2.0 ** 40)     # x may be +1e-16
    zero = (p0 * 0.0)[(0,) * (p0.dim() - 2)][:1, :1]                  # (1, 1)
    acc = p0 * 0.0 + 1.0
    for k in range(12):
        digit, n = torch.remainder(n, 16).long(), torch.floor(n / 16)
        table = zero + _exp_of(-torch.arange(16, dtype=s2.dtype) * 2.0 ** (4 * k - 40))[:, None]
        for r in range(digit.shape[-2]):                                # in place: a join keeps no form
            acc[..., r, :].mul_(torch.index_select(table, 0, digit[..., r, :].flatten()).view(digit[..., r, :].shape))
    return torch.where(p0 == 0, 0.0, acc)


@pytest.mark.parametrize("make_p", [_by_binary_digits, _by_tables], ids=["where-digits", "index_select-tables"])
def test_numbers_exp2_did_not_make_do_not_get_its_form(make_p):
    case = labcheck.BACKWARD[0]
    q, k, v, dout, mask = labcheck._backward_inputs(case, 100)
    out, lse = labref.dense(q, k, v, mask)
    n = case[7]
    got = _tiled(make_p)(q, k[:, :, :n], v[:, :, :n], dout, lse, (dout * out).sum(-1), 0, case[6], n)
    for g, w in zip(got, labref.key_block(q, k, v, dout, mask, 0, n)):
        assert torch.allclose(g, w, atol=1e-9, rtol=1e-9)
    got = rows({"key_block_backward": _tiled(make_p)}, "key_block_backward")[0]
    assert got.status == "wrong" and (_UNUSED in got.detail or "different Python numbers" in got.detail), (
        got.status, got.detail)                        # r36: its table of constants is refused first


def test_a_masked_softmax_is_a_natural_base_exponential():
    """Review r31 ("not tried"): aten._masked_softmax was in neither exponential table. The right tiles
    with P from a masked softmax of each (base-e) score against a 0: e^x / (e^x + 1), so e^x = s / (1 - s).
    It was refused for its exp2 count only; now it is named (op names are shown without underscores)."""
    def p_of(s2, l2):
        x = (s2 - l2) / LOG2E

        def half(x):                       # half the keys at a time: a stack of pairs is twice a tile
            pair = torch.stack([x, torch.zeros_like(x)], -1)
            s = torch.ops.aten._masked_softmax(pair, torch.zeros_like(pair, dtype=torch.bool), -1, 0)[..., 0]
            return s / (1 - s)
        h = x.shape[-1] // 2
        return torch.cat([half(x[..., :h]), half(x[..., h:])], -1)
    got = rows({"key_block_backward": _tiled(p_of)}, "key_block_backward")[0]
    assert got.status == "wrong" and "it rebuilt P with masked_softmax, the natural base" in got.detail, got.detail


def _honest_styles(style):
    """Honest kernels written in styles the provenance rule must follow: nan and -inf guards by where on
    masks of the tile or of P, baddbmm_ into zeros_like(K), Q scaled before the product, add_ with alpha,
    dQ joined by cat ("joins"); or einsum, a bool mask by masked_fill with | of two masks, dV's parts added.
    baddbmm_ (in place) was no product the rule knew: the honest "joins" kernel was refused."""
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        b, a, s_q, d = q.shape
        kv, n, c = k_blk.shape[1], k_blk.shape[2], d ** -0.5
        kk, vv = (t.repeat_interleave(a // kv, 1) for t in (k_blk, v_blk))
        dk, dv = torch.zeros_like(kk), torch.zeros_like(vv)
        first = j0 // block * block if causal else 0
        parts, dvs = [torch.zeros(b, a, first, d, dtype=q.dtype)], []
        for i0 in range(first, s_q, block):
            i1 = min(i0 + block, s_q)
            qt, dot, l2 = q[:, :, i0:i1], dout[:, :, i0:i1], lse[:, :, i0:i1, None] * LOG2E
            hide = torch.arange(j0, j0 + n)[None, :] > torch.arange(i0, i1)[:, None]
            if style == "joins":
                s2 = qt @ kk.transpose(-1, -2) * (c * LOG2E)
                s2 = torch.where(hide, -math.inf, s2) if causal else s2
                p = torch.exp2(s2 - l2)
                p = torch.where(torch.isnan(p) | (s2 == -math.inf), 0.0, p)
                dv.view(-1, n, d).baddbmm_(p.transpose(-1, -2).flatten(0, 1), dot.flatten(0, 1))
                ds = p * (dot @ vv.transpose(-1, -2) - delta[:, :, i0:i1, None])
                dk.view(-1, n, d).baddbmm_(ds.transpose(-1, -2).flatten(0, 1), (qt * c).flatten(0, 1))
                part = torch.zeros_like(qt)
                part.add_(torch.matmul(ds, kk), alpha=c)
                parts.append(part)
            else:
                s2 = torch.einsum("bhqd,bhkd->bhqk", qt, kk) * (c * LOG2E)
                mask = (hide if causal else torch.zeros_like(hide)) | (s2 == -math.inf)
                p = torch.exp2(s2.masked_fill(mask, -math.inf) - l2)
                dvs.append(torch.einsum("bhqk,bhqd->bhkd", p, dot))
                ds = p * (torch.einsum("bhqd,bhkd->bhqk", dot, vv) - delta[:, :, i0:i1, None]) * c
                dk += torch.einsum("bhqk,bhqd->bhkd", ds, qt)
                parts.append(torch.einsum("bhqk,bhkd->bhqd", ds, kk))
        if dvs:
            dv = sum(dvs)
        return torch.cat(parts, 2), _fold(dk, kv), _fold(dv, kv)
    return kernel


@pytest.mark.parametrize("style", ["joins", "einsum"])
def test_honest_kernels_in_other_styles_pass_the_provenance_rule(style):
    kernel = _honest_styles(style)
    got = rows({"key_block_backward": kernel}, "key_block_backward", (0, 1))
    assert all(r.status == "ok" for r in got), [r.detail for r in got]
    got = _flash_row(kernel)
    assert got.status == "ok", got.detail


def test_a_decoy_p_taken_by_an_in_place_baddbmm_is_named_by_the_product_rule():
    """baddbmm_ (in place) was no product the product rule knew; the provenance rule refused such a
    kernel by its result only. The decoy-series P, dV accumulated with baddbmm_."""
    def kernel(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        b, a, s_q, d = q.shape
        kv, n, c = k_blk.shape[1], k_blk.shape[2], d ** -0.5
        kk, vv = (t.repeat_interleave(a // kv, 1) for t in (k_blk, v_blk))
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(kk), torch.zeros_like(vv)
        for i0 in range(j0 // block * block if causal else 0, s_q, block):
            i1 = min(i0 + block, s_q)
            qt, dot = q[:, :, i0:i1], dout[:, :, i0:i1]
            s2 = _masked(qt @ kk.transpose(-1, -2) * (c * LOG2E), causal, i0, j0)
            torch.exp2(s2 - lse[:, :, i0:i1, None] * LOG2E)                          # the decoy
            p = _p_by_pow(s2, lse[:, :, i0:i1, None] * LOG2E)
            dv.view(-1, n, d).baddbmm_(p.transpose(-1, -2).flatten(0, 1), dot.flatten(0, 1))
            ds = p * (dot @ vv.transpose(-1, -2) - delta[:, :, i0:i1, None]) * c
            dk += torch.stack([(ds * qt[..., j:j + 1]).sum(-2) for j in range(d)], -1)
            dq[:, :, i0:i1] = torch.stack([(ds * kk[..., j][..., None, :]).sum(-1) for j in range(d)], -1)
        return dq, _fold(dk, kv), _fold(dv, kv)
    # baddbmm_ is the first product: it takes P^T of (1, 6, 16, 16) flattened to (6, 16, 16); before,
    # the first product named was dS^T Q's, a broadcast multiply and a sum of (1, 6, 16, 16)
    got = rows({"key_block_backward": kernel}, "key_block_backward")[0]
    assert got.status == "wrong" and _UNUSED + " (6, 16, 16)" in got.detail, got.detail
