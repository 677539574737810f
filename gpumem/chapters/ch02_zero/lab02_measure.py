"""Lab 02 Part 2's measurements on 2 CPU ranks (gloo), one thread a rank (the given timer).

On CPU ranks there is no spare core for gloo's thread while backward runs (2 ranks, 1 thread
each, and the machine's cores, printed with the table, shared with whatever else runs), so how
much of a transfer hides behind a real backward is barely measurable here. What is measured:

* lone reduce-scatters of two sizes (64 KiB and all the sweep model's gradients), each timed whole (:func:`timed`) and as the **launch** alone
  (:func:`launched`: until ``reduce_scatter_single(..., async_op=True)`` returns). Gloo does part
  of an asynchronous collective in the thread that calls it (the input is taken in before the call
  returns) and writes the output only in ``wait()``; that part runs in the learner's hook, so it
  cannot hide behind backward. The learner prices both on lines through these points;
* a backward that leaves the core free (:func:`stand_in`): the buckets' reduce-scatters launched
  one after the other with a sleep before each, in place of the gradients' computation; the time
  left after the sleeps is what the buckets expose when the transfers can hide.

Every kind of call is timed in interleaved rounds (a load that comes and goes on a shared machine
hits every kind alike, and each round starts one kind later), each call between two barriers:
both ranks start together, and the time ends when both are done. On a shared machine other work
only adds time, so a kind's fastest round is its least disturbed one (the prediction's points).
"""

import math
import os
import time

ROUNDS = 15                  # rounds of lone reduce-scatters in a check (about 0.5 s on 2 ranks; 4.4 s
#                             on a 2-core machine busy with other work, 2026-12-06)
SMALL = 1 << 16              # the small lone reduce-scatter's bytes; the large one is all the gradients,
POINTS = ("small", "all")    # so every bucket size lies between the two (a line through two sizes of
# megabytes, extrapolated to small buckets, came out negative at 0 bytes)
GAP = 0.005                  # seconds of "backward" (a sleep) before each bucket's launch in the stand-in
MODEL = dict(name="lab02-sweep", n_layers=4, d_model=192, n_heads=6, n_kv_heads=2, ffn=512, vocab=2048,
             teaching=True)   # 2.4 M parameters: 9.4 MB of fp32 gradients


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def model_numel() -> list[int]:
    """The sweep model's parameter sizes, in ``named_parameters`` order. Built on the CPU (9.4 MB,
    about 20 ms): on the meta device, the first ``normal_`` imports ``torch._dynamo``, 1.6 s on each
    rank of every check, and 120,000 more objects in every later scan of :mod:`.lab02_probe`."""
    import torch

    from gpumem.memory import models
    from gpumem.memory.llama import Llama
    with torch.random.fork_rng(devices=[]):        # its initial values draw from torch's generator
        return [p.numel() for p in Llama(models.ModelConfig(**MODEL)).parameters()]


def timed(call) -> float:
    """Seconds of ``call()`` between two barriers: both ranks start together, both are done at the end."""
    import torch.distributed as dist
    dist.barrier()
    start = time.perf_counter()
    call()
    dist.barrier()
    return time.perf_counter() - start


def launched(call) -> float:
    """Seconds until ``call()`` (an asynchronous collective) returns its work, both ranks started
    together; the work is waited afterwards, outside the time."""
    import torch.distributed as dist
    dist.barrier()
    start = time.perf_counter()
    work = call()
    took = time.perf_counter() - start
    work.wait()
    dist.barrier()
    return took


def stand_in(calls: list, gap: float = GAP) -> float:
    """A backward that leaves the core free: before each of ``calls`` (asynchronous collectives, in
    the buckets' order) each rank sleeps ``gap``; every work is waited at the end. Returns the
    seconds beyond the longer of the two ranks' sleeps (measured, not ``gap`` times the count: a
    sleep ends late, and the collectives wait for the rank that slept longer)."""
    import torch
    import torch.distributed as dist
    works, slept = [], 0.0
    dist.barrier()
    start = time.perf_counter()
    for call in calls:
        t = time.perf_counter()
        time.sleep(gap)
        slept += time.perf_counter() - t
        works.append(call())
    for work in works:
        work.wait()
    took = time.perf_counter() - start
    longest = torch.tensor([slept], dtype=torch.float64)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    return took - longest.item()


def rounds(kinds: dict, n: int) -> dict:
    """{kind: [seconds of each round]}: each kind is a function that runs and times one call and
    returns its seconds. One warm-up call of each kind, then ``n`` interleaved rounds, each starting
    one kind later than the one before (no kind always comes first)."""
    for run in kinds.values():
        run()
    out: dict = {k: [] for k in kinds}
    names = list(kinds)
    for r in range(n):
        for k in names[r % len(names):] + names[:r % len(names)]:
            out[k].append(kinds[k]())
    return out


def reduce_scatter(world: int, nbytes: int):
    """An asynchronous reduce-scatter of an fp32 input of about ``nbytes`` (padded to a multiple of
    the ranks): returns (the call, the input's bytes)."""
    import torch
    import torch.distributed as dist
    send = torch.ones(world * math.ceil(nbytes / 4 / world))
    recv = torch.empty(send.numel() // world)
    return (lambda: dist.reduce_scatter_single(recv, send, async_op=True)), 4 * send.numel()


def lone_kinds(world: int, numel: int) -> tuple[dict, dict]:
    """({kind: timed run}, {point: input bytes a rank}): for each of :data:`POINTS` (:data:`SMALL`
    bytes, and ``numel`` fp32 elements), the reduce-scatter timed whole (``("whole", point)``, waited
    at once) and its launch alone (``("launch", point)``)."""
    kinds, sizes = {}, {}
    for point, nbytes in zip(POINTS, (SMALL, 4 * numel)):
        call, sizes[point] = reduce_scatter(world, nbytes)
        kinds[("whole", point)] = lambda c=call: timed(lambda: c().wait())
        kinds[("launch", point)] = lambda c=call: launched(c)
    return kinds, sizes


def lone_rank(world: int, n: int = ROUNDS) -> dict:
    """On each rank, one thread: the lone reduce-scatters' seconds, round by round."""
    import torch
    torch.set_num_threads(1)
    kinds, sizes = lone_kinds(world, sum(model_numel()))
    return lone(rounds(kinds, n), sizes, torch.get_num_threads())


def lone(secs: dict, sizes: dict, threads: int) -> dict:
    """The lone reduce-scatters' record: {"bytes": {point: B}, "seconds": {point: [...]}, "launch": {point: [...]},
    "threads", "cores"}."""
    return {"bytes": sizes, "seconds": {p: secs[("whole", p)] for p in POINTS},
            "launch": {p: secs[("launch", p)] for p in POINTS}, "threads": threads, "cores": cores()}


def fastest(xs) -> float:
    """A kind's least disturbed round (other work on a shared machine only adds time)."""
    return min(xs)


def points(lone: dict, at=fastest) -> list[tuple[int, float, float]]:
    """The (bytes, seconds, launch seconds) triples a prediction is made from: the lone
    reduce-scatters of :data:`POINTS`, each its rounds' ``at`` (the fastest; the sweep's table,
    whose other columns are medians, passes ``statistics.median``)."""
    return [(lone["bytes"][p], at(lone["seconds"][p]), at(lone["launch"][p])) for p in POINTS]
