"""Real measurements to set beside the formulas and the fake-tensor traces.

* CPU: the same training step on real tensors under the same tracker (``tracing.trace_step``
  with ``fake=False``); every byte must equal the fake trace.
* CUDA: a real step on the GPU, measured with ``torch.cuda.max_memory_allocated``; it differs from
  the trace by the caching allocator's 512-byte rounding, cuBLAS workspaces and the CUDA flash
  kernel's own saved tensors, so it is compared within a tolerance.
"""

import torch

from . import models, tracing
from .llama import Llama
from .models import ModelConfig

# A Llama-3-8B-wide model, shallow and with a smaller vocabulary, that fits a 16 GB GPU.
GPU_PROBE = ModelConfig("8b-width-probe", 2, 4096, 32, 8, 14336, 32000)


def real_vs_fake(model: str | ModelConfig = "tiny", recipe: str = "mixed", kernel: str = "flash",
                 policy: str = "none", seq: int = 64, micro_batch: int = 2) -> dict:
    """Trace one step twice, on fake and on real CPU tensors; return both peak dicts."""
    real = tracing.trace_step(model, recipe, kernel, policy, seq, micro_batch, fake=False)
    fake = tracing.trace_step(model, recipe, kernel, policy, seq, micro_batch, fake=True)
    return {"real": real.peaks | {"total": real.total_peak},
            "fake": fake.peaks | {"total": fake.total_peak}}


def cuda_step_peak(cfg: ModelConfig | str = GPU_PROBE, recipe: str = "mixed", kernel: str = "flash",
                   policy: str = "none", seq: int = 1024, micro_batch: int = 1) -> dict:
    """Measured peak of one real training step on the current CUDA device (bytes above the
    memory held before the step: parameters and optimizer states are counted separately)."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_step_peak needs a CUDA GPU")
    cfg = models.get(cfg) if isinstance(cfg, str) else cfg
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(tracing.param_dtype(recipe))
    try:
        with torch.device("cuda"):
            model = Llama(cfg)
            opt = tracing.make_optimizer(model, recipe)
    finally:
        torch.set_default_dtype(old)
    tokens = torch.randint(0, cfg.vocab, (micro_batch, seq + 1), device="cuda")
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    tracing.training_step(model, opt, inputs, targets, kernel, policy)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    out = {"device": torch.cuda.get_device_name(), "held_before": held, "peak": peak,
           "step_peak_above_held": peak - held}
    del model, opt
    torch.cuda.empty_cache()
    return out
