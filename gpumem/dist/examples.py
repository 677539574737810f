"""Tiny rank functions used by tests and the chapter to show the launcher (importable by ranks)."""

import os
import time

import torch
import torch.distributed as dist


def all_reduce_rank_ids(rank, world):
    """All-reduce the rank numbers, to show the launcher returning each rank's result."""
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return {"rank": rank, "sum": t.item(), "pid": os.getpid()}


def fail_on_rank_one(rank, world):
    """Rank 1 raises while the others sleep, to show the launcher ending every rank on a failure."""
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    time.sleep(60)   # the others would wait a long time; the launcher must end them
    return rank
