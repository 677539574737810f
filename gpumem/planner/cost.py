"""The planner's cost model: seconds of one training step for a layout, term by term (torch-free).

Every term is stated, not fitted; the ranking is only as good as these assumptions.

* **compute**: forward + backward + recompute FLOPs of ``recompute_cost.step_flops`` (matmuls,
  attention's core as a causal kernel executes it (half the s x s tiles, ``causal=True``), and the
  output head), split evenly over the
  ``tp * cp * pp`` GPUs of a replica, at ``mfu`` of the GPU's dense bf16 peak (default
  ``compute.KERNEL_SHARE``, 54 %: the share kernels reach while computing, calibrated once and
  validated on published runs in :mod:`.validate`; the terms below are added to it). A re-run is
  priced as the plan's checkpoint runs it (:func:`rerun_impl`, names in :data:`RERUN`): Megatron's
  recompute (3-D layouts) and DeepSpeed's ``PipelineModule`` (``deepspeed.checkpointing.checkpoint``)
  re-run the whole segment; the other DeepSpeed layouts' model code uses
  ``torch.utils.checkpoint(use_reentrant=False)`` (``planner.config.CHECKPOINT_CODE``), which stops
  each re-run before the segment's last matmul (W_down): the early-stop re-run.
* **scores**: a kernel that materialises attention scores moves them through HBM: per score
  element 20 bytes for ``naive`` (bf16 S and P written and read in forward, P, dP and dS in
  backward) and 28 for ``eager`` (its fp32 softmax too), at the GPU's HBM bandwidth; flash 0.
* **tensor parallel** (AutoTP, no sequence parallelism): each layer all-reduces its s*b*h
  activations twice in forward (after W_o and the down projection) and twice in backward (the
  inputs' gradients of the column-parallel q/k/v and gate/up), once more per re-run forward;
  the output head all-gathers the logits (e*s*b*V) once per micro-batch. With Megatron's
  sequence parallelism (3-D layouts) each all-reduce is an all-gather plus a reduce-scatter of
  the same tensor, and the vocabulary-parallel loss gathers no logits. Exposed under DeepSpeed;
  hidden under Megatron-Core's ``--tp-comm-overlap`` (:func:`overlap_table`). Assumption: the
  overlap is free; in practice its kernels take SMs from the matmuls (NeMo reserves 16-24 SMs
  for them), which the model does not charge (the NeMo tp > 1 rows of :mod:`.validate` sit 5-9 %
  above their measurement, the tp = 1 rows 1-3 % below).
* **bubble**: the 1F1B schedule's (``gpumem.timing.schedules``, PipeDream-flush, Megatron's and
  DeepSpeed's default) ``(p - 1)(F + B)`` (divided by ``vp`` with interleaved virtual stages),
  where ``F + B`` is one micro-batch's stage time: its compute, its exposed tensor-parallel and
  context-parallel communication and its attention-score traffic.
* **context parallel** (``cp``, Megatron-Core's ring attention): each layer passes K and V around
  the ring of cp ranks (forward) and K, V with their gradients (backward), each step hidden behind
  one chunk pair's attention compute; what exceeds it is exposed (:func:`_ring_exposed`).
* **pipeline**: each micro-batch sends its activation forward and its gradient back across each
  stage boundary (``schedules.p2p_message_bytes``, ``p2p_sends``: 2 m messages on a middle
  stage), exposed; between nodes when the pipeline spans more than one node.
* **data parallel (ZeRO)**: ZeRO-0 and ZeRO-1 all-reduce the gradients once per step (S = psi x
  the gradient's bytes: DeepSpeed 0.19.8's ``use_multi_rank_bucket_allreduce``, on by default,
  all-reduces ZeRO-1/2's buckets in ``average_tensor``; ZeRO-0's engine does it after backward,
  exposed); ZeRO-1 hides it behind the last micro-batch's backward and then all-gathers the updated
  parameters (exposed, as ZeRO-2). Megatron-Core's distributed optimizer reduce-scatters instead and
  hides its all-gather behind the next forward (``--overlap-param-gather``). ZeRO-2 all-reduces
  its buckets every micro-batch (the same ``average_tensor``; each rank then keeps its slice)
  behind the backward passes and all-gathers the updated parameters once (exposed); ZeRO-3 gathers
  the parameters in forward and again in backward and reduce-scatters the gradients every
  micro-batch, hidden behind all compute (prefetch). What exceeds its window is exposed.
  Hybrid sharding (:mod:`.hybrid`): HSDP (FSDP2) gathers and reduce-scatters inside its shard
  group every micro-batch and all-reduces the 1/group shard across the replicas once a step,
  behind the last micro-batch's backward; hpZ gathers forward over all dp ranks, backward inside
  its group, and reduce-scatters over all dp ranks.
  Collectives go in buckets of ``planner.memory.DS_BUCKET`` elements (ZeRO-3's gathers of
  ``DS_PREFETCH``), each paying NCCL's latency.

* **expert parallel** (mixtures of experts, :mod:`.moe`): compute by active parameters (the top-k
  experts a token visits); with ep > 1 the experts' gradients reduce over their dp / ep
  expert-data-parallel ranks, the rest's over dp, and each MoE layer's dispatch and combine
  all-to-alls (4 a micro-batch, 2 more per re-run forward) are exposed (``timing.moe_time``).
* **optimizer**: on the GPU, AdamW's HBM traffic (``compute.optimizer_seconds``). Offloaded, the
  links of ``offload_time`` (PCIe, NVMe, CPU Adam): gradient copies down and parameter fetches
  up run during forward and backward and hide behind :data:`OFFLOAD_OVERLAP` (70 %, stated, not
  measured) of the compute time; CPU Adam, the optimizer states'
  NVMe read and write and the updated shard's upload run after backward, in series
  (DeepSpeed's default, no delayed parameter update).

Which window hides which term is :mod:`gpumem.timing.overlap`'s table for the layout's framework
(:func:`overlap_table`). Every collective's seconds are :mod:`gpumem.timing.collectives`' (alpha-beta, NCCL's ring or
tree, achieved bandwidth from published nccl-tests figures) over the group as it is placed
(:mod:`.placement`: tensor-parallel ranks adjacent in a node, data-parallel ranks strided by
tp -- one NIC per node when tp = 8, all eight when tp = 1 --, pipeline stages outermost), on the
node type of the question's GPU (``placement.node_for``). Not modelled: groups that share a
NIC at once (exact with one NIC per GPU, as on DGX nodes; optimistic on a node with fewer
NICs than GPUs), congestion, compute slowed by communication kernels.
"""

