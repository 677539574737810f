"""The planner's cost model: seconds of one training step for a layout, term by term (torch-free).

Every term is stated, not fitted; the ranking is only as good as these assumptions.

* **compute**: forward + backward + recompute FLOPs of ``recompute_cost.step_flops`` (matmuls,
  attention's core and the output head, as PyTorch counts them), split evenly over the ``tp * pp``
  GPUs of a replica, at ``mfu`` (40 %, ``speed.MFU``) of the GPU's dense bf16 peak. A re-run is
  priced as the plan's checkpoint runs it (:func:`rerun_impl`, names in :data:`RERUN`): Megatron's
  recompute (3-D layouts) and DeepSpeed's ``PipelineModule`` (``deepspeed.checkpointing.checkpoint``)
  re-run the whole segment; the other DeepSpeed layouts' model code uses
  ``torch.utils.checkpoint(use_reentrant=False)`` (``planner.config.CHECKPOINT_CODE``), which stops
  each re-run before the segment's last matmul (W_down): the early-stop re-run.
* **scores**: a kernel that materialises attention scores moves them through HBM: per score
  element 20 bytes for ``naive`` (bf16 S and P written and read in forward, P, dP and dS in
  backward) and 28 for ``eager`` (its fp32 softmax too), at the GPU's HBM bandwidth; flash 0.
* **bubble**: 1F1B pipeline idle time, (pp - 1) / micro-batches x compute.
* **tensor parallel** (AutoTP, no sequence parallelism): each layer all-reduces its s*b*h
  activations twice in forward (after W_o and the down projection) and twice in backward (the
  inputs' gradients of the column-parallel q/k/v and gate/up), once more per re-run forward; a
  ring all-reduce moves 2 (tp - 1) / tp of the tensor per rank. The output head gathers the
  logits (e*s*b*V x (tp - 1) / tp) once per micro-batch. On NVLink (within a node), exposed.
  With Megatron's sequence parallelism (3-D layouts) each all-reduce is an all-gather plus a
  reduce-scatter of the same volume, and the vocabulary-parallel loss gathers no logits.
* **pipeline**: each micro-batch sends its s*b*h activations forward and their gradient back
  across each stage boundary, exposed.
* **data parallel (ZeRO)**, each rank moving (dp - 1) / dp of each collective (a ring):
  ZeRO-0/1 all-reduce the gradients once per step (2 psi), hidden behind the last micro-batch's
  backward, and ZeRO-1 then all-gathers the updated parameters (psi, exposed, as ZeRO-2);
  ZeRO-2 reduce-scatters every micro-batch (psi) behind the backward passes and
  all-gathers the updated parameters once (psi, exposed); ZeRO-3 gathers the parameters in
  forward and again in backward and reduce-scatters the gradients every micro-batch (3 psi),
  hidden behind all compute (prefetch). What exceeds its window is exposed. The link is NVLink
  when the group fits in one node, else :data:`INTER_NODE` per GPU.
* **optimizer**: on the GPU, AdamW's HBM traffic (``speed.optimizer_seconds``). Offloaded, the
  links of ``offload_cost`` (PCIe, NVMe, CPU Adam): gradient copies down and parameter fetches
  up run during forward and backward and hide behind :data:`OFFLOAD_OVERLAP` (70 %, stated, not
  measured) of the compute time; CPU Adam, the optimizer states'
  NVMe read and write and the updated shard's upload run after backward, in series
  (DeepSpeed's default, no delayed parameter update).

Bandwidths are link peaks per direction (``gpus``); NCCL reaches less, so communication times
are optimistic.
"""

from functools import lru_cache

from ..memory import accounting, offload_cost, recompute_cost, speed
from ..memory.gpus import GPU, INTER_NODE
from ..memory.models import ModelConfig
from .config import PIPE_INTERVAL
from .memory import FRAMEWORK_3D, Layout, layers_per_stage, local_params

GPUS_PER_NODE = 8
SCORE_BYTES = {"flash": 0, "naive": 20, "eager": 28}
OFFLOAD_OVERLAP = 0.7      # share of compute time that offload copies can hide behind (stated)
# The two prices of a re-run, by name (chapter 03's names): recompute_cost.step_flops(..., impl=KEY)
RERUN = recompute_cost.PRICE_NAMES


def rerun_impl(lay: Layout) -> str:
    """How ``lay``'s checkpoint re-runs a segment, as ``recompute_cost``'s ``impl``: ``scratch``
    (the whole segment) for Megatron-DeepSpeed's ``--recompute-granularity full`` (its
    ``CheckpointFunction`` re-runs the whole function) and for DeepSpeed's ``PipelineModule``
    with an ``activation_checkpoint_interval`` (``deepspeed.checkpointing.checkpoint``, reentrant);
    ``torch`` (early stop) where the model's code checkpoints with
    ``torch.utils.checkpoint(use_reentrant=False)``, as the other DeepSpeed layouts' does."""
    if lay.framework == FRAMEWORK_3D or (lay.pp > 1 and lay.checkpoint in PIPE_INTERVAL):
        return "scratch"
    return "torch"


@lru_cache(maxsize=4096)
def _flops(cfg: ModelConfig, seq: int, mb: int, policy: str, impl: str) -> dict:
    return recompute_cost.step_flops(cfg, seq, mb, policy, impl)


def recompute_share(cfg: ModelConfig, seq: int, lay: Layout) -> float:
    """Recompute FLOPs over forward + backward FLOPs of ``lay``'s checkpoint policy, priced as
    its checkpoint re-runs (:func:`rerun_impl`)."""
    return _flops(cfg, seq, lay.micro_batch, lay.checkpoint, rerun_impl(lay))["overhead"]


