"""Lab 02's graded cases, drawn afresh for each ``check()`` from the fixed ones (``labcheck.CASES``
names what each is there for; the tests narrow it), so that the seeds, bucket sizes and the unused
layer's place in ``params`` are never the ones in any file.

A draw keeps each fixed case's role and model: bucket 0 (each gradient alone) stays 0; a bucket of
several stays a few per backward; a bucket that holds everything stays larger than every
gradient together; the case with an unused layer keeps an odd bucket (it divides no gradient
evenly) and puts the layer's two parameters at two drawn places in ``params``. Sizes stay within
the fixed cases' ranges, so a check takes about as long.
"""

from gpumem.course import seeds

ONE_BUCKET = 10**7        # a fixed bucket this large or larger holds every gradient of the lab's models
BF16 = ("tiny", 1)        # (model, steps) of the bf16 case (lab02_bf16): its seed and bucket are drawn


def _bucket(rng, bucket: int, spare) -> int:
    if bucket == 0:
        return 0
    if bucket >= ONE_BUCKET:
        return rng.randrange(ONE_BUCKET, 10 * ONE_BUCKET)
    # no smaller than 19/20 of the fixed bucket: mini's 3,346,944 B in buckets of at least 190,000 B
    # allow 2 x 18 + 1 = 37 reduce-scatters, fewer than its 39 tensors (each alone must stay too many)
    drawn = rng.randrange(bucket * 19 // 20, bucket * 13 // 10)
    return drawn | 1 if spare or bucket % 2 else drawn          # an odd bucket stays odd


def _spare(rng, n_params: int) -> tuple[int, int]:
    """Where the unused layer's weight and bias go in ``params`` (indices in the final list)."""
    weight = rng.randrange(n_params + 1)
    bias = rng.randrange(n_params + 2)
    return (weight, bias) if bias != weight else (weight, bias + 1)


def draw(cases: tuple, seed: int | None = None) -> tuple[tuple, tuple]:
    """(cases, bf16): each fixed ``(model, seed, steps, bucket, spare)`` with a fresh seed, bucket and
    (where it has one) unused-layer position; and the bf16 case ``(model, seed, steps, bucket)``, a
    bucket of several. ``seed`` None: from the system."""
    from .lab02_ranks import n_params
    rng = seeds.rng(seed)
    out = tuple((model, rng.randrange(1, 10_000), steps, _bucket(rng, bucket, spare),
                 _spare(rng, n_params(model)) if spare else False)
                for model, _, steps, bucket, spare in cases)
    model, steps = BF16
    return out, (model, rng.randrange(1, 10_000), steps, rng.randrange(40_000, 80_000))