from functools import lru_cache

from ..memory import accounting, recompute_cost
from ..memory.gpus import GPU, INTER_NODE  # noqa: F401 (50 GB/s per GPU: the lab's "fast" network)
from ..memory.models import ModelConfig
from ..timing import compute, context_parallel, offload_time, overlap, schedules
from ..timing import moe_time
from . import hybrid, moe, placement
from .config import PIPE_INTERVAL
from .memory import (DS_BUCKET, DS_PREFETCH, FRAMEWORK_3D, FRAMEWORK_FSDP2, FRAMEWORK_MCORE, Layout, layers_per_stage,
                     local_params)

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
def _flops(cfg: ModelConfig, seq: int, mb: int, policy: str, impl: str, causal: bool = True) -> dict:
    return recompute_cost.step_flops(cfg, seq, mb, policy, impl, causal=causal)


def recompute_share(cfg: ModelConfig, seq: int, lay: Layout) -> float:
    """Recompute FLOPs over forward + backward FLOPs of ``lay``'s checkpoint policy, priced as
    its checkpoint re-runs (:func:`rerun_impl`), as PyTorch's FLOP counter counts them (chapter 03's
    share; the seconds use the causal count)."""
    return _flops(moe.flops_model(cfg), seq, lay.micro_batch, lay.checkpoint, rerun_impl(lay), False)["overhead"]


