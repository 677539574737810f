"""Seconds of a fine-tuning step's own terms (chapter 08 and ``plan --adapter``): the FLOPs of a
step with a frozen base, and the dequantisation a 4-bit base costs. Torch-free.

* A frozen weight gets no gradient, so the backward of each frozen matmul computes only its
  input's gradient: one matmul instead of two (2 N T FLOPs instead of 4 N T for N frozen matrix
  elements and T tokens). Attention's core has no weights: its backward is unchanged (dQ, dK, dV
  still flow to the adapters below). Each adapter (r (in + out) elements, trained) costs 2 n_a T
  forward and 4 n_a T backward, as any trained matrix (Hu et al., arXiv:2106.09685 section 4.2:
  "we do not need to calculate the gradients or maintain the optimizer states for most
  parameters"; the forward is unchanged).
* NF4 dequantisation (bitsandbytes 0.50.2 ``MatMul4Bit``): each quantised matrix is expanded to
  bf16 before its matmul in the forward and again in the backward (and in the re-run forward with
  checkpointing); each pass reads the packed codes and constants and writes 2 bytes per weight,
  memory-bound. Assumption: the kernel reaches the GPU's datasheet bandwidth (the time scales as
  1 / the share it reaches).
"""

from ..memory import finetune as F
from ..memory.recompute_cost import layer_flops, step_flops as full_step_flops
from . import compute


def lora_flops(cfg, ft: F.Finetune, tokens: int, recompute: bool = False) -> int:
    """FLOPs of a LoRA/QLoRA step by the 6 N T rule's terms: forward 2 N T, backward only the
    inputs' gradients for the frozen base (2 N T, no weight gradient), the adapters 6 n_a T, a
    re-run forward 2 N T with full checkpointing (attention's core left out, as 6 N T leaves it
    out). Full fine-tuning: 6 N T (8 N T re-running)."""
    n = cfg.n_params()
    if not ft.lora:
        return compute.train_flops(n, tokens, recompute)
    return (4 + 2 * recompute) * n * tokens + 6 * F.lora_params(cfg, ft.lora_rank, ft.lora_targets) * tokens


def step_flops(cfg, ft: F.Finetune, seq: int, batch: int, checkpoint: str = "none") -> dict:
    """Forward, backward and recompute FLOPs of one micro-batch, attention's core included and
    causal (``recompute_cost.step_flops``, as the planner prices full training). With adapters the
    frozen matmuls' backward is halved (input gradients only), the head's too, and the adapters'
    own 2 n_a T (forward, re-run), 4 n_a T (backward) are added."""
    # PyTorch's non-reentrant checkpoint stops its re-run before a layer's last matmul (W_down), whose
    # output nothing saves; with an adapter on down_proj it cannot: peft's LoRA layer runs the base
    # matmul first and its adapter (which saves the input and A x) after it, so the whole layer re-runs
    impl = "scratch" if ft.lora and "down" in ft.lora_targets else "torch"
    f = full_step_flops(cfg, seq, batch, checkpoint, impl, causal=True)
    if not ft.lora:
        return f
    lay, L = layer_flops(cfg, seq, batch, causal=True), cfg.n_layers
    head = 2 * batch * seq * cfg.d_model * cfg.vocab
    adapters = 2 * F.lora_params(cfg, ft.lora_rank, ft.lora_targets) * batch * seq
    whole = full_step_flops(cfg, seq, batch, checkpoint, "scratch", causal=True)["recompute"]
    rerun = whole / (L * lay["total"])                   # share of the layers re-run: their adapters re-run whole
    return {"forward": f["forward"] + adapters,
            "backward": L * (lay["matmuls"] + 5 * lay["core"] // 2) + head + 2 * adapters,
            "recompute": f["recompute"] + int(rerun * adapters)}


def dequant_bytes(cfg) -> float:
    """Bytes one dequantisation pass over the model moves: the packed NF4 codes and constants read
    (``finetune.nf4_bytes_per_param``) and the bf16 matrix written, for every quantised weight."""
    return sum(F.quantised_tensors(cfg)) * (F.nf4_bytes_per_param() + 2)


def dequant_seconds(cfg, hbm: float, passes: int) -> float:
    """Seconds ``passes`` dequantisation passes take at ``hbm`` bytes/s (forward and backward: 2;
    with the checkpointed re-run: 3)."""
    return passes * dequant_bytes(cfg) / hbm
