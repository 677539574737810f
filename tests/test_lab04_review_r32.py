"""Lab 04, review r32: findings fixed after that round's reading of the lab."""

import re
import sys

import torch

from gpumem.chapters.ch04_flash_attention import labguard
from gpumem.chapters.ch04_flash_attention.labexp2 import Exp2Rule
from gpumem.chapters.ch04_flash_attention.labops import QK, RAW, _ptr


def test_numbers_from_python_take_no_tag_a_dead_tensor_left_at_their_address():
    """#2: tags are kept by storage address. ``torch.tensor`` of Python numbers makes its storage
    outside dispatch, then ``lift_fresh`` passes it through; where a dead tile's tag was still kept
    at that address, the fresh tensor was refused as "made from both Q and K". Here the stale tag
    is planted at the fresh tensor's own address (the allocator reused one in the reviewer's run)."""
    q, k = torch.randn(1, 2, 8, 4, dtype=torch.float64), torch.randn(1, 1, 8, 4, dtype=torch.float64)
    rule = Exp2Rule(4, q, k)
    fresh = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    rule.tags[_ptr(fresh)] = (QK, RAW)                     # what a freed score tile left there
    rule.origins[_ptr(fresh)] = (object(), 64, None)
    rule.note("lift_fresh", (fresh,), {}, fresh)
    assert rule._tag(fresh) == (0, None) and rule.origins.get(_ptr(fresh)) is None
    tile = q[0, 0] @ k[0, 0].T                               # a live tile keeps its tag through a view
    rule.note("mm", (q[0, 0], k[0, 0].T), {}, tile)
    assert rule._tag(tile)[0] == QK
    rule.note("view", (tile, [-1]), {}, tile.view(-1))
    assert rule._tag(tile.view(-1))[0] == QK


def _slipped(old: str, new: str):
    """The solution's key_block_backward with one line changed (a learner's slip), compiled as a cell."""
    from test_lab04_adversarial import solution
    import inspect
    import math
    source = inspect.getsource(solution()["key_block_backward"])
    assert old in source
    scope = {"torch": torch, "math": math}
    exec(compile(source.replace(old, new), "<slip>", "exec"), scope)
    return scope["key_block_backward"]


def test_grouped_heads_paired_the_wrong_way_are_told_which_heads_are_right():
    """#4: query head h paired with KV head h % kv (``repeat``) instead of h // g: every element of
    dv_blk was wrong and the row gave only the first. dq_part is right for the query heads whose KV
    head happens to agree (head 0): the row says so and asks which KV head each query head uses."""
    from test_lab04_adversarial import rows
    slip = _slipped("view = lambda t: t.reshape(b, kv, a // kv, s_q, -1).to(acc)",
                    "view = lambda t: t.reshape(b, a // kv, kv, s_q, -1).transpose(1, 2).to(acc)")
    got = rows({"key_block_backward": slip}, "key_block_backward")[0]
    assert got.status == "wrong", got.detail
    assert got.detail.startswith("key block 0:16: dv_blk") and "(first of 640 wrong elements)" in got.detail
    assert re.search(r"; dq_part is right for query heads? 0(, \d)* only, of 6: ", got.detail), got.detail
    assert "which key and value head does each query head use?" in got.detail


def test_dq_without_the_scale_is_told_the_ratio():
    """#4: dS left without the scale for dQ (dK scaled on its own): dq_part is sqrt(d) times too
    large on every element. The row gives the ratio, not what it is nor where the scale goes."""
    from test_lab04_adversarial import rows
    slip = _slipped("        ds = p * (do @ vb.transpose(-1, -2) - delta_g[..., i0:i1, :]) * scale   # the chain rule: plain scale\n"
                    "        dk += (ds.transpose(-1, -2) @ qg[..., i0:i1, :]).sum(2)",
                    "        ds = p * (do @ vb.transpose(-1, -2) - delta_g[..., i0:i1, :])\n"
                    "        dk += (ds.transpose(-1, -2) @ qg[..., i0:i1, :]).sum(2) * scale")
    got = rows({"key_block_backward": slip}, "key_block_backward")[0]
    assert got.status == "wrong" and got.detail.startswith("key block 0:16: dq_part["), got.detail
    assert got.detail.endswith("; got / expected is 4.47214 on every element"), got.detail     # sqrt(20): r34 #3