def overlap_table(lay: Layout) -> str:
    """The :data:`gpumem.timing.overlap.FRAMEWORKS` entry ``lay`` runs under: DeepSpeed's ZeRO
    stage (Megatron-DeepSpeed's 3-D layouts run DeepSpeed's ZeRO-1 engine), or Megatron-Core with
    its overlaps on (``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap``),
    as NeMo's performance recipes set them (``llama3_70b.pretrain_recipe_performance``:
    ``MegatronCommOverlapCallback(tp_comm_overlap=True, ...)``)."""
    if lay.framework == FRAMEWORK_MCORE:
        return "megatron-overlap"
    if lay.framework == FRAMEWORK_FSDP2:
        return "fsdp2"
    return f"deepspeed-zero{lay.zero if lay.framework == 'deepspeed' else min(lay.zero, 1)}"


def step_seconds(cfg: ModelConfig, seq: int, lay: Layout, gpu: GPU, mfu: float = compute.KERNEL_SHARE,
                 links: offload_time.Links | None = None, gpus_per_node: int = GPUS_PER_NODE,
                 inter_node: float | None = None) -> dict:
    """Seconds of one step on one GPU, by term (see the module), with ``total`` and ``bound``;
    ``inter_node``: a line rate in bytes/s per GPU between nodes instead of the node type's
    NICs (``placement.node_for``)."""
    r = accounting.RECIPE[lay.state_recipe]   # Megatron-Core reduces fp32 gradients (Layout.state_recipe)
    e = 4 if lay.recipe == "fp32" else 2
    f = _flops(moe.flops_model(cfg), seq, lay.micro_batch, lay.checkpoint, rerun_impl(lay))   # MoE: active FLOPs
    per_mb = (f["forward"] + f["backward"] + f["recompute"]) / (lay.tp * lay.pp * lay.cp)
    busy = compute.seconds(per_mb * lay.n_micro, gpu, mfu)
    mb_compute = busy / lay.n_micro
    ls = layers_per_stage(cfg, lay.pp)
    rerun = f["recompute"] / max(f["forward"], 1)          # share of a forward re-run
    local = seq // lay.cp
    scores = lay.micro_batch * (cfg.n_heads // lay.tp) * local * seq
    score_s = lay.n_micro * ls * SCORE_BYTES[lay.attention] * scores * (1 + 0.4 * rerun) / gpu.hbm
    node = placement.node_for(gpu, gpus_per_node, inter_node)
    grp = placement.groups(node, lay.tp, lay.pp, lay.dp, lay.cp)
    act = e * local * lay.micro_batch * cfg.d_model
    tp_mb = 0.0                                            # exposed TP seconds per micro-batch
    if lay.tp > 1:
        if lay.sequence_parallel:
            one = placement.seconds("all_gather", act, grp["tp"]) + placement.seconds("reduce_scatter", act, grp["tp"])
        else:
            one = placement.seconds("all_reduce", act, grp["tp"])
            tp_mb = placement.seconds("all_gather", e * local * lay.micro_batch * cfg.vocab, grp["tp"])
        tp_mb += ls * (4 + 2 * rerun) * one
    fw = overlap_table(lay)
    tp_mb = overlap.exposed(fw, "tp_collectives", tp_mb, {"forward": mb_compute / 3, "backward": mb_compute * 2 / 3})
    tp_s = lay.n_micro * tp_mb
    cp_mb = ls * _ring_exposed(cfg, seq, lay, gpu, mfu, node, e, rerun) if lay.cp > 1 else 0.0
    cp_s = lay.n_micro * cp_mb
    bubble = pp_s = 0.0
    if lay.pp > 1:
        msg = schedules.p2p_message_bytes(local, lay.micro_batch, cfg.d_model, e, tp=lay.tp,
                                          sequence_parallel=lay.sequence_parallel)
        stage = mb_compute + tp_mb + cp_mb + score_s / lay.n_micro   # F + B of one micro-batch on a stage
        fwd = f["forward"] / max(f["forward"] + f["backward"] + f["recompute"], 1)
        name = "interleaved" if lay.vp > 1 else "1f1b"
        sched = schedules.schedule(name, lay.pp, lay.n_micro, lay.vp, F=stage * fwd, B=stage * (1 - fwd),
                                   message_bytes=msg)
        bubble = sched.bubble_time
        # Megatron overlaps p2p only in the interleaved schedule ("non-interleaved schedule does not
        # support overlapping p2p communication", megatron/training/arguments.py): plain 1F1B waits
        fw_pp = "megatron" if fw == "megatron-overlap" and lay.vp == 1 else fw
        pp_s = overlap.exposed(fw_pp, "pp_p2p", sched.p2p_sends * placement.seconds("send_recv", msg, grp["pp"]),
                               {"forward": busy / 3, "backward": busy * 2 / 3})
    psi = local_params(cfg, lay.tp, lay.pp)["params"]
    dg, buckets, gathers = grp["dp"], -(-psi // DS_BUCKET), -(-psi // DS_PREFETCH)
    grads, params = psi * r.grads, psi * r.params
    windows = {"forward": busy / 3, "backward": busy * 2 / 3, "last_backward": mb_compute * 2 / 3}
    # ep > 1: the experts' gradients reduce over their own expert-data-parallel group (planner.moe)
    parts = [(n, dg if k == lay.shards else placement.place(node, lay.gpus, k, lay.tp * lay.ep))
             for n, k in moe.split_params(cfg, psi, lay)]
    gather = sum(placement.seconds("all_gather", n * r.params, g, -(-n // DS_BUCKET)) for n, g in parts) \
        if lay.zero in (1, 2) else 0.0
    if lay.zero in (0, 1):   # only Megatron-Core's distributed optimizer reduce-scatters (see the module)
        coll = "reduce_scatter" if lay.zero == 1 and lay.framework == FRAMEWORK_MCORE else "all_reduce"
        dp_comm, term = sum(placement.seconds(coll, n * r.grads, g, -(-n // DS_BUCKET)) for n, g in parts), \
            "dp_grad_reduce"
    elif lay.zero == 2:
        dp_comm = lay.n_micro * sum(placement.seconds("all_reduce", n * r.grads, g, -(-n // DS_BUCKET))
                                    for n, g in parts)
        term = "dp_grad_reduce"
    elif lay.hybrid == "none":
        dp_comm = lay.n_micro * (2 * placement.seconds("all_gather", params, dg, gathers)
                                 + placement.seconds("reduce_scatter", grads, dg, buckets))
        term = "zero3_gather"
    else:   # HSDP / hpZ: their own groups and overlap tables (.hybrid)
        dp_s, dp_comm, _ = hybrid.data_parallel(lay, node, psi, ls, gathers, buckets, busy, mb_compute)
        term = None
    if term is not None:
        dp_s = overlap.exposed(fw, term, dp_comm, windows) + overlap.exposed(fw, "dp_param_gather", gather, windows)
    off = {"h2d": 0.0, "d2h": 0.0, "nvme": 0.0, "cpu_adam": 0.0}
    if lay.offload == "none":
        optimizer = sum(compute.optimizer_seconds(n, lay.recipe, gpu, hybrid.state_shards(lay) if k == lay.shards else k,
                                                  lay.zero) for n, k in moe.split_params(cfg, psi, lay))
        offload_s = 0.0
    else:
        optimizer, offload_s, off = 0.0, *_offload(psi, lay, links, busy)
    terms = {"compute": busy, "attention_scores": score_s, "pipeline_bubble": bubble,
             "tensor_parallel": tp_s, "context_parallel": cp_s, "pipeline_p2p": pp_s, "data_parallel": dp_s,
             "optimizer": optimizer, "offload": offload_s}
    if cfg.moe:   # the experts' all-to-all (timing.moe_time), exposed; 0 at ep = 1
        ep_group = placement.place(node, lay.gpus, lay.ep, lay.tp)   # ep consecutive data-parallel ranks
        terms["expert_parallel"] = moe_time.step(ep_group, moe.a2a_rows(cfg, local * lay.micro_batch), cfg.d_model, e,
                                                 cfg.n_layers, lay.n_micro, rerun).seconds if lay.ep > 1 else 0.0
    total = sum(terms.values())
    return {**terms, "total": total, "bound": max(terms, key=terms.get),
            "data_parallel_moved_s": dp_comm + gather, "offload_terms": off}


def _ring_exposed(cfg: ModelConfig, seq: int, lay: Layout, gpu: GPU, mfu: float, node, e: int,
                  rerun: float) -> float:
    """Exposed ring-attention seconds of one layer and one micro-batch: forward, backward and the
    re-run's share of a forward (``rerun``), from :func:`gpumem.timing.context_parallel.ring_attention`
    (TransformerEngine's p2p ring, each step hidden behind one chunk's causal attention at ``mfu``)."""
    flops = context_parallel.attention_flops(cfg.d_model, seq, lay.micro_batch, lay.tp, lay.cp)
    ring = context_parallel.ring_attention(
        node, d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, seq=seq,
        micro_batch=lay.micro_batch, tp=lay.tp, cp=lay.cp, elem_bytes=e, attention_flops=flops,
        flops_per_s=gpu.bf16_flops * mfu)
    return ring.seconds_exposed + rerun * ring.exposed_forward


def assumptions(g: GPU, reserve, mfu: float, links: offload_time.Links, node, opts: dict) -> list[str]:
    """The cost model's stated figures, in words (``reserve``: a ``gpus.Reserve``; ``node``: the
    ``timing.hardware.NodeType``; ``opts``: the search's, with ``host_per_node`` and ``nvme_per_node``)."""
    link = f"NVLink {g.nvlink / 1e9:.0f} GB/s" if node.nvlink else f"PCIe {g.pcie / 1e9:.1f} GB/s"
    return [f"fits against capacity minus the reserve: {reserve.describe()}",
            f"compute at {mfu:.0%} of {g.label}'s dense bf16 peak while computing (kernel share; "
            "communication, bubbles and the optimizer are added)",
            f"nodes: {node.label}; within a node {link} per direction per GPU; between nodes "
            f"{node.nics} x {node.nic_bw / 1e9:g} GB/s NICs per node ({placement.per_gpu_network(node) / 1e9:g} GB/s per GPU)",
            "collectives priced by gpumem.timing.collectives (NCCL ring/tree, latency, achieved bandwidth) "
            "over groups placed tp-adjacent, dp strided by tp, pp outermost; pipeline bubble of 1F1B",
            f"offload links: {links.source}",
            f"host memory {opts['host_per_node'] / 1e12:g} TB and NVMe "
            f"{opts['nvme_per_node'] / 1e12:g} TB per node of {node.gpus_per_node} GPUs",
            "attention's core counted as a causal flash kernel runs it (half the s x s score tiles; "
            "PyTorch's FLOP counter, chapter 03, counts all of them)",
            "no host buffer factor (DeepSpeed's estimator multiplies host bytes by 1.5); CPU Adam at one "
            "rate for every host, shared evenly by its ranks (each rank's threads bound to its own cores, "
            "as the deepspeed launcher's --bind_cores_to_rank does; unbound, the share is optimistic); "
            "offload copies hide behind 70 % of compute (stated, not measured); ZeRO-3's working set replays DeepSpeed's prefetch, reuse and live-parameter "
            "rules with the emitted stage3_* values (a steady step; FSDP2's per-layer units are counted as "
            "DeepSpeed's); ZeRO++'s quantized weights and gradients not modelled"]


def _offload(psi: int, lay: Layout, links: offload_time.Links, busy: float) -> tuple[float, dict]:
    """Exposed offload seconds and the per-link seconds behind them, from ``offload_time.step_time``
    (DeepSpeed 0.19.8's copies for ``lay.n_micro`` micro-batches): during forward and backward the
    gradient copies (one stream), the parameter fetches and their NVMe reads; after backward what
    the step waits for of the gradient's NVMe write, the state swaps and the updated shard's upload;
    CPU Adam in series."""
    t = offload_time.step_time(psi, lay.recipe, lay.zero, lay.shards, lay.offload, lay.device, busy, links,
                               micro_batches=lay.n_micro)
    during = max(t["grad_trip"], t["h2d"] - t["h2d_after"], t["nvme_params"])
    after = t["nvme_grad_exposed"] + t["nvme_states"] + t["h2d_after"]
    cpu_adam = t["cpu_adam"]
    exposed = max(0.0, during - OFFLOAD_OVERLAP * busy) + after + cpu_adam
    return exposed, {"during_compute": during, "after_backward": after, "cpu_adam": cpu_adam}
