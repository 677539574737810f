"""Lab 04 part 5: causal load balance for context parallelism, graded on the lab's own ring.

With a causal mask, query i sees keys 0..i, so the ranks that hold the sequence's chunks do
unequal work. The learner writes ``exp_counts(owner, n)`` (``owner[c]``: the rank that holds
chunk c of n tokens; 2R chunks, each rank twice; each rank's count of the score entries the
causal mask leaves for its queries) and ``shard_order(ranks)`` (an owner list under which every
rank's count is equal). Counts are measured, not assumed: for each chunk c the grader runs the
learner's ``ring_attention`` (part 4) with chunk c's queries against all 2R chunks (``rank=c``,
causal), records every ``tiled_forward`` call with a profile hook on its code (as :mod:`.labring`
does) and counts the unmasked entries of each call (top-left causal: row i of a call sees
min(i + 1, n_k) keys; otherwise n_q x n_k). The grader's own count of a chunk must agree, or the
ring is named. A long-sequence case (2^20 tokens) is graded on the grader's count alone: a count
entry by entry, or a mask of s x s, does not finish. The grader's functions here are off while
the learner's code runs (:func:`answers_off`), and so is the library's count of causal pairs,
``attention_flops.visible_pairs`` (review r22: two calls of it passed ``exp_counts``). Sources:
the lab's part 5 (solutions/) and its tests; the order the course teaches is Llama 3's
(arXiv:2407.21783, section 3.3.2) and Megatron-LM's (``get_batch_on_this_cp_rank``).
"""

import contextlib
import random

import torch

from gpumem.course.grading import Todo, call, kind, run_case
from gpumem.memory import attention_flops, flash_tiled

from .labblock import chained, no_library_backward

# (ranks, chunk length n, which owner list); "long": 2^20 tokens, hand count only
COUNTS = ((3, 7, "contiguous"), (4, 6, "balanced"), (3, 9, "shuffled"), (8, 2 ** 16, "long"))
ORDERS = ((3, 5), (5, 4), (4, 7))            # (ranks, n) at which shard_order is measured
BLOCK = 4


def unmasked(n_q: int, n_k: int, causal: bool) -> int:
    """Score entries one ``tiled_forward(q, k, v, causal)`` call keeps: top-left causal, row i
    sees keys 0..i."""
    return sum(min(i + 1, n_k) for i in range(n_q)) if causal else n_q * n_k


def by_hand(owner, n: int) -> list[int]:
    """The grader's count for each rank (off during the learner's call)."""
    counts = [0] * (max(owner) + 1)
    for c, r in enumerate(owner):
        counts[r] += c * n * n + n * (n + 1) // 2
    return counts


