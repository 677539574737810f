"""Chapter 06's rank function: a planned DeepSpeed config trained for real on CPU ranks, and the
bytes DeepSpeed then holds on each rank, read from its own structures (DeepSpeed 0.19.8, pinned).

The config is the planner's, with one change for CPU ranks: ``torch_adam`` (no fused Adam
build on a CPU). The model is trained with the plan's checkpoint policy and attention kernel.
After the last step each ZeRO-3 rank holds (``DeepSpeedZeroOptimizer_Stage3``):

* parameters: each parameter's bf16 shard (``param.ds_tensor``) and, for the persistent ones
  (the norm weights, below ``stage3_param_persistence_threshold``), the whole tensor too;
* gradients: the flat bf16 buffer of its gradient partition (``grad_partitions_flat_buffer``);
* optimizer: the fp32 master partition (``fp32_partitioned_groups_flat``) and AdamW's fp32
  ``exp_avg`` and ``exp_avg_sq``;
* buffers: the reduce bucket (``ipg_buckets[dtype].buffer``, ``reduce_bucket_size`` elements).

On CUDA the rank also resets the allocator's peak statistics before training and reports
``torch.cuda.max_memory_allocated()`` (``peak_allocated``) after it; on CPU that entry is None.
"""

import contextlib
import copy
import io
import logging

import torch

from gpumem.runs.training import batches, build, device_of_rank


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def held_bytes(engine, net) -> dict:
    """Bytes a ZeRO-3 rank holds, by part (see the module), counted from DeepSpeed's tensors."""
    opt = engine.optimizer
    params = [p.ds_tensor for p in net.parameters()] + [p.data for p in net.parameters() if p.data.numel()]
    states = [v for s in opt.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    buckets = [b.buffer for b in opt.ipg_buckets.values() if getattr(b, "buffer", None) is not None]
    return {"params": _bytes(params), "grads": _bytes([opt.grad_partitions_flat_buffer]),
            "optimizer": _bytes(opt.fp32_partitioned_groups_flat) + _bytes(states),
            "buffers": _bytes(buckets),
            "persistent": sorted(n for n, p in net.named_parameters() if p.ds_persist)}


def run_plan(rank: int, world: int, model: str, config: dict, kernel: str, policy: str, seq: int,
             steps: int = 2, seed: int = 0) -> dict:
    """Train ``steps`` steps of ``model`` under ``config`` (a planner's ZeRO-3 DeepSpeed config);
    return this rank's losses and held bytes."""
    import deepspeed
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    if config["zero_optimization"]["stage"] != 3:
        raise ValueError("the proof reads ZeRO-3's structures; plan with a budget that needs ZeRO-3")
    config = copy.deepcopy(config)
    config["optimizer"]["params"]["torch_adam"] = True        # CPU ranks: no fused Adam build
    device = device_of_rank(rank)
    net = build(model, seed).to(device)
    mb, accum = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    data = batches(net.cfg, steps * accum, world * mb, seq, seed).to(device)
    cuda = device.type == "cuda" if hasattr(device, "type") else str(device).startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with contextlib.redirect_stdout(io.StringIO()):
        engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    losses = []
    for i in range(steps * accum):
        mine = data[i, rank * mb:(rank + 1) * mb]
        loss = engine(mine[:, :-1], mine[:, 1:], kernel=kernel, policy=policy)
        engine.backward(loss)
        engine.step()
        losses.append(loss.float().item())
    out = {"rank": rank, "losses": losses, "held": held_bytes(engine, net),
           "dtype": str(next(net.parameters()).dtype),
           "peak_allocated": torch.cuda.max_memory_allocated() if cuda else None}
    engine.destroy()
    return out


def config_batch(rank: int, world: int, config: dict) -> dict:
    """Build DeepSpeed's own ``DeepSpeedConfig`` from ``config`` on this rank (no mpu, as an
    AutoTP engine starts) and return the batch it settles on, or the assertion it raises."""
    from deepspeed.runtime.config import DeepSpeedConfig
    try:
        c = DeepSpeedConfig(copy.deepcopy(config))
    except AssertionError as exc:
        return {"error": str(exc).splitlines()[0]}
    return {"train_batch_size": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
            "accumulation": c.gradient_accumulation_steps, "world": c.world_size}
