"""Lab 04's graded cases: the fixed ones (the tests name them) and fresh ones drawn for each
``check()``, so that the graded shapes and numbers are never the ones in this file.

A draw keeps what each fixed case is there for: grouped-query attention (a query heads on kv
key/value heads, kv dividing a), key lengths that are not multiples of the block, query and key
lengths that differ, causal and not; merges with an empty shard, rows that see no key and
logsumexps near 1,000; rings with empty shards, every rank position. The sizes stay within the
fixed cases' ranges, so a check takes about as long.
"""

from gpumem.course import seeds


# (batch, query heads, kv heads, s_q, s_k, head dim, causal, block); ragged blocks of >= 9 keys
BACKWARD = ((1, 6, 2, 77, 73, 20, True, 16), (2, 4, 4, 50, 93, 8, False, 32),
            (1, 8, 2, 100, 139, 40, True, 32), (1, 3, 3, 41, 65, 12, False, 24))
# bf16 cases (not drawn: their tolerance was measured on them, see labbf16):
# 20 query blocks summed into each key block's dK, dV; 20 key blocks summed into dQ
BF16 = (1, 4, 2, 320, 64, 16, False, 16)
BF16_DQ = (1, 4, 2, 32, 320, 16, False, 16)
# (batch, heads, s_q, d, shard lengths, what is special, causal query offset)
MERGE = ((1, 4, 20, 16, (13, 40, 7), "plain", 0), (1, 2, 30, 8, (25, 0, 31, 9, 17), "causal", 30),
         (2, 3, 9, 16, (50, 50), "large", 0), (1, 2, 12, 8, (20, 15), "rows with no key", 3))
# (batch, query heads, kv heads, shard lengths, rank, head dim, causal, block)
RING = ((1, 4, 2, (30, 23, 41), 1, 16, True, 16), (1, 2, 2, (19, 0, 37, 26), 2, 8, False, 16),
        (2, 6, 3, (40, 33, 0, 29), 3, 12, True, 32), (1, 3, 1, (26, 44, 17), 0, 20, True, 16))


def _ragged(rng, low: int, high: int, block: int, avoid: int = -1) -> int:
    while True:
        n = rng.randint(low, high)
        if n % block >= 9 and n != avoid:            # a last block of 9 or more keys, not full
            return n


def _backward(rng, fixed):
    b, _, _, _, _, _, causal, _ = fixed
    block = rng.choice((16, 24, 32))
    kv = rng.choice((1, 2, 3))
    a = kv * rng.choice((2, 3) if fixed[1] != fixed[2] else (1,))   # GQA where the fixed case has it
    s_q = rng.randint(40, 100)
    s_k = _ragged(rng, 50, 140, block, avoid=s_q)
    return (b, a, kv, s_q, s_k, rng.choice((8, 12, 16, 20)), causal, block)


def _lengths(rng, shards: int, empty: int | None, low: int = 7, high: int = 45):
    lengths = [rng.randint(low, high) for _ in range(shards)]
    if empty is not None:
        lengths[empty] = 0
    return tuple(lengths)


def _merge(rng, fixed):
    b, heads, s_q, d, lengths, what, _ = fixed
    s_q = rng.randint(max(6, s_q - 6), s_q + 6)
    shards = rng.randint(2, 5) if what != "large" else 2
    new = _lengths(rng, shards, rng.randrange(shards) if what == "causal" else None)
    offset = {"causal": rng.randint(1, sum(new) - 1), "rows with no key": rng.randint(1, 3)}.get(what, 0)
    return (b, heads, s_q, rng.choice((8, 16)), new, what, offset)


def _ring(rng, fixed):
    b, a, kv, lengths, _, d, causal, block = fixed
    shards = rng.randint(3, 4)
    empty = rng.randrange(shards) if 0 in lengths else None
    new = _lengths(rng, shards, empty, 9, 45)
    # a causal case of a rank past the first keeps a non-empty shard before it: every key of that
    # shard is visible, so a ring that masks every shard fails there (review r10, 4 % of draws)
    rank = rng.choice([r for r, n in enumerate(new) if n and (not (causal and fixed[4]) or any(new[:r]))])
    kv = rng.choice((1, 2, 3))
    return (b, kv * (a // fixed[2] if a != fixed[2] else 1), kv, new, rank, rng.choice((8, 12, 16)),
            causal, rng.choice((16, 32)))


def draw(seed: int | None = None) -> dict:
    """Fresh cases for one check, keyed like the fixed tuples; ``seed`` None: from the system."""
    rng = seeds.rng(seed)
    drawn = {"BACKWARD": tuple(_backward(rng, c) for c in BACKWARD), "MERGE": tuple(_merge(rng, c) for c in MERGE),
             "RING": tuple(_ring(rng, c) for c in RING), "seeds": [rng.getrandbits(31) for _ in range(16)]}
    assert any(causal and any(lengths[:rank]) for _, _, _, lengths, rank, _, causal, _ in drawn["RING"]), \
        "no causal ring case with a visible earlier shard"
    return drawn
