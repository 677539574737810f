"""Lab 02's optional GPU part: the learner's hooks on 2 GPUs over NCCL, measured.

Per rank, the same model (:data:`MODEL`) trains one backward twice: without hooks
(every full gradient stays, as under plain data parallelism or ZeRO-1) and with the learner's
hooks at ``bucket_bytes``. Each backward is timed with ``torch.cuda.Event`` (median of
``repeats``) and its memory measured with ``torch.cuda.max_memory_allocated`` above what was
allocated when it started. The shards the hooks leave are compared with an all-reduce of the
plain run's gradients (averaged, then cut), computed here, outside the learner's code.

The CPU-graded bound predicts both: plain backward ends holding every gradient (G bytes); the
hooks hold at most a bucket plus the largest gradient, two buckets' flat copies in flight (each
at most that much again) and this rank's shards (G / 2 on 2 ranks). Activation gradients come
on top of both, so the comparison is approximate. Not run on a GPU by the course's authors yet: its
numbers are the learner's to measure.
"""

import math
import statistics

from .lab02_ranks import FN

# 107 M parameters, 428 MB of fp32 gradients: large next to a bucket and the 33.6 MB embedding
MODEL = dict(name="lab02-gpu", n_layers=8, d_model=1024, n_heads=16, n_kv_heads=4, ffn=2816, vocab=8192,
             teaching=True)
BUCKET = 25 << 20                  # PyTorch DDP's default bucket_cap_mb (torch/nn/parallel/distributed.py)
GPU_ATOL = 1e-4                    # GPU shards vs an all-reduce of the same gradients on the same GPU


def cuda_reason() -> str:
    """'' when 2 GPUs are usable, else why the GPU part is skipped."""
    import torch
    if not torch.cuda.is_available():
        return "no CUDA device here: the GPU part runs on a machine with 2 GPUs (NCCL)"
    if torch.cuda.device_count() < 2:
        return f"needs 2 GPUs for NCCL's reduce-scatter; this machine has {torch.cuda.device_count()}"
    return ""


def grade(report, source: str) -> str:
    """With 2 GPUs: one row (the hooks' shards over NCCL against an all-reduce, and the
    measurements); without: no row. Returns the line ``check()`` prints after its summary."""
    from gpumem.course.grading import case_seconds, failure_line, run_case
    from gpumem.errors import RunFailure
    reason = cuda_reason()
    if reason:
        return f"skipped ({reason})"
    line = ["see the row 'optional GPU part'"]

    def body():
        from gpumem.runs import launch
        try:
            res = launch.run("gpumem.chapters.ch02_zero.lab02_gpu:gpu_rank", 2, device="cuda", progress=False,
                             source=source, bucket=BUCKET, repeats=5)
        except (launch.RankError, RunFailure) as err:
            return "error", failure_line(err)
        bad = next((r for r, x in enumerate(res) if not x["worst"] <= GPU_ATOL), None)
        if bad is not None:
            return "wrong", (f"on GPU rank {bad} the shards differ from an all-reduce of the gradients by up to "
                             f"{res[bad]['worst']:.3g}" + (" (a shard is missing)" if res[bad]["worst"] > 1e30 else ""))
        line[0] = summary(res[0], BUCKET)
        return "ok", line[0]
    run_case(report, FN, "optional GPU part (2 GPUs, NCCL)", body, case_seconds(cases=2))
    return line[0]


def gpu_rank(rank: int, world: int, source: str, bucket: int, repeats: int) -> dict:
    """One rank: plain and hooked backward, timed and measured; the hooked shards checked."""
    import torch
    import torch.distributed as dist

    from gpumem.memory import models
    from gpumem.memory.llama import Llama
    from gpumem.runs import training
    dev = torch.device("cuda", rank)
    ns: dict = {"torch": torch, "dist": dist, "math": math}
    exec(compile(source, f"<your {FN}>", "exec"), ns)

    def measure(hooks: bool) -> dict:
        torch.manual_seed(0)
        net = Llama(models.ModelConfig(**MODEL)).to(dev)
        params = list(net.parameters())
        shards: dict = {}
        if hooks:
            ns[FN](params, shards, bucket)
        data = training.batches(net.cfg, 1, world * 2, 512, 0)[0, rank * 2:(rank + 1) * 2].to(dev)
        times, peaks = [], []
        for _ in range(repeats + 1):                  # the first is a warm-up
            net.zero_grad(set_to_none=True)
            shards.clear()
            loss = net(data[:, :-1], data[:, 1:])
            torch.cuda.synchronize(dev)
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss.backward()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
            peaks.append(torch.cuda.max_memory_allocated(dev) - base)
        grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
        return {"seconds": statistics.median(times[1:]), "peak": max(peaks[1:]), "shards": dict(shards),
                "grads": grads}
    plain, hooked = measure(False), measure(True)
    worst = 0.0
    for i, g in enumerate(plain["grads"]):
        dist.all_reduce(g)
        g /= world
        c = math.ceil(g.numel() / world)
        want = torch.nn.functional.pad(g.reshape(-1), (0, c * world - g.numel()))[rank * c:(rank + 1) * c]
        got = hooked["shards"].get(i)
        worst = math.inf if got is None or got.shape != want.shape else max(worst, (got - want).abs().max().item())
    sizes = [p.numel() * 4 for p in plain["grads"]]
    return {"plain_s": plain["seconds"], "hooked_s": hooked["seconds"], "plain_peak": plain["peak"],
            "hooked_peak": hooked["peak"], "worst": worst, "grads": sum(sizes), "largest": max(sizes),
            "gpu": torch.cuda.get_device_name(dev)}


def run(install, bucket: int = BUCKET, repeats: int = 5) -> dict | None:
    """Run :func:`gpu_rank` on 2 GPUs with ``install``'s source; print rank 0's numbers next to the
    prediction. Prints why and returns None without 2 GPUs."""
    import inspect
    import textwrap
    reason = cuda_reason()
    if reason:
        print(f"GPU part: skipped ({reason})")
        return None
    source = textwrap.dedent(inspect.getsource(install))
    if 'NotImplementedError("TODO' in source:
        print(f"write {FN} first: the GPU part runs it on 2 GPUs")
        return None
    res = run_source(source, bucket, repeats)
    print(summary(res, bucket).replace("; ", "\n"))       # two lines of at most 100 columns
    return res


def run_source(source: str, bucket: int = BUCKET, repeats: int = 5) -> dict:
    """Rank 0's result of :func:`gpu_rank` on 2 GPUs (NCCL) for the hooks in ``source``."""
    from gpumem.runs import launch
    return launch.run("gpumem.chapters.ch02_zero.lab02_gpu:gpu_rank", 2, device="cuda", progress=False,
                      source=source, bucket=bucket, repeats=repeats)[0]


def bound(r: dict, bucket: int, world: int = 2) -> int:
    """Bytes the hooks may hold at most at the end of backward (module docstring)."""
    return 3 * (bucket + r["largest"]) + math.ceil(r["grads"] / world)


def summary(r: dict, bucket: int) -> str:
    """Rank 0's measurements next to the prediction, as two clauses joined by '; '."""
    return (f"{r['gpu']}, bucket {bucket / 2**20:.0f} MiB: backward {r['plain_s'] * 1e3:.1f} ms plain, "
            f"{r['hooked_s'] * 1e3:.1f} ms hooked; peak above backward's start {r['plain_peak'] / 1e6:.0f} MB "
            f"plain (gradients {r['grads'] / 1e6:.0f} MB), {r['hooked_peak'] / 1e6:.0f} MB hooked "
            f"(bound {bound(r, bucket) / 1e6:.0f} MB)")
