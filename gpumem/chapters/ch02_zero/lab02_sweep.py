"""Lab 02's bucket-size sweep: the learner's hooks and timer on 2 CPU ranks (gloo), one fresh
model per bucket size, forward + backward timed by the learner's ``median_step_seconds``.

Not graded (a time depends on the machine); the lab asks the learner to read the table. One run
per source and settings is kept for the session, so re-running the notebook's cells (or a test
that runs them) does not launch the ranks again.
"""

import inspect
import math
import statistics
import textwrap
import time

from .lab02_ranks import FN

TIMER = "median_step_seconds"
MODEL = dict(name="lab02-sweep", n_layers=4, d_model=192, n_heads=6, n_kv_heads=2, ffn=512, vocab=2048,
             teaching=True)   # 2.4 M parameters: 9.4 MB of fp32 gradients, a tenth of a second per step
_RUNS: dict = {}


def sweep_rank(rank: int, world: int, source: str, timer: str, buckets: tuple, repeats: int) -> list[dict]:
    """Per bucket size: the median forward + backward seconds (the learner's timer) and the number
    of reduce-scatters one backward issued."""
    import torch
    import torch.distributed as dist

    from gpumem.memory import models
    from gpumem.memory.llama import Llama
    from gpumem.runs import training
    ns: dict = {"torch": torch, "dist": dist, "math": math}
    exec(compile(source, f"<your {FN}>", "exec"), ns)
    exec(compile(timer, f"<your {TIMER}>", "exec"), ns)
    calls = [0]
    real = dist.reduce_scatter_tensor

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)
    dist.reduce_scatter_tensor = counted
    tiny, got = torch.ones(world * 2), torch.empty(2)
    latency = []
    for _ in range(21):                       # one collective's fixed cost: 8 bytes per rank
        dist.barrier()
        start = time.perf_counter()
        real(got, tiny)
        latency.append(time.perf_counter() - start)
    out = []
    for bucket in buckets:
        torch.manual_seed(0)
        net = Llama(models.ModelConfig(**MODEL))
        shards: dict = {}
        ns[FN](list(net.parameters()), shards, bucket)
        data = training.batches(net.cfg, 1, world * 2, 128, 0)[0, rank * 2:(rank + 1) * 2]

        def step():
            net(data[:, :-1], data[:, 1:]).backward()
            shards.clear()
        seconds = ns[TIMER](step, repeats)
        calls[0] = 0
        step()
        out.append({"bucket": bucket, "seconds": float(seconds), "collectives": calls[0],
                    "latency": statistics.median(latency)})
    return out


def _source(fn, name: str) -> str | None:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        print(f"could not read the source of {name} (define it in a notebook cell)")
        return None


def sweep(install, timer, buckets=(0, 250_000, 2_000_000, 10**9), repeats: int = 5) -> list[dict] | None:
    """Run the sweep on 2 CPU ranks; print a table (rank 0's medians) and return its rows, or say
    what is still to write and return None."""
    sources = [_source(f, n) for f, n in ((install, FN), (timer, TIMER))]
    if None in sources:
        return None
    todo = [n for s, n in zip(sources, (FN, TIMER)) if 'NotImplementedError("TODO' in s]
    if todo:
        print(f"write {' and '.join(todo)} first: the sweep runs them on 2 ranks")
        return None
    key = (*sources, tuple(buckets), repeats)
    if key not in _RUNS:
        from gpumem.runs import launch
        _RUNS[key] = launch.run("gpumem.chapters.ch02_zero.lab02_sweep:sweep_rank", 2, progress=False,
                                source=sources[0], timer=sources[1], buckets=tuple(buckets), repeats=repeats)
    rows = _RUNS[key][0]
    grads = 4 * sum(_numel().values())
    print(f"{'bucket':>14s} {'reduce-scatters':>16s} {'median fwd+bwd':>15s}   (gradients: {grads / 1e6:.1f} MB)")
    for r in rows:
        print(f"{_label(r, grads):>14s} {r['collectives']:>16d} {r['seconds'] * 1e3:>12.1f} ms")
    lat = rows[0]["latency"]
    print(f"one reduce-scatter of 8 bytes per rank takes {lat * 1e6:.0f} us (median of 21)")
    r = max(rows, key=lambda r: r["collectives"])      # what the fixed cost adds up to, at most
    fixed = r["collectives"] * lat
    print(f"{r['collectives']} reduce-scatters x that fixed cost = {fixed * 1e3:.1f} ms, "
          f"{100 * fixed / r['seconds']:.0f} % of that row's {r['seconds'] * 1e3:.0f} ms step")
    print(textwrap.fill(verdict(rows, grads), 100, subsequent_indent="  "))   # learners' outputs fit 100 columns
    return rows


NOISE = 0.10    # an assumption: on a shared 2-core machine medians of 5 move by about this much from
# run to run; rows closer than that are not told apart (the verdict says so rather than rank them)


def _label(r: dict, grads: int) -> str:
    return "0 (each alone)" if r["bucket"] == 0 else "all in one" if r["bucket"] >= grads else f"{r['bucket']:,} B"


def verdict(rows: list[dict], grads: int) -> str:
    """What this run's table says, from its own numbers: the fastest and slowest rows, where the
    one-bucket row landed, and whether the rows differ by more than :data:`NOISE`."""
    fast, slow = min(rows, key=lambda r: r["seconds"]), max(rows, key=lambda r: r["seconds"])
    ms = {id(r): f"{_label(r, grads).strip()} ({r['seconds'] * 1e3:.0f} ms)" for r in rows}
    if slow["seconds"] <= fast["seconds"] * (1 + NOISE):
        return (f"this run: every row within {NOISE:.0%} of the fastest, {ms[id(fast)]}: no row wins beyond "
                "the noise; run it again")
    ties = [ms[id(r)] for r in rows if r is not fast and r["seconds"] <= fast["seconds"] * (1 + NOISE)]
    line = f"this run: fastest {ms[id(fast)]}" + (f" (tied within {NOISE:.0%}: {', '.join(ties)})" if ties else "")
    line += f", slowest {ms[id(slow)]}"
    one = next((r for r in rows if r["bucket"] >= grads), None)
    if one is not None and one is not slow:
        place = sorted(rows, key=lambda r: r["seconds"]).index(one) + 1
        line += f"; all in one came {place} of {len(rows)}"
    return line


def _numel() -> dict:
    import torch

    from gpumem.memory import models
    from gpumem.memory.llama import Llama
    with torch.device("meta"):
        net = Llama(models.ModelConfig(**MODEL))
    return {n: p.numel() for n, p in net.named_parameters()}
