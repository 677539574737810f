"""Lab 04's ``check()``: FlashAttention-2's key-outer backward and the merge of partial attention.

The learner writes (the forward, ``gpumem.memory.flash_tiled.tiled_forward``, is given: chapter 04
prints it whole)

* ``key_block_backward(q, k_blk, v_blk, dout, lse, delta, j0, causal, block)`` ->
  ``(dq_part, dk_blk, dv_blk)``: one key/value block's work (one thread block of FA2's Algorithm 2),
  looping over query blocks of ``block`` rows;
* ``flash_backward(dout, q, k, v, out, lse, causal, block)`` -> ``(dq, dk, dv)``: D, then the outer
  loop over key blocks calling ``key_block_backward``, dQ summed across blocks;
* ``merge_partials(parts)`` -> ``(out, lse)`` from ``[(out_i, lse_i), ...]`` over key shards;
* ``ring_attention(q, k_shards, v_shards, rank, causal, block)`` -> ``(out, lse)``: context
  parallelism's step, every shard's partial with ``tiled_forward``, then the merge;
* ``exp_counts(owner, n)`` and ``shard_order(ranks)``: each rank's causal work over 2R chunks, and
  an order that balances it (:mod:`.labzig`, measured on ``ring_attention``'s calls).

The backward's probabilities must come from exp2 with log2(e) folded into the scale, as
FlashAttention-2's kernels take them (:mod:`.labexp2`): chapter 04's ``tiled_backward`` takes exp,
so a copy of it cannot answer parts 1 and 2 however well it hides from the copy watch. What parts 1
and 2 return must be made from exp2's output by products and sums (the provenance rule, review r31).

Graded in fp64 on cases drawn afresh at every check (``labcases``: GQA, lengths not multiples of
the block, query and key lengths that differ, causal and not, empty shards, rows no key is visible
to, logsumexps near 1,000) against plain attention and autograd (``labref``), at 1e-9 absolute +
1e-9 relative; two bf16 ``flash_backward`` cases are fixed (:mod:`.labbf16`: dQ's sum in fp32). A
failing case names its FIRST element out of tolerance (row-major; dv before dk and dq, and a
logsumexp in the wrong base named: :mod:`.labslips`), with how many are. ``labguard.Watch`` runs
around every call: SDPA, a
softmax over a whole row, the whole score matrix, a tensor wider than one block of keys, a tensor
made from both Q and K larger than one block x block tile per head in any layout or key width
(more than one block of query rows: ``labexp2.Exp2Rule.wide``), a causal key block that
exponentiates more query rows than see it, joined shards, numbers taken out of torch, threads, the
watch switched off or reached from the call (``labfence``) or rebound (``labseal``), or a tensor
that no watched op made fail the case even when the numbers are right; ``labblock`` switches the
library's backwards off during the call and checks that ``flash_backward``'s dK, dV are the
blocks its ``key_block_backward`` calls returned, dQ their sum; ``labring`` checks that
``ring_attention`` ran ``tiled_forward`` once per visible shard and merged those partials with
``merge_partials``; ``labblock.no_copies`` refuses the chapter's backward rebuilt on its code or
pasted under another name. Expected answers are made after the learner's call returns, so no
frame on the stack holds them during it. Each function stops at its first failing case. With CUDA, ``labgpu`` grades
the optional GPU part.
"""

import random

import torch

from gpumem.course.grading import Report, Row, call, returned, run_case

from . import labbf16, labcases, labgpu, labref, labseal, labslips, labzig
from .labblock import assembled, guarded, key_block_calls
from .labguard import Watch
from .labring import empty_shard_hint, masked_shard_hint, ring_calls, ring_wrong

LAB = "lab04_online_softmax"
BACKWARD, BF16, BF16_DQ, MERGE, RING = labcases.BACKWARD, labcases.BF16, labcases.BF16_DQ, labcases.MERGE, labcases.RING
def _randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _backward_inputs(case, seed):
    b, a, kv, sq, sk, d, causal, block = case
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = _randn(g, b, a, sq, d), _randn(g, b, kv, sk, d), _randn(g, b, kv, sk, d), _randn(g, b, a, sq, d)
    mask = labref.causal_mask(sq, sk) if causal else None
    return q, k, v, dout, mask


