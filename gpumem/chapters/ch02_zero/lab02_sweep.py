"""Lab 02's bucket-size sweep (given): the learner's hooks on 2 CPU ranks (gloo), one thread a rank,
one model per bucket size and one with no hooks, timed in interleaved rounds with the lone
reduce-scatters of :mod:`.lab02_measure`; next to each row, the learner's
``predict_exposed_seconds`` from this run's lone reduce-scatters of half and one and a half times
the gradients.

The table is not graded (a step time depends on the machine and its load); what the lines under it
say is computed from this run: which rows lie above or below no hooks (the middle half of the
round-by-round differences excludes 0) and where the one-bucket row's difference lies against the
predicted transfer. One run per source and settings is kept for the session, so re-running the
notebook's cells (or a test that runs them) does not launch the ranks again.
"""

import inspect
import math
import statistics
import textwrap

from . import lab02_measure as measure
from .lab02_ranks import FN, REDUCE_SCATTERS

ROUNDS = 7
_RUNS: dict = {}


def sweep_rank(rank: int, world: int, source: str, buckets: tuple, rounds: int) -> dict:
    """On each rank, one thread: seconds of each round for no hooks, each bucket size and the lone
    reduce-scatters; the reduce-scatters one backward issued per bucket; the arrival order's sizes."""
    import torch
    import torch.distributed as dist

    from gpumem.memory import models
    from gpumem.memory.llama import Llama
    from gpumem.runs import training
    torch.set_num_threads(1)
    ns: dict = {"torch": torch, "dist": dist, "math": math}
    exec(compile(source, f"<your {FN}>", "exec"), ns)
    calls = [0]
    for name in REDUCE_SCATTERS:
        real = getattr(dist, name)
        setattr(dist, name, lambda *a, _real=real, **k: (calls.__setitem__(0, calls[0] + 1), _real(*a, **k))[1])
    torch.manual_seed(0)
    plain = Llama(models.ModelConfig(**measure.MODEL))
    data = training.batches(plain.cfg, 1, world * 2, 128, 0)[0, rank * 2:(rank + 1) * 2]
    order: list = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: order.append(4 * p.numel())) for p in plain.parameters()]
    nets, shards = {"none": plain}, {}
    for bucket in buckets:
        nets[bucket] = Llama(models.ModelConfig(**measure.MODEL))
        nets[bucket].load_state_dict(plain.state_dict())
        ns[FN](list(nets[bucket].parameters()), shards, bucket)

    def step(net):
        net(data[:, :-1], data[:, 1:]).backward()
        for p in net.parameters():
            p.grad = None
        shards.clear()
    kinds = {k: (lambda net=net: step(net)) for k, net in nets.items()}
    lone, sizes = measure.lone_calls(world, sum(p.numel() for p in plain.parameters()))
    kinds.update({f"lone {f}": call for f, call in lone.items()})
    counts = {}
    for bucket in buckets:
        calls[0] = 0
        step(nets[bucket])
        counts[bucket] = calls[0]
    step(plain)                                   # the arrival order, once
    for h in hooks:
        h.remove()
    secs = measure.rounds(kinds, rounds)
    return {"seconds": secs, "counts": counts, "order": order, "lone": {"bytes": sizes, "seconds":
            {f: secs[f"lone {f}"] for f in measure.FRACTIONS}}, "threads": torch.get_num_threads(),
            "cores": measure.cores()}


def _source(fn, name: str) -> str | None:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        print(f"could not read the source of {name} (define it in a notebook cell)")
        return None


def sweep(install, predict, buckets=(0, 250_000, 2_000_000, 10**9), rounds: int = ROUNDS) -> dict | None:
    """Run the sweep on 2 CPU ranks; print rank 0's table and what this run tells; return rank 0's
    results, or say what is still to write and return None."""
    source = _source(install, FN)
    if source is None:
        return None
    if 'NotImplementedError("TODO' in source:
        print(f"write {FN} first: the sweep runs it on 2 ranks")
        return None
    key = (source, tuple(buckets), rounds)
    if key not in _RUNS:
        from gpumem.runs import launch
        _RUNS[key] = launch.run("gpumem.chapters.ch02_zero.lab02_sweep:sweep_rank", 2, progress=False,
                                source=source, buckets=tuple(buckets), rounds=rounds)
    res = _RUNS[key][0]
    for line in table(res, predict):
        print(line)
    return res


def _predicted(res: dict, predict, bucket: int):
    try:
        return float(predict(list(res["order"]), bucket, measure.points(res["lone"])))
    except NotImplementedError:
        return None


def table(res: dict, predict) -> list[str]:
    """The printed lines (each under 100 columns)."""
    sec, grads = res["seconds"], sum(res["order"])
    out = [f"2 ranks, {res['threads']} thread each, {res['cores']} cores here; {len(sec['none'])} rounds, "
           f"interleaved; gradients {grads / 1e6:.1f} MB",
           f"{'bucket':>14s} {'collectives':>11s} {'median step':>12s}  {'step - no hooks (middle half)':>31s}"
           f"  {'predicted':>9s}"]
    plain = sec["none"]
    out.append(f"{'no hooks':>14s} {0:>11d} {statistics.median(plain) * 1e3:>9.1f} ms")
    told = []
    for bucket, n in res["counts"].items():
        diffs = [a - b for a, b in zip(sec[bucket], plain)]
        q1, med, q3 = statistics.quantiles(diffs, n=4, method="inclusive")
        pred = _predicted(res, predict, bucket)
        label = "0 (each alone)" if bucket == 0 else "all in one" if bucket >= grads else f"{bucket:,} B"
        shown = f"{pred * 1e3:6.1f} ms" if pred is not None else "(todo)"
        out.append(f"{label:>14s} {n:>11d} {statistics.median(sec[bucket]) * 1e3:>9.1f} ms  {med * 1e3:+8.1f} ms "
                   f"({q1 * 1e3:+7.1f} ..{q3 * 1e3:+7.1f})  {shown:>9s}")
        told.append((label, q1, q3, pred))
    lone = res["lone"]
    out.append("lone reduce-scatter, fastest of the rounds: " + "; ".join(
        f"{lone['bytes'][f] / 1e6:.2f} MB {measure.fastest(lone['seconds'][f]) * 1e3:.1f} ms"
        for f in measure.FRACTIONS))
    above, below = [t[0] for t in told if t[1] > 0], [t[0] for t in told if t[2] < 0]
    line = (f"this run: the middle half lies above 0 for {', '.join(above) or 'no row'}"
            + (f", below 0 for {', '.join(below)}" if below else "")
            + f"; {len(told) - len(above) - len(below)} row(s) are not told apart from no hooks")
    label, q1, q3, pred = told[-1]
    if pred is not None:
        where = "below" if pred < q1 else "above" if pred > q3 else "inside"
        line += (f". {label}: the predicted transfer ({pred * 1e3:.1f} ms) lies {where} the middle half of its "
                 f"difference ({q1 * 1e3:+.1f} .. {q3 * 1e3:+.1f} ms)")
    return out + textwrap.wrap(line, 99, subsequent_indent="  ")