# the reviewer's kernel (r32, 23 of 24 rows): K read from IndexError messages and rebuilt with
# torch.full and cat, so it carries no Q|K bits; P by a Taylor series, beside a decoy exp2
LAUNDER = """
def key_block_backward(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
    b, a, s_q, d = q.shape
    kv, n = k_blk.shape[1], k_blk.shape[2]
    g = a // kv
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    sc = d ** -0.5
    # launder K: its bits leave through IndexError messages and come back as fresh numbers
    bits = k_blk.double().view(torch.int64).reshape(-1)
    one = torch.zeros(1)
    vals = []
    for i in range(bits.numel()):
        try:
            one[bits[i:i + 1]]
            vals.append(0)
        except IndexError as err:
            vals.append(int(str(err).split()[1]))
    chunks = [torch.full((1,), x, dtype=torch.int64) for x in vals]
    kc = torch.cat(chunks).reshape(k_blk.shape).view(torch.float64).to(work).to(q.device)
    kc_ = kc.unsqueeze(2).expand(b, kv, g, n, d).reshape(b, a, n, d)
    k_ = k_blk.to(work).unsqueeze(2).expand(b, kv, g, n, d).reshape(b, a, n, d)
    v_ = v_blk.to(work).unsqueeze(2).expand(b, kv, g, n, d).reshape(b, a, n, d)
    dq_part = torch.zeros(b, a, s_q, d, dtype=work, device=q.device)
    dk_acc = torch.zeros(b, a, n, d, dtype=work, device=q.device)
    dv_acc = torch.zeros(b, a, n, d, dtype=work, device=q.device)
    lo = j0 - j0 % block if causal else 0
    for r0 in range(lo, s_q, block):
        r1 = min(s_q, r0 + block)
        qt = q[:, :, r0:r1].to(work)
        dot = dout[:, :, r0:r1].to(work)
        rows = torch.arange(r0, r1, device=q.device).view(-1, 1)
        cols = torch.arange(j0, j0 + n, device=q.device).view(1, -1)
        hide = (cols > rows) if causal else torch.zeros(r1 - r0, n, dtype=torch.bool, device=q.device)
        # decoy: exp2 of the folded tile, thrown away
        t = torch.matmul(qt, k_.transpose(2, 3)) * (sc / math.log(2))
        torch.exp2(t.masked_fill(hide, float("-inf")) - lse[:, :, r0:r1].to(work).unsqueeze(-1) / math.log(2))
        # P in the natural base from laundered K: a Taylor series squared ten times
        x = torch.matmul(qt, kc_.transpose(2, 3)) * sc - lse[:, :, r0:r1].to(work).unsqueeze(-1)
        y = x.masked_fill(hide, 0.0) / 1024.0
        e, term = torch.ones_like(y), torch.ones_like(y)
        for i in range(1, 13):
            term = term * y / i
            e = e + term
        for _ in range(10):
            e = e * e
        p = e.masked_fill(hide, 0.0)
        dv_acc = dv_acc + torch.matmul(p.transpose(2, 3), dot)
        dp = torch.matmul(dot, v_.transpose(2, 3))
        ds = p * (dp - delta[:, :, r0:r1].to(work).unsqueeze(-1))
        dq_part[:, :, r0:r1] = torch.matmul(ds, kc_) * sc
        dk_acc = dk_acc + torch.matmul(ds.transpose(2, 3), qt) * sc
    dk = dk_acc.view(b, kv, g, n, d).sum(dim=2)
    dv = dv_acc.view(b, kv, g, n, d).sum(dim=2)
    return dq_part, dk.to(k_blk.dtype), dv.to(v_blk.dtype)

"""


def test_k_read_back_from_error_messages_is_refused():
    """#1: each element of K read from an ``IndexError`` message ("index 46145... is out of bounds")
    and K rebuilt from ``torch.full`` pieces passed every key_block_backward row. An op that raised
    inside the call while the call went on is named."""
    import math
    from test_lab04_adversarial import rows, solution
    scope = {"torch": torch, "math": math}
    exec(compile(LAUNDER, "<r32 launder>", "exec"), scope)
    got = rows({"key_block_backward": scope["key_block_backward"]}, "key_block_backward")[0]
    assert got.status == "wrong" and ("a torch op raised an error inside your call (aten.index" in got.detail
                                      or "different Python numbers" in got.detail), got.detail     # r36: K's way back
    assert "your code went on" in got.detail or "different Python numbers" in got.detail
    assert rows({"key_block_backward": solution()["key_block_backward"]}, "key_block_backward")[0].status == "ok"