def _name(case) -> str:
    b, a, kv, sq, sk, d, causal, block = case
    return f"b{b} heads {a}/{kv} s_q {sq} s_k {sk} d {d}{' causal' if causal else ''} block {block}"


def _watch(case, q, k, v, rows, tile_rows=None, causal_from=None, j0=0):
    """The op watch on one call; ``rows``: (dout, lse, delta or out), vectors per query row; ``k``: keys
    from ``j0`` on (exp2 is counted over the visible scores of these keys, :mod:`.labpairs`)."""
    b, a, kv, sq, sk, d, causal, block = case
    hidden = labref.causal_mask(sq, sk)[:, j0:j0 + k.shape[2]] if causal else None
    return Watch(sq, sk, d, block, b * a, allowed=(k, v), tile_rows=tile_rows, rows=rows[1:],
                 queries=(q, rows[0]), causal_from=causal_from, exp2=(q, k, hidden), no_autograd=True)


def _exp2_wrong(watch, case, j0=0, j1=None) -> str:
    """'' or the backward's exp2 rule broken (checked after every other rule: those name the worse
    slip); exp2 must have reached every visible score of keys ``j0:j1``, each counted once (r13 #1, r16 #2)."""
    b, a, kv, sq, sk, d, causal, block = case
    hidden = labref.causal_mask(sq, sk)[:, j0:j1] if causal else torch.zeros(sq, sk, dtype=torch.bool)[:, j0:j1]
    return watch.exp2.wrong(b * a * int((~hidden).sum())) if watch.exp2 is not None else ""


def _unmade(watch, names, got) -> str:
    """'' or which returned gradient is not made from exp2's output by products and sums (review r31 #1)."""
    return watch.exp2.unmade(names, got) if watch.exp2 is not None else ""


def _overworked(watch, case, j0, n) -> str:
    return watch.overworked(j0, n) if case[6] else ""


