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


def sleep_then_return(rank, world, seconds: float = 60):
    """Every rank sleeps, then returns its number: a run to stop or kill from outside."""
    time.sleep(seconds)
    return rank



def exit_on_rank_one(rank, world):
    """Rank 1 ends with status 0 before returning (no result) while the others sleep."""
    if rank == 1:
        os._exit(0)
    time.sleep(60)
    return rank


def make_inductor_cache(rank, world):
    """Look up inductor's cache folder as every ``torch.compile`` wrapper does (DeepSpeed makes
    some at import), which creates it; return where it is."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return cache_dir()


def exit_code_on_rank_one_while_rank_zero_waits(rank, world, code: int = 3):
    """Rank 1 ends abruptly with ``code``; rank 0 waits at a barrier and fails as a consequence
    (gloo: "Connection closed by peer"): the launcher must name rank 1, the cause."""
    if rank == 1:
        os._exit(code)
    dist.barrier()
    return rank


def make_temp_folder(rank, world):
    """Make a folder in the temp directory as libraries do (DeepSpeed's compile checks); return it."""
    import tempfile
    return tempfile.mkdtemp()


def deepspeed_accelerator(rank, world):
    """The accelerator DeepSpeed picks in this rank, and the ``DS_ACCELERATOR`` the rank was given."""
    from deepspeed.accelerator import get_accelerator
    return {"DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR"), "name": get_accelerator().device_name()}