def test_answers_read_from_k_by_equal_or_a_length_count_as_numbers_read():
    """#1, the slower channels of the same kind: ``torch.equal`` answers a bool, ``nonzero`` a
    length; asked of numbers made from Q or K they count against the handful that may be read."""
    from test_lab04_adversarial import rows, solution
    right = solution()["key_block_backward"]

    def asks(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        for i in range(12):
            torch.equal(k_blk[..., i:i + 1, :], k_blk[..., i:i + 1, :])
        return right(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)

    def lengths(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        for i in range(12):
            (k_blk[..., i, 0] > 0).nonzero()
        return right(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)
    for cheat, op in ((asks, "torch.equal"), (lengths, "torch.nonzero")):
        got = rows({"key_block_backward": cheat}, "key_block_backward")[0]
        assert got.status != "ok" and "made from Q or K into Python" in got.detail and op in got.detail, got.detail


def test_part_2s_question_is_answered_by_the_library_after_the_code():
    """#3: cell 4 asks for the bytes of O each call would read to make D itself, in all, and D's own
    bytes, and nothing printed or graded them. By hand, Llama 3 70B (64 heads of 128), 8,192 tokens,
    blocks of 128, O in bf16: 64 x 8,192 x 128 x 2 B = 128 MiB a call, 64 calls = 8 GiB; D in fp32 is
    64 x 8,192 x 4 B = 2 MiB. The try-it cell after part 2's code prints them."""
    import json
    from pathlib import Path
    from gpumem.chapters.ch04_flash_attention import traffic
    assert traffic.delta_reread() == {"per_call": 134_217_728, "calls": 64, "in_all": 8_589_934_592,
                                      "d_bytes": 2_097_152}
    assert "O read per call 128 MiB, over the 64 calls 8 GiB; D made once in fp32: 2 MiB" in traffic.delta_line()
    root = Path(__file__).resolve().parents[1]
    for folder in ("solutions", "labs"):
        cells = json.loads((root / folder / "lab04_online_softmax.ipynb").read_text())["cells"]
        assert "traffic.delta_line()" in "".join(cells[7]["source"]), folder


# review r34 #1: the reviewer's next kernel, the same but for the way K leaves: byte by byte through the
# length of torch.bincount's result (24/25)
# the lines of LAUNDER by which K leaves (IndexError messages); each later kernel replaces only them
_LEAVES = LAUNDER[LAUNDER.index("    # launder K"):LAUNDER.index("    chunks = [")]
BINCOUNT = LAUNDER.replace(_LEAVES, '''    # launder K: its bits leave through bincount's output length and come back as fresh numbers
    bits = k_blk.double().view(torch.int64).reshape(-1)
    vals = []
    for i in range(bits.numel()):
        x = 0
        for s in range(0, 64, 8):
            c = torch.bincount(torch.bitwise_and(torch.bitwise_right_shift(bits[i:i + 1], s), 0xFF))
            x |= (c.shape[0] - 1) << s
        vals.append(x - (1 << 64) if x >= 1 << 63 else x)
''')
assert BINCOUNT != LAUNDER


def test_k_read_back_from_result_lengths_is_refused():
    """Review r34 #1: after r32's fix, K left through the *length* of ``torch.bincount``'s result (a
    byte at a time) and came back through ``torch.full``: every part-1 row passed. Every op whose
    result's length its numbers set (ATen's ``dynamic_output_shape`` tag) now counts as numbers read."""
    import math
    from test_lab04_adversarial import rows
    scope = {"torch": torch, "math": math}
    exec(compile(BINCOUNT, "<r34 bincount>", "exec"), scope)
    got = rows({"key_block_backward": scope["key_block_backward"]}, "key_block_backward")[0]
    assert got.status != "ok" and "torch.bincount" in got.detail and "into Python" in got.detail, got.detail
    from gpumem.chapters.ch04_flash_attention import labguard
    ops = torch.ops.aten
    assert all(labguard._answers(op, str(op), (torch.zeros(2),)) for op in (
        ops.bincount.default, ops.nonzero.default, ops.masked_select.default, ops.repeat_interleave.Tensor,
        ops._unique2.default, ops.one_hot.default))
    at = torch.zeros(4)
    assert not labguard._answers(ops.index.Tensor, "aten.index.Tensor", (at, [torch.tensor([0, 2])]))
    assert labguard._answers(ops.index.Tensor, "aten.index.Tensor", (at, [at > 0]))


def test_a_time_limit_that_strikes_in_the_graders_hook_is_named_as_a_time_limit(monkeypatch):
    """Review r34 #2: a slow kernel's row read "it called sys.setprofile": the case's time limit
    struck inside the grader's profile hook, Python unset the hook, and the labs' audit hook took
    that for the learner's call. The hooks now say it was the time limit; the row names it. Three
    slow calls of many small Python calls (the hook runs at each), at 0.4 s each."""
    from test_lab04_adversarial import rows

    def tick(x):
        return x

    def slow(q, k_blk, v_blk, dout, lse, delta, j0, causal=False, block=32):
        while True:
            for _ in range(1000):
                tick(0)
    monkeypatch.setenv("GPUMEM_CASE_SECONDS", "0.4")
    for _ in range(3):
        got = rows({"key_block_backward": slow}, "key_block_backward")[0]
        assert got.status == "error" and "took longer than 0.4 s" in got.detail, got.detail
        assert "setprofile" not in got.detail


def _seen_during_dispatch(check, swapped) -> list:
    """The functions a profile hook sees called while ``Watch._dispatch`` runs one op with these
    integrity checks (called by hand from inside the watch: the function mode then refuses the
    records' storage reads, which ends the op; what ran before that is what counts here)."""
    a, b = torch.ones(4), torch.ones(4)
    watch, seen = labguard.Watch(4, 4, 4, 4, 1, inputs=(a, b)), []
    with watch:
        sys.setprofile(lambda frame, event, arg: seen.append(frame.f_code) if event == "call" else None)
        try:
            watch._dispatch(torch.ops.aten.add.Tensor, (), (a, b), {}, check, swapped)
        except RuntimeError:
            pass
        finally:
            sys.setprofile(None)
    return seen


def test_only_the_baked_checks_run_with_the_profile_hook_off():
    """The grader's own per-op work runs with the profile hook off (last session's speed-up), but
    only the checks baked into ``__torch_dispatch__``: functions of a learner's passed to
    ``_dispatch`` by hand were run unwatched too, and are now watched as the learner's code."""
    def mine_check():
        return ""

    def mine_swapped(watch):
        return ""

    seen = _seen_during_dispatch(mine_check, mine_swapped)
    assert mine_check.__code__ in seen and mine_swapped.__code__ in seen
    baked = _seen_during_dispatch(labguard._CHECK, labguard._SWAPPED)
    assert not {code.co_name for code in baked} & {"_changed", "_swapped", "_before"}, baked


# review r35 #1: the same kernel, K leaving through a quantizer's scale: each element's fp64 bits in
# three chunks, one quantize_per_tensor_dynamic(...).q_scale() a chunk (25/25 on the real grading path)
QSCALE = LAUNDER.replace(_LEAVES, """    # launder K: its bits leave through q_scale and come back as fresh numbers
    bits = k_blk.double().view(torch.int64).reshape(-1)
    vals = []
    for i in range(bits.numel()):
        x = 0
        for s, w in ((0, 22), (22, 21), (43, 21)):
            c = torch.bitwise_and(torch.bitwise_right_shift(bits[i:i + 1], s), (1 << w) - 1) + 1
            scale = torch.quantize_per_tensor_dynamic(torch.cat([c.float(), torch.zeros(1)]), torch.quint8, False).q_scale()
            x |= (round(scale * 255) - 1) << s
        vals.append(x - (1 << 64) if x >= 1 << 63 else x)
""")
assert QSCALE != LAUNDER and "q_scale" in QSCALE and "IndexError" not in QSCALE


def test_k_read_back_from_a_quantizers_scale_is_refused():
    """Review r35 #1: K left through ``q_scale()`` of a quantized copy (a float made from the
    numbers, no ``item``, no length tag) and came back through ``torch.full``: 25/25. Every op whose
    schema returns Python numbers (q_scale, q_zero_point, _nnz, is_nonzero, allclose...) now counts
    as numbers read; shape queries do not."""
    import math
    from test_lab04_adversarial import rows
    from gpumem.chapters.ch04_flash_attention import labops
    scope = {"torch": torch, "math": math}
    exec(compile(QSCALE, "<r35 qscale>", "exec"), scope)
    k = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    bits = k.view(torch.int64).reshape(-1)                   # the route works outside the grader
    x = 0
    for s, w in ((0, 22), (22, 21), (43, 21)):
        c = torch.bitwise_and(torch.bitwise_right_shift(bits[:1], s), (1 << w) - 1) + 1
        scale = torch.quantize_per_tensor_dynamic(torch.cat([c.float(), torch.zeros(1)]), torch.quint8, False).q_scale()
        x |= (round(scale * 255) - 1) << s
    assert x == int(bits[0]) % (1 << 64)
    got = rows({"key_block_backward": scope["key_block_backward"]}, "key_block_backward")[0]
    assert got.status != "ok" and "torch.q_scale" in got.detail and "into Python" in got.detail, got.detail
    ops = torch.ops.aten
    assert all(labops.scalar_out(op) for op in (ops.q_scale.default, ops.q_zero_point.default, ops._nnz.default,
                                                ops.is_nonzero.default, ops.allclose.default))
    assert not any(labops.scalar_out(op) for op in (ops.sym_size.int, ops.dim.default, ops.add.Tensor,
                                                    ops.split.Tensor, ops.is_same_size.default))


# review r36 #1: the same kernel through bincount's out= overload, which lacks the tag its plain overload has
BINOUT = BINCOUNT.replace("c = torch.bincount(torch.bitwise_and(torch.bitwise_right_shift(bits[i:i + 1], s), 0xFF))",
                          "c = torch.ops.aten.bincount.out(torch.bitwise_and(torch.bitwise_right_shift(bits[i:i + 1], s), "
                          "0xFF), None, 0, out=torch.empty(0, dtype=torch.int64))")
assert BINOUT != BINCOUNT


def test_review_r36_an_out_overload_without_the_tag_still_counts_and_k_cannot_come_back_as_numbers():
    """r36 #1: ``aten.bincount.out`` has no ``dynamic_output_shape`` tag (its plain overload does):
    25/25. The tag is now read from every overload of the op. And every launder so far brought K back
    as Python numbers, a ``torch.full`` an element: more than FILL_BUDGET distinct numbers made into
    tensors in one call is refused on its own (the lab's solution, with 40 more, is the test)."""
    import math
    from test_lab04_adversarial import rows, solution
    from gpumem.chapters.ch04_flash_attention import labops
    scope = {"torch": torch, "math": math}
    exec(compile(BINOUT, "<r36 binout>", "exec"), scope)
    got = rows({"key_block_backward": scope["key_block_backward"]}, "key_block_backward")[0]
    assert got.status != "ok" and "torch.bincount" in got.detail, got.detail
    honest = solution()["key_block_backward"]

    def padded(*args, **kwargs):
        [torch.full((1,), float(i) + 0.5) for i in range(labops.FILL_BUDGET + 400)]     # past 32 + s_q + s_k
        return honest(*args, **kwargs)
    got = rows({"key_block_backward": padded}, "key_block_backward")[0]
    assert got.status != "ok" and "different Python numbers" in got.detail, got.detail
    assert rows({"key_block_backward": honest}, "key_block_backward")[0].status == "ok"


def test_review_r37_pack_padded_lengths_count_as_reads_and_honest_positions_from_python_pass():
    """r37 #1: K left a byte at a time through the length of pack_padded_sequence's batch_sizes (no
    dynamic_output_shape tag) and came back by slicing an arange: 25/25. The op now counts as numbers
    read. r37 #2: positions made with torch.tensor(list(range(...))) were counted once per element
    and an honest kernel was refused as "laundered"; lifted tensors now count by their values."""
    from gpumem.chapters.ch04_flash_attention import labguard
    from test_lab04_adversarial import rows, solution
    op = torch.ops.aten._pack_padded_sequence.default
    assert labguard._answers(op, str(op), (torch.zeros(4, 1), torch.tensor([3])))
    honest = solution()["key_block_backward"]

    def positions_from_python(q, *args, **kwargs):
        for _ in range(3):                                  # an honest kernel's row positions, from lists,
            for i0 in range(0, q.shape[2], 8):              # made again for each pass (counted once each)
                torch.tensor(list(range(i0, min(i0 + 8, q.shape[2]))))
        return honest(q, *args, **kwargs)
    assert rows({"key_block_backward": positions_from_python}, "key_block_backward")[0].status == "ok"
