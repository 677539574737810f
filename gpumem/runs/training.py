"""What a rank needs to train a teaching Llama: the same model, data and hyper-parameters on
every rank, and the device that rank owns.

Rank functions of any chapter build on these, so that a run on N ranks can be compared with one
process training on the whole batch (the same seed gives the same weights and tokens).
"""

import gc

import torch

from ..memory import models
from ..memory.llama import Llama

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def batches(cfg, steps: int, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """(steps, batch, seq + 1) token ids, the same on every rank (each takes its slice)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, cfg.vocab, (steps, batch, seq + 1), generator=gen)


def build(model: str, seed: int = 0) -> Llama:
    """A registry model in fp32, identical on every rank that uses the same seed."""
    torch.manual_seed(seed)
    return Llama(models.get(model))


def device_of_rank(rank: int) -> torch.device:
    """This rank's GPU under NCCL, else the CPU (gloo)."""
    return torch.device("cuda", rank) if torch.cuda.is_available() and torch.distributed.get_backend() == "nccl" \
        else torch.device("cpu")


def reset_peak(device: torch.device) -> None:
    """Start a CUDA peak measurement on ``device`` that counts this run only: first collect what
    earlier runs in this process left in reference cycles (a GradMeter's or ZeroAdamW's hooks hold
    their model, DeepSpeed's engines hold theirs; without a collection an earlier stage's weights
    and moments stay allocated and inflate the next stage's peak), then reset the allocator's peak.
    On the CPU it only collects."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
