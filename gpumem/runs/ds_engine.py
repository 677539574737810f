"""A DeepSpeed engine on CPU ranks (or GPUs): the config the course trains with, and what an
engine holds, read from DeepSpeed's own structures.

fp32 training with ``torch_adam`` (no fused_adam build on CPU). Stage 1 and 2 keep their fp32
partition in ``single_partition_of_fp32_groups``, stage 3 in ``fp32_partitioned_groups_flat``
and each parameter's shard in ``param.ds_tensor`` (DeepSpeed 0.19.8, pinned; tests use them).
"""

import torch

from .training import HYPER


def ds_config(stage: int, batch_per_rank: int, extra_zero: dict | None = None) -> dict:
    """The DeepSpeed config of a course run: AdamW with :data:`HYPER`, one ZeRO stage."""
    return {"train_micro_batch_size_per_gpu": batch_per_rank, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": HYPER["lr"], "betas": list(HYPER["betas"]),
                                                       "eps": HYPER["eps"], "weight_decay": HYPER["weight_decay"],
                                                       "torch_adam": True}},
            "zero_optimization": {"stage": stage, **(extra_zero or {})},
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def _numel(tensors) -> int:
    return sum(t.numel() for t in tensors)


def held(engine, net, stage: int) -> dict:
    """Elements this rank holds, read from DeepSpeed's own structures."""
    opt = engine.optimizer
    if stage == 0:
        states = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
        return {"params": _numel(net.parameters()), "fp32_partition": 0, "optimizer_states": _numel(states)}
    inner = opt.optimizer
    states = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    if stage == 3:
        return {"params": sum(p.ds_tensor.numel() for p in net.parameters()),
                "fp32_partition": _numel(opt.fp32_partitioned_groups_flat),
                "optimizer_states": _numel(states)}
    return {"params": _numel(net.parameters()), "fp32_partition": _numel(opt.single_partition_of_fp32_groups),
            "optimizer_states": _numel(states)}