def _bw(gpu: GPU, crosses_node: bool, inter_node: float = INTER_NODE) -> float:
    if crosses_node:
        return inter_node
    return gpu.nvlink or gpu.pcie


def step_seconds(cfg: ModelConfig, seq: int, lay: Layout, gpu: GPU, mfu: float = speed.MFU,
                 links: offload_cost.Links | None = None, gpus_per_node: int = GPUS_PER_NODE,
                 inter_node: float = INTER_NODE) -> dict:
    """Seconds of one step on one GPU, by term (see the module), with ``total`` and ``bound``;
    ``inter_node``: bytes/s per GPU between nodes."""
    r = accounting.RECIPE[lay.recipe]
    e = 4 if lay.recipe == "fp32" else 2
    f = _flops(cfg, seq, lay.micro_batch, lay.checkpoint, rerun_impl(lay))
    per_mb = (f["forward"] + f["backward"] + f["recompute"]) / (lay.tp * lay.pp)
    compute = speed.seconds(per_mb * lay.n_micro, gpu, mfu)
    ls = layers_per_stage(cfg, lay.pp)
    rerun = f["recompute"] / max(f["forward"], 1)          # share of a forward re-run
    scores = lay.micro_batch * (cfg.n_heads // lay.tp) * seq * seq
    score_s = lay.n_micro * ls * SCORE_BYTES[lay.attention] * scores * (1 + 0.4 * rerun) / gpu.hbm
    bubble = compute * (lay.pp - 1) / lay.n_micro
    act = e * seq * lay.micro_batch * cfg.d_model
    tp_bytes = 0.0
    if lay.tp > 1:
        logits = 0 if lay.sequence_parallel else e * seq * lay.micro_batch * cfg.vocab   # the head's gathered output
        tp_bytes = lay.n_micro * (ls * (8 + 4 * rerun) * act + logits) * (lay.tp - 1) / lay.tp
    tp_s = tp_bytes / _bw(gpu, lay.tp > gpus_per_node, inter_node)
    pp_s = 0.0
    if lay.pp > 1:
        pp_s = lay.n_micro * 2 * act / lay.tp / _bw(gpu, lay.tp * lay.dp >= gpus_per_node, inter_node)
    psi = local_params(cfg, lay.tp, lay.pp)["params"]
    ring = (lay.dp - 1) / lay.dp
    dp_link = _bw(gpu, lay.tp * lay.dp > gpus_per_node, inter_node)
    mb_compute = compute / lay.n_micro
    if lay.zero in (0, 1):
        dp_comm, window = 2 * psi * r.grads * ring / dp_link, mb_compute * 2 / 3
        exposed_extra = psi * r.params * ring / dp_link if lay.zero == 1 else 0.0
    elif lay.zero == 2:
        dp_comm, window = lay.n_micro * psi * r.grads * ring / dp_link, compute * 2 / 3
        exposed_extra = psi * r.params * ring / dp_link
    else:
        dp_comm = lay.n_micro * psi * (2 * r.params + r.grads) * ring / dp_link
        window, exposed_extra = compute, 0.0
    dp_s = max(0.0, dp_comm - window) + exposed_extra
    off = {"h2d": 0.0, "d2h": 0.0, "nvme": 0.0, "cpu_adam": 0.0}
    if lay.offload == "none":
        optimizer = speed.optimizer_seconds(psi, lay.recipe, gpu, lay.dp, lay.zero)
        offload_s = 0.0
    else:
        optimizer, offload_s, off = 0.0, *_offload(psi, lay, links, compute)
    terms = {"compute": compute, "attention_scores": score_s, "pipeline_bubble": bubble,
             "tensor_parallel": tp_s, "pipeline_p2p": pp_s, "data_parallel": dp_s,
             "optimizer": optimizer, "offload": offload_s}
    total = sum(terms.values())
    return {**terms, "total": total, "bound": max(terms, key=terms.get),
            "data_parallel_moved_s": dp_comm + exposed_extra, "offload_terms": off}


def _offload(psi: int, lay: Layout, links: offload_cost.Links, compute: float) -> tuple[float, dict]:
    """Exposed offload seconds and the per-link seconds behind them (see the module)."""
    t = offload_cost.offload_traffic(psi, lay.recipe, lay.zero, lay.dp, lay.offload, lay.device)
    s = accounting.shard(psi, lay.dp)
    p16 = accounting.RECIPE[lay.recipe].params
    params_off = lay.offload == "optimizer+params"
    during = lay.n_micro * t["d2h"] / links.d2h                     # gradients down, every micro-batch
    after = 0.0
    if params_off:
        during += lay.n_micro * t["h2d"] / links.h2d                # fetches in forward and backward
    else:
        after += t["h2d"] / links.h2d                                # the updated 16-bit shard, once
    nvme_state_read = t["nvme_read"] - (p16 * s if params_off else 0)
    if lay.device == "nvme":
        after += nvme_state_read / links.nvme_read + t["nvme_write"] / links.nvme_write
        if params_off:
            during += lay.n_micro * 2 * p16 * s / links.nvme_read   # parameters read for each pass
    cpu_adam = s / links.cpu_adam
    exposed = max(0.0, during - OFFLOAD_OVERLAP * compute) + after + cpu_adam
    return exposed, {"during_compute": during, "after_backward": after, "cpu_adam": cpu_adam}
