"""Chapter 02's from-scratch ZeRO rank functions (run with ``gpumem.runs.launch.run``), and the
single-process reference they are compared with."""

import torch

from gpumem.runs.gradmeter import GradMeter
from gpumem.runs.training import HYPER, batches, build, device_of_rank
from gpumem.runs.zero import ZeroAdamW


def from_scratch(rank: int, world: int, stage: int, model: str = "tiny", steps: int = 3,
                 seq: int = 32, batch_per_rank: int = 2, seed: int = 0, bucket_bytes: int = 0) -> dict:
    """Train with :class:`ZeroAdamW`; return losses, measured bytes (after the step, and the peak
    of gradient bytes during backward), communication, weights."""
    device = device_of_rank(rank)
    net = build(model, seed).to(device)
    data = batches(net.cfg, steps, world * batch_per_rank, seq, seed).to(device)
    opt = None
    meter = GradMeter(net.parameters(), extra=lambda: opt.shard_bytes())   # its hooks run first
    opt = ZeroAdamW(net, stage, bucket_bytes=bucket_bytes, **HYPER)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, measured, peaks = [], None, []
    for step in range(steps):
        mine = data[step, rank * batch_per_rank:(rank + 1) * batch_per_rank]
        loss = net(mine[:, :-1], mine[:, 1:])
        meter.reset()
        loss.backward()
        meter.sample()                    # the moment backward returns
        peaks.append({"full_grads": meter.peak_full, "full_grads_and_shards": meter.peak})
        opt.step()
        measured = opt.state_bytes()      # after the step, before gradients are dropped
        opt.zero_grad()
        losses.append(loss.item())
    comm = {"volume": dict(opt.comm.volume), "calls": dict(opt.comm.calls),
            "per_step": opt.comm.total() / steps}
    weights = [w.cpu() for w in opt.full_parameters()]
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"rank": rank, "stage": stage, "losses": losses, "bytes": measured, "comm": comm,
            "grad_peak_during_backward": max(peaks, key=lambda d: d["full_grads_and_shards"]),
            "cuda_max_memory_allocated": cuda_peak,
            "n_params": sum(opt.numel.values()),
            "largest_param": max(opt.numel.values()),
            "weights": weights if rank == 0 else None}


def reference(world: int, model: str = "tiny", steps: int = 3, seq: int = 32, batch_per_rank: int = 2,
              seed: int = 0) -> dict:
    """The same training in one process with torch.optim.AdamW on the whole batch."""
    net = build(model, seed)
    data = batches(net.cfg, steps, world * batch_per_rank, seq, seed)
    opt = torch.optim.AdamW(net.parameters(), foreach=False, **HYPER)
    losses = []
    for step in range(steps):
        loss = net(data[step, :, :-1], data[step, :, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": [p.detach().clone() for p in net.parameters()]}


def from_scratch_stages(rank: int, world: int, stages=(0, 1, 2, 3), **kwargs) -> dict:
    """All stages in one launch (a fresh model and optimizer for each)."""
    return {stage: from_scratch(rank, world, stage, **kwargs) for stage in stages}


def collectives(rank: int, world: int, width: int = 2) -> dict:
    """The three collectives on small integer tensors: all-reduce, reduce-scatter, then
    all-gather of the reduce-scatter's shards (which rebuilds the all-reduce's result)."""
    import torch.distributed as dist
    x = torch.arange(1, world * width + 1, dtype=torch.float32) * 10 ** rank    # rank 0: 1 2 3 4; rank 1: 10 20 ...
    summed = x.clone()
    dist.all_reduce(summed)
    shard = torch.empty(width)
    dist.reduce_scatter_single(shard, x.clone())
    rebuilt = torch.empty(world * width)
    dist.all_gather_into_tensor(rebuilt, shard)
    return {"rank": rank, "input": x.tolist(), "all_reduce": summed.tolist(), "reduce_scatter": shard.tolist(),
            "all_gather": rebuilt.tolist()}