def _key_blocks_rows(report, fn, case, seed):
    q, k, v, dout, mask = _backward_inputs(case, seed)
    block, sk = case[7], case[4]
    out, lse = labref.dense(q, k, v, mask)
    delta = (dout * out).sum(-1)
    starts = sorted({0, (sk // 2) // block * block, (sk - 1) // block * block})

    def body():
        for j0 in starts:
            j1 = min(j0 + block, sk)
            kb, vb = k[:, :, j0:j1].clone(), v[:, :, j0:j1].clone()
            ins = (q.clone(), dout.clone(), lse.clone(), delta.clone())
            watch = _watch(case, ins[0], kb, vb, ins[1:], j1 - j0, j0 if case[6] else None, j0)
            got, broken = guarded(fn, watch, ins[0], kb, vb, *ins[1:], j0, case[6], block)
            broken = broken or _overworked(watch, case, j0, j1 - j0) or _exp2_wrong(watch, case, j0, j1)
            if not (isinstance(got, (tuple, list)) and len(got) == 3):
                return "wrong", returned(got, "a tuple (dq_part, dk_blk, dv_blk)")
            names = ("dq_part", "dk_blk", "dv_blk")                          # expected: made now
            broken = broken or _unmade(watch, names, got)
            bad = labslips.first_wrong(names, got, labref.key_block(q, k, v, dout, mask, j0, j1))
            bad = (labslips.lse_base(names, got, q, k, v, dout, mask, j0, j1) + bad if bad else "") or broken
            if bad:
                return "wrong", f"key block {j0}:{j1}: {bad}"
        return "ok", ""
    run_case(report, "key_block_backward", _name(case), body)


def _visible_blocks(case) -> tuple[int, int]:
    sk, block = case[4], case[7]
    total = -(-sk // block)
    return (min(total, -(-case[3] // block)) if case[6] else total), total


def _flash_case(case, seed):
    """((q, k, v, dout, out, lse), (dq, dk, dv) expected) of one backward case; in bf16, the
    inputs FA2 takes (bf16 tensors, an fp32 lse) and the fp64 gradients of exactly those."""
    q, k, v, dout, mask = _backward_inputs(case, seed)
    low = case in (BF16, BF16_DQ)
    if low:                                       # the forward: fp64 of the bf16-rounded inputs
        q, k, v, dout = (t.bfloat16().double() for t in (q, k, v, dout))
    out, lse, *want = labref.grads(q, k, v, dout, mask)
    if low:                                       # FA2's own dtypes: bf16 tensors, an fp32 lse
        q, k, v, dout, out = (t.bfloat16() for t in (q, k, v, dout, out))
        lse = lse.float()
        want = labref.kernel_grads(q, k, v, dout, out, lse, mask)
    return (q, k, v, dout, out, lse), want


def _flash_rows(report, fn, case, seed, inner=None):
    low = case in (BF16, BF16_DQ)

    def body():                  # the expected answer is made after the call: no frame holds it during
        q, k, v, dout, out, lse = _flash_case(case, seed)[0]
        kc, vc, qc, ins = k.clone(), v.clone(), q.clone(), (dout.clone(), out.clone(), lse.clone())
        named = getattr(fn, "__globals__", {}).get("key_block_backward")
        with key_block_calls(inner, named) as calls:
            watch = _watch(case, qc, kc, vc, ins)
            got, broken = guarded(fn, watch, ins[0], qc, kc, vc, *ins[1:], case[6], case[7])
        broken = broken or _exp2_wrong(watch, case)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return "wrong", returned(got, "a tuple (dq, dk, dv)")
        broken = broken or _unmade(watch, ("dq", "dk", "dv"), got)
        want = _flash_case(case, seed)[1]
        if low:
            bad = labbf16.wrong(got, want, calls) or broken
        else:
            bad = labslips.first_wrong(("dq", "dk", "dv"), got, want)
            q, k, v, dout, mask = _backward_inputs(case, seed)
            hint = labslips.lse_base(("dq", "dk", "dv"), got, q, k, v, dout, mask, 0, case[4]) if bad else ""
            bad = (hint + bad if bad else "") or broken
        visible, total = _visible_blocks(case)
        if not bad and not visible <= len(calls) <= total:
            bad = (f"it called key_block_backward {len(calls)} times; the outer loop over key blocks calls "
                   f"it once per key block that some query sees ({visible} here, of {total})")
        bad = bad or assembled(calls, got)
        return ("wrong" if bad else "ok"), bad
    run_case(report, "flash_backward", _name(case) + (" bf16" if low else ""), body)


def _shards(g, b, a, kv, lengths, d):
    ks = [_randn(g, b, kv, n, d) for n in lengths]
    return ks, [_randn(g, b, kv, n, d) for n in lengths]


def _merge_case(case, seed):
    """(parts, expected out, expected lse) of one MERGE case."""
    b, a, sq, d, lengths, what, offset = case
    g = torch.Generator().manual_seed(seed)
    q = _randn(g, b, a, sq, d) * (400.0 if what == "large" else 1.0)
    ks, vs = _shards(g, b, a, a, lengths, d)
    sk = sum(lengths)
    mask = (labref.causal_mask(sq, sk, q0=offset) if what == "causal" else torch.zeros(sq, sk, dtype=torch.bool))
    if what == "rows with no key":
        mask[:offset] = True                         # the first query rows see no key at all
    offsets = [sum(lengths[:r]) for r in range(len(lengths))]
    parts = [labref.dense(q, kr, vr, mask[:, o:o + n]) for kr, vr, o, n in zip(ks, vs, offsets, lengths)]
    return parts, *labref.dense(q, torch.cat(ks, 2), torch.cat(vs, 2), mask)


def merge_watch(case, parts) -> Watch:
    """The watch on one merge call: no key blocks here (its block is all the keys), but whatever it
    makes must not be a whole score matrix, and no number may leave torch."""
    b, heads, s_q, d, lengths, _, _ = case
    return Watch(s_q, sum(lengths), d, sum(lengths), b * heads, inputs=[t for p in parts for t in p])


def ring_watch(case, q, k_shards, v_shards) -> Watch:
    """The watch on one ``ring_attention`` call."""
    b, a, _, lengths, rank, d, _, block = case
    return Watch(lengths[rank], sum(lengths), d, block, b * a, allowed=k_shards + v_shards,
                 joined=max(lengths), inputs=(q,))


def _merge_rows(report, fn, case, seed):
    b, heads, s_q, d, lengths, _, _ = case
    name = f"b{b} heads {heads} s_q {s_q} shards {'/'.join(map(str, lengths))} {case[5]}"

    def body():                  # the expected answer is made after the call: no frame holds it during
        parts = [(o.clone(), l.clone()) for o, l in _merge_case(case, seed)[0]]
        got, broken = guarded(fn, merge_watch(case, parts), parts)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            return "wrong", returned(got, "a tuple (out, lse)")
        _, out, lse = _merge_case(case, seed)
        bad = labref.first_wrong("out", got[0], out, case[5]) or labref.first_wrong("lse", got[1], lse, case[5]) \
            or broken
        return ("wrong" if bad else "ok"), bad
    run_case(report, "merge_partials", name, body)


def _ring_rows(report, fn, case, seed):
    b, a, kv, lengths, rank, d, causal, block = case
    g = torch.Generator().manual_seed(seed)
    ks, vs = _shards(g, b, a, kv, lengths, d)
    q = _randn(g, b, a, lengths[rank], d)
    sk, q0 = sum(lengths), sum(lengths[:rank])
    name = (f"b{b} heads {a}/{kv} shards {'/'.join(map(str, lengths))} rank {rank} d {d}"
            f"{' causal' if causal else ''} block {block}")

    def body():
        kc, vc = [t.clone() for t in ks], [t.clone() for t in vs]
        qc = q.clone()
        watch = ring_watch(case, qc, kc, vc)
        with ring_calls(getattr(fn, "__globals__", {}).get("merge_partials")) as calls:
            got, broken = guarded(fn, watch, qc, kc, vc, rank, causal, block)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            return "wrong", returned(got, "a tuple (out, lse)")
        out, lse = labref.dense(q, torch.cat(ks, 2), torch.cat(vs, 2),     # made after the call
                                labref.causal_mask(lengths[rank], sk, q0=q0) if causal else None)
        bad = labref.first_wrong("out", got[0], out) or labref.first_wrong("lse", got[1], lse)
        hint = empty_shard_hint(kc, got) + masked_shard_hint(calls, kc, rank, causal) if bad else ""
        bad = (hint + bad if bad else "") or broken or ring_wrong(calls, kc, rank, causal, got)
        return ("wrong" if bad else "ok"), bad
    run_case(report, "ring_attention", name, body)


def check(ns: dict, show: bool = True, seed: int | None = None) -> Report:
    """Grade the lab's six functions (and, with CUDA, its GPU part) on cases drawn afresh
    (:func:`.labcases.draw`; ``seed`` fixes the draw); never raises. Each function stops at its
    first failing case: that row is the one to fix, its later cases are not run."""
    report, drawn = Report(LAB), labcases.draw(seed)
    zig = labzig.draw(random.Random(drawn["seeds"][-1]))
    parts = (("key_block_backward", drawn["BACKWARD"], _key_blocks_rows),
             ("flash_backward", drawn["BACKWARD"] + (BF16, BF16_DQ), _flash_rows),
             ("merge_partials", drawn["MERGE"], _merge_rows), ("ring_attention", drawn["RING"], _ring_rows),
             ("exp_counts", zig["COUNTS"], labzig.count_rows), ("shard_order", zig["ORDERS"], labzig.order_rows))
    for fn_name, cases, rows in parts:
        fn = ns.get(fn_name)
        for i, case in enumerate(cases):
            if fn is None:
                report.rows.append(Row(fn_name, f"case {i + 1}", "todo", f"define {fn_name}"))
            elif rows is _flash_rows:
                rows(report, fn, case, drawn["seeds"][i], inner=ns.get("key_block_backward"))
            elif rows in (labzig.count_rows, labzig.order_rows):    # part 5 counts part 4's ring
                rows(report, fn, case, drawn["seeds"][i], ring=ns.get("ring_attention"))
            else:
                rows(report, fn, case, drawn["seeds"][i])
            if report.rows[-1].status in ("wrong", "error"):
                break                                 # the first failing case is the one reported
    gpu_line = labgpu.grade(report, ns)
    if show:
        print(report.summary())
        print(f"GPU part: {gpu_line}")
    return report
