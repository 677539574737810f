"""Rank functions for chapter 02 (run them with ``gpumem.launch.run``), and their references."""

import torch

from . import models
from .llama import Llama
from .zero import ZeroAdamW

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def batches(cfg, steps: int, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """(steps, batch, seq + 1) token ids, the same on every rank (each takes its slice)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, cfg.vocab, (steps, batch, seq + 1), generator=gen)


def build(model: str, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(models.get(model))   # fp32, identical on every rank


def device_of_rank(rank: int) -> torch.device:
    return torch.device("cuda", rank) if torch.cuda.is_available() and torch.distributed.get_backend() == "nccl" \
        else torch.device("cpu")


def from_scratch(rank: int, world: int, stage: int, model: str = "tiny", steps: int = 3,
                 seq: int = 32, batch_per_rank: int = 2, seed: int = 0) -> dict:
    """Train with :class:`ZeroAdamW`; return losses, measured bytes, communication, weights."""
    device = device_of_rank(rank)
    net = build(model, seed).to(device)
    data = batches(net.cfg, steps, world * batch_per_rank, seq, seed).to(device)
    opt = ZeroAdamW(net, stage, **HYPER)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, measured = [], None
    for step in range(steps):
        mine = data[step, rank * batch_per_rank:(rank + 1) * batch_per_rank]
        loss = net(mine[:, :-1], mine[:, 1:])
        loss.backward()
        opt.step()
        measured = opt.state_bytes()      # after the step, before gradients are dropped
        opt.zero_grad()
        losses.append(loss.item())
    comm = {"volume": dict(opt.comm.volume), "calls": dict(opt.comm.calls),
            "per_step": opt.comm.total() / steps}
    weights = [w.cpu() for w in opt.full_parameters()]
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"rank": rank, "stage": stage, "losses": losses, "bytes": measured, "comm": comm,
            "cuda_max_memory_allocated": cuda_peak,
            "n_params": sum(opt.numel.values()),
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
