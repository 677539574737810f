"""A checkpoint plan on a real GPU: ``torch.cuda.max_memory_allocated`` and seconds per step.

On the CPU the course measures bytes with the tracer (``recompute_trace``); on a CUDA device the
allocator's own peak is the measurement, and wall time shows what recomputation costs. The
model is a Llama of about 1.1 B parameters (Llama-3.2-1B's widths, 16 layers, a 32,000-token
vocabulary so that the loss does not dominate), in bf16, forward and backward only: the
optimizer step does not depend on the plan.
"""

import statistics
import time

import torch

from . import models, recompute, tracing
from .llama import Llama
from .models import ModelConfig
from .recompute_plans import plan as make_plan

GPU_1B = ModelConfig("llama-1b-probe", 16, 2048, 32, 8, 8192, 32000)


def cuda_step(cfg: ModelConfig | str = GPU_1B, plan: str = "none", impl: str = "torch",
              seq: int = 2048, micro_batch: int = 1, steps: int = 3, seed: int = 0) -> dict:
    """Peak bytes above what is held before the step (parameters), and the median seconds of
    ``steps`` forward+backward steps after one warm-up, on the current CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_step needs a CUDA GPU")
    cfg = models.get(cfg) if isinstance(cfg, str) else cfg
    p = make_plan(plan, cfg.n_layers)
    torch.cuda.empty_cache()
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(tracing.param_dtype("mixed"))
    try:
        with torch.device("cuda"):
            net = Llama(cfg)
    finally:
        torch.set_default_dtype(old)
    tokens = torch.randint(0, cfg.vocab, (micro_batch, seq + 1), device="cuda")
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)

    def step():
        recompute.loss_of(net, inputs, targets, "flash", p, impl).backward()
        net.zero_grad(set_to_none=True)

    step()                                  # warm-up: kernels chosen, workspaces allocated
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated()
    out = {"device": torch.cuda.get_device_name(), "model": cfg.name, "plan": p.name, "impl": impl,
           "seq": seq, "micro_batch": micro_batch, "held_before": held, "peak": peak,
           "peak_above_held": peak - held, "seconds_per_step": statistics.median(seconds)}
    del net
    torch.cuda.empty_cache()
    return out
