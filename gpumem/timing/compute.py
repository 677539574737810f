"""The compute term of the time engine: a training step's FLOPs at a stated MFU, and the optimizer
step's HBM traffic.

* Compute: a dense transformer's forward and backward cost 6 FLOPs per parameter per token
  (2 forward, 4 backward; Kaplan et al., arXiv:2001.08361); full activation recomputation re-runs
  the forward, 8. The attention scores add 12*L*h*s FLOPs per token (QK^T and PV, forward and
  backward, counted without the causal half), which 6*Psi leaves out.
* MFU (model FLOPs utilisation) is the share of the GPU's peak that a run achieves on those
  FLOPs. Meta reports 38-43 % bf16 MFU training Llama 3 405B on H100s (arXiv:2407.21783,
  Table 4); the course states 40 % (:data:`MFU`) where one number stands for a whole step.
* The planner adds the other terms (communication, bubbles, the optimizer) itself, so it prices
  the compute alone at the share of peak reached while computing, :data:`KERNEL_SHARE` = 54 %, on
  the FLOPs the kernels execute (attention's core counted causally, half the s x s tiles).
  Calibrated once: NVIDIA's Llama 3.1 8B NeMo run on one DGX H100 (dgxc-benchmarking, 59.37 %
  MFU in Megatron's count, which takes the whole score matrix; a step the cost model finds 99 %
  compute) is matched at 0.540; :mod:`gpumem.planner.validate` then predicts the other published
  runs with it. Assumption, with its effect: compute seconds scale as 1 / share, so 0.05 either way
  moves a compute-bound prediction by about 9 %. Tensor parallelism's narrower matrices, and small
  models' (hidden 2,304), run at a
  lower share in practice; the model ignores it (one share for every shape).
* The optimizer step does few FLOPs per byte: it is bound by HBM bandwidth. AdamW reads each
  gradient, the optimizer states (and the weights, where there is no master copy) and writes
  the states and the weights back: :func:`optimizer_bytes_per_param`.

Torch-free; GPU figures come from ``gpumem.memory.gpus``, the bytes per parameter from
``gpumem.memory.accounting``.
"""

from ..errors import UsageError, one_of, positive_int
from ..memory import accounting, gpus as gpu_table
from ..memory.models import ModelConfig

MFU = 0.40              # end-to-end share of peak: a whole step in one number
KERNEL_SHARE = 0.54     # share of peak while computing: the planner's compute term (see above)


def train_flops(n_params: int, tokens: int, recompute: bool = False) -> int:
    """Model FLOPs of one training step over ``tokens`` tokens: 6 x params x tokens (8 with full
    recomputation)."""
    n_params, tokens = positive_int(n_params, "parameter count"), positive_int(tokens, "token count")
    return (8 if recompute else 6) * n_params * tokens


def attention_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """FLOPs of the attention scores (QK^T and PV, forward and backward) that 6*Psi leaves out."""
    seq, batch = positive_int(seq, "sequence length"), positive_int(batch, "micro-batch")
    return 12 * cfg.n_layers * cfg.d_model * seq * seq * batch


def seconds(flops: float, gpu: str | gpu_table.GPU = "h100-80gb", mfu: float = MFU) -> float:
    """Seconds one GPU needs for ``flops`` at ``mfu`` of its dense bf16 peak."""
    g = gpu_table.get(gpu) if isinstance(gpu, str) else gpu
    if not 0 < mfu <= 1:
        raise UsageError(f"MFU must be a share between 0 and 1, got {mfu!r}")
    if not g.bf16_flops:
        raise UsageError(f"{g.name} has no bf16 tensor cores; accepted: a GPU with a bf16 figure")
    return flops / (g.bf16_flops * mfu)


def optimizer_bytes_per_param(recipe: str) -> int:
    """HBM bytes AdamW moves per parameter in one step: reads gradient + states (+ weights when
    no master copy exists), writes states + weights. mixed 28, pure-bf16 14, fp32 28."""
    r = accounting.recipe(one_of(recipe, accounting.RECIPES, "recipe"))
    has_master = any(label.startswith("master") for label, _ in r.optimizer)
    reads = r.grads + r.optimizer_bytes + (0 if has_master else r.params)
    writes = r.optimizer_bytes + r.params
    return reads + writes


def optimizer_seconds(n_params: int, recipe: str, gpu: str | gpu_table.GPU = "h100-80gb",
                      gpus: int = 1, zero: int = 0) -> float:
    """Seconds of one AdamW step at full HBM bandwidth, for the parameters one GPU updates (its
    1/N shard from ZeRO stage 1 on)."""
    g = gpu_table.get(gpu) if isinstance(gpu, str) else gpu
    mine = accounting.shard(positive_int(n_params, "parameter count"), gpus) if zero >= 1 else n_params
    return optimizer_bytes_per_param(recipe) * mine / g.hbm