def owners(ranks: int, what: str, rng: random.Random) -> list[int]:
    """The owner list of one case: ``what`` names its kind (contiguous, balanced with the ranks
    relabelled at random, or shuffled); off during the learner's call."""
    if what in ("contiguous", "long"):
        return [c // 2 for c in range(2 * ranks)]
    if what == "balanced":
        labels = list(range(ranks))
        rng.shuffle(labels)
        return [labels[min(c, 2 * ranks - 1 - c)] for c in range(2 * ranks)]
    out = [r for r in range(ranks) for _ in range(2)]
    rng.shuffle(out)
    return out


@contextlib.contextmanager
def forward_calls():
    """Record (n_q, n_k, causal) of every ``flash_tiled.tiled_forward`` call while the block runs."""
    calls, code = [], flash_tiled.tiled_forward.__code__

    def record(frame, event, arg):
        if event == "call" and frame.f_code is code:
            q, k, causal = (frame.f_locals.get(x) for x in ("q", "k", "causal"))
            if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
                calls.append((q.shape[2], k.shape[2], bool(causal)))
    with chained(record):
        yield calls


def measured(ring, owner, n: int, seed: int) -> tuple[list[int], str]:
    """(each rank's unmasked entries over its ring_attention calls, '' or what is wrong with the ring)."""
    g = torch.Generator().manual_seed(seed)
    ks = [torch.randn(1, 1, n, 8, generator=g, dtype=torch.float64) for _ in owner]
    vs = [torch.randn(1, 1, n, 8, generator=g, dtype=torch.float64) for _ in owner]
    counts = [0] * (max(owner) + 1)
    for c, r in enumerate(owner):
        q = torch.randn(1, 1, n, 8, generator=g, dtype=torch.float64)
        with forward_calls() as calls:
            call(ring, q, [k.clone() for k in ks], [v.clone() for v in vs], c, True, BLOCK)
        took = sum(unmasked(*call) for call in calls)
        if took != c * n * n + n * (n + 1) // 2:
            return counts, (f"your ring_attention for chunk {c} (of {len(owner)} chunks of {n} tokens, causal) "
                            f"ran tiled_forward on {len(calls)} shards keeping {took:,} score entries, but its "
                            f"queries see {c * n * n + n * (n + 1) // 2:,}: fix part 4 first")
        counts[r] += took
    return counts, ""


def _owner_of(got, ranks: int) -> str:
    if not (isinstance(got, (list, tuple)) and len(got) == 2 * ranks
            and all(isinstance(r, int) and not isinstance(r, bool) for r in got)):
        return f"expected a list of {2 * ranks} ints (the rank of each chunk), got {kind(got)}"
    if sorted(got) != sorted(list(range(ranks)) * 2):
        return f"{list(got)}: each of the {ranks} ranks must hold exactly two of the {2 * ranks} chunks"
    return ""


def _first_rank_wrong(got, want, owner) -> str:
    if not (isinstance(got, (list, tuple)) and len(got) == len(want)):
        return f"expected a list of {len(want)} counts (one per rank), got {kind(got)}"
    for r, (x, w) in enumerate(zip(got, want)):
        if x != w:
            held = [c for c, o in enumerate(owner) if o == r]
            return f"rank {r} (chunks {held[0]} and {held[1]}): got {x!r}, expected {w:,}"
    return ""


REFUSED = "work it out yourself: {} is the grader's own answer, off while lab 04 is graded"
ANSWERS = (("labzig.by_hand", by_hand), ("labzig.owners", owners), ("labzig.measured", measured),
           ("labzig.unmasked", unmasked))
# the library's own count of what part 5 asks (attention_flops.attention_flops calls it, so that is off too)
LIBRARY = (("attention_flops.visible_pairs", attention_flops.visible_pairs,
            "count it yourself: {} is the library's count of causal pairs, off while lab 04's part 5 is graded"),)
_CODES = {fn.__code__: REFUSED.format(name) for name, fn in ANSWERS}     # taken at import, before any swap
_CODES.update({fn.__code__: message.format(name) for name, fn, message in LIBRARY})


@contextlib.contextmanager
def answers_off():
    """While the block runs, :data:`ANSWERS` and :data:`LIBRARY` raise (their code swapped, as
    :mod:`.labblock` does for the backwards), and so does a function rebuilt on their original code
    (a profile hook)."""
    codes = dict(_CODES)             # a copy: _CODES emptied during the call does nothing

    def refuse(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            raise RuntimeError(codes[frame.f_code])
    with no_library_backward(*((name, fn, REFUSED) for name, fn in ANSWERS), *LIBRARY), chained(refuse):
        yield


def _asked(fn, *args):
    """The learner's call with the grader's part-5 functions off."""
    with answers_off():
        return call(fn, *args)


RING_FIRST = "write ring_attention (part 4) first: part 5 counts its tiled_forward calls"


def _measured(ring, owner, n, seed):
    """:func:`measured`, with an unwritten ``ring_attention`` said as such."""
    if ring is None:
        return None, RING_FIRST
    try:
        return measured(ring, owner, n, seed)
    except Todo:
        return None, RING_FIRST


def count_rows(report, fn, case, seed, ring=None) -> None:
    """One ``exp_counts`` row: against the counts of ``ring``'s calls (the long case: by hand)."""
    ranks, n, what = case
    owner = owners(ranks, what, random.Random(seed))
    name = f"{ranks} ranks, {2 * ranks} chunks of {n:,} tokens, {what} {owner if what != 'long' else ''}".rstrip()

    def body():                  # the learner first: no frame holds the counts during the call
        got = _asked(fn, list(owner), n)
        want, bad = (by_hand(owner, n), "") if what == "long" else _measured(ring, owner, n, seed)
        if bad:
            return ("todo" if bad == RING_FIRST else "wrong"), bad
        bad = _first_rank_wrong(got, want, owner)
        return ("wrong" if bad else "ok"), bad
    run_case(report, "exp_counts", name, body)


def order_rows(report, fn, case, seed, ring=None) -> None:
    """One ``shard_order`` row: each rank's count, measured on ``ring``'s calls, must be equal."""
    ranks, n = case

    def body():
        got = _asked(fn, ranks)
        bad = _owner_of(got, ranks)
        if bad:
            return "wrong", bad
        counts, bad = _measured(ring, list(got), n, seed)
        if bad:
            return ("todo" if bad == RING_FIRST else "wrong"), bad
        lo, hi = counts.index(min(counts)), counts.index(max(counts))
        if counts[lo] != counts[hi]:
            return "wrong", (f"order {list(got)}: rank {lo} keeps {counts[lo]:,} score entries, rank {hi} "
                             f"{counts[hi]:,} (chunks of {n}, causal): not balanced")
        return "ok", ""
    run_case(report, "shard_order", f"{ranks} ranks, chunks of {n} tokens", body)


def draw(rng: random.Random) -> dict:
    """Unseen ranks and chunk lengths for one check, keyed like the fixed tuples."""
    counts = tuple((rng.randint(3, 5), rng.randint(5, 10), what) for _, _, what in COUNTS[:3])
    ranks = rng.choice((8, 16))
    long = (ranks, 2 ** 20 // (2 * ranks), "long")
    orders = tuple((r, rng.randint(4, 9)) for r in rng.sample((3, 4, 5, 6, 7), 3))
    return {"COUNTS": counts + (long,), "ORDERS": orders}
