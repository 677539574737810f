"""Lab 02 Part 2's measurements on 2 CPU ranks (gloo), one thread a rank (the given timer).

On CPU ranks there is no spare core for gloo's thread while backward runs (2 ranks, 1 thread
each, and the machine's cores, printed with the table, shared with whatever else runs), so how
much of a transfer hides is barely measurable here. What can be measured is the transfer one
bucket exposes: one reduce-scatter of every gradient, timed alone, next to lone reduce-scatters
of other sizes from which the learner predicts it.

Every kind of call is timed in interleaved rounds (a load that comes and goes on a shared machine
hits every kind alike, and each round starts one kind later), each call between two barriers:
both ranks start together, and the time ends when both are done. On a shared machine other work
only adds time, so a kind's fastest round is its least disturbed one; the spread of its rounds in
the same run is its noise band (:func:`band`).
"""

import math
import os
import statistics
import time

ROUNDS = 15                  # rounds of lone reduce-scatters in a check (about 0.5 s on 2 ranks)
FRACTIONS = (0.5, 1.5, 1.0)  # lone reduce-scatters: these multiples of the sweep model's gradients (the
# last is the one-bucket transfer the learner predicts from the first two)
MODEL = dict(name="lab02-sweep", n_layers=4, d_model=192, n_heads=6, n_kv_heads=2, ffn=512, vocab=2048,
             teaching=True)   # 2.4 M parameters: 9.4 MB of fp32 gradients


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def model_numel() -> list[int]:
    """The sweep model's parameter sizes, in ``named_parameters`` order."""
    import torch

    from gpumem.memory import models
    from gpumem.memory.llama import Llama
    with torch.device("meta"):
        return [p.numel() for p in Llama(models.ModelConfig(**MODEL)).parameters()]


def timed(call) -> float:
    """Seconds of ``call()`` between two barriers: both ranks start together, both are done at the end."""
    import torch.distributed as dist
    dist.barrier()
    start = time.perf_counter()
    call()
    dist.barrier()
    return time.perf_counter() - start


def rounds(kinds: dict, n: int) -> dict:
    """{kind: [seconds of each round]}: one warm-up call of each kind, then ``n`` interleaved rounds,
    each starting one kind later than the one before (no kind always comes first)."""
    for call in kinds.values():
        timed(call)
    out: dict = {k: [] for k in kinds}
    names = list(kinds)
    for r in range(n):
        for k in names[r % len(names):] + names[:r % len(names)]:
            out[k].append(timed(kinds[k]))
    return out


def lone_calls(world: int, numel: int) -> tuple[dict, dict]:
    """({fraction: call}, {fraction: input bytes a rank}): synchronous reduce-scatters of fp32
    inputs of :data:`FRACTIONS` of ``numel`` elements (padded to a multiple of the ranks)."""
    import torch
    import torch.distributed as dist
    calls, sizes = {}, {}
    for f in FRACTIONS:
        send = torch.ones(world * math.ceil(f * numel / world))
        recv = torch.empty(send.numel() // world)
        calls[f] = (lambda s=send, r=recv: dist.reduce_scatter_tensor(r, s))
        sizes[f] = 4 * send.numel()
    return calls, sizes


def lone_rank(world: int, n: int = ROUNDS) -> dict:
    """On each rank, one thread: the lone reduce-scatters' seconds, round by round."""
    import torch
    torch.set_num_threads(1)
    calls, sizes = lone_calls(world, sum(model_numel()))
    return {"seconds": rounds(calls, n), "bytes": sizes, "threads": torch.get_num_threads(), "cores": cores()}


def fastest(xs) -> float:
    """A kind's least disturbed round (other work on a shared machine only adds time)."""
    return min(xs)


def band(xs) -> tuple[float, float]:
    """The noise band of one kind's rounds in this run: from its fastest round to its lower quartile
    (the least disturbed quarter), widened on both sides by that width, or by a tenth of the fastest
    where the rounds agree closer than that; never below half the fastest."""
    lo = min(xs)
    q1 = statistics.quantiles(xs, n=4, method="inclusive")[0]
    w = max(q1 - lo, lo / 10)
    return max(lo - w, lo / 2), q1 + w


def points(lone: dict) -> list[tuple[int, float]]:
    """The (bytes, seconds) pairs a prediction is made from: the first two lone reduce-scatters
    (half and one and a half times the gradients), each at its fastest round."""
    return [(lone["bytes"][f], fastest(lone["seconds"][f])) for f in FRACTIONS[:2]]
