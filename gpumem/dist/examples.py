"""Tiny rank functions used by tests and the chapter to show the launcher (importable by ranks)."""

import os
import time

import torch
import torch.distributed as dist


def all_reduce_rank_ids(rank, world):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return {"rank": rank, "sum": t.item(), "pid": os.getpid()}


def fail_on_rank_one(rank, world):
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    time.sleep(60)   # the others would wait a long time; the launcher must end them
    return rank
