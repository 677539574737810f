"""Data-parallel sharding layouts over whole nodes, per training step: where each collective runs,
what crosses the network, and the step's seconds on the time engine.

A step is ``micro_batches`` forward/backward passes (gradient accumulation) and one optimizer step,
on every GPU of ``nodes`` nodes. The layouts (per GPU, N = all GPUs, r = GPUs per node):

* ``zero3`` -- ZeRO-3 / FSDP FULL_SHARD over all N: every micro-batch gathers the weights twice
  and reduce-scatters the gradients over the whole group (:mod:`.zero3_cost`).
* ``hpz`` -- DeepSpeed ZeRO++ hpZ (``zero_hpz_partition_size`` = r): as ``zero3``, but backward
  gathers from a secondary copy sharded only inside the node, at 2 psi / r more bytes per GPU;
  forward's gathers and the gradient reduce-scatter still span all N (Wang et al., ZeRO++,
  arXiv:2306.10209, sec. 3.2).
* ``mics`` -- shard inside a node, replicate across nodes: MiCS (Zhang et al., VLDB 2022,
  arXiv:2205.00119; DeepSpeed's ``mics_shard_size``, which DeepSpeed 0.19.8 refuses as removed,
  ``runtime/config.py`` line 120), PyTorch FSDP ``HYBRID_SHARD`` and FSDP2 HSDP (``fully_shard``
  on a 2-D device mesh). ZeRO-3 over the r GPUs of a node every micro-batch; once per step each
  GPU all-reduces its gradient shard, 2 psi / r bytes, with its peers on the other nodes (MiCS's
  2-hop synchronisation at the accumulation boundary; FSDP2 with ``set_requires_all_reduce(False)``
  until the last micro-batch).
* ``zero1`` -- ZeRO-1 over all N: gradients stay local until the boundary (DeepSpeed engine.py
  line 3088, "Communicate only at gradient accumulation boundaries"), then one reduce-scatter of
  the bf16 gradients and one all-gather of the updated bf16 weights, in 5e8-element buckets.

Compute: 6 x psi x tokens per micro-batch at ``mfu`` of the GPU's dense bf16 peak, by default
:data:`gpumem.timing.compute.KERNEL_SHARE` (the planner's compute term), so that the window
the traffic hides behind and the step (compute + exposed) are priced as the planner prices them.

Overlap. ZeRO-3's and hpZ's collectives hide behind the compute of the pass they serve (as in
:mod:`.zero3_cost`); the once-per-step collectives of ``mics`` and ``zero1`` are counted exposed
(an assumption that favours ``zero3``: frameworks overlap part of them with the last backward).
Concurrent groups share a node's NICs: r groups of one rank per node on a node with one NIC send
through the same port (:func:`concurrent_time`).
"""

import dataclasses
import math

from ..errors import UsageError, one_of
from ..memory import accounting, models
from . import compute
from . import collectives, hardware, zero3_cost

LAYOUTS = {"zero3": "ZeRO-3 over all GPUs", "hpz": "ZeRO++ hpZ (backward gathers in the node)",
           "mics": "shard in node, replicate across (MiCS / HSDP)", "zero1": "ZeRO-1 over all GPUs"}
BUCKET = 500_000_000      # elements: DeepSpeed's reduce_bucket_size and allgather_bucket_size defaults
# A cluster of chapter 07's question: DGX H100's GPUs, NVLink and host, but one 25 Gb/s Ethernet
# port per node between nodes. Hypothetical (a teaching case, no product); the NIC is assumed to
# reach NDR's 47/50 share (collectives.NETWORK_EFFICIENCY). Effect: every cross-node time on it.
ETHERNET_25G = dataclasses.replace(
    hardware.node("dgx-h100"), name="h100-25gbe", label="8x H100 SXM, one 25 Gb/s port per node",
    nics=1, nic_bw=25 * hardware.Gbps, fabric="Ethernet (25 GbE)", nvls_busbw=None,
    sources={"nics, nic_bw": "assumption: the question's cluster (one 25 Gb/s port per node)"})


def concurrent_time(collective: str, nbytes: float, group: hardware.Group,
                    groups_per_node: int = 1) -> collectives.CollectiveTime:
    """:func:`collectives.collective_time` when ``groups_per_node`` groups of this shape run at
    once and their ranks on a node share its NICs (e.g. the r cross-node groups of hybrid
    sharding): the network term grows by the NICs the group assumed for itself over those the
    node really has for all of them."""
    t = collectives.collective_time(collective, nbytes, group)
    node, r = group.node, group.ranks_per_node
    if group.nodes == 1 or groups_per_node == 1:
        return t
    share = groups_per_node * node.nics_for(r) / node.nics_for(groups_per_node * r)
    best = None
    for algorithm in ("ring", "tree"):
        try:
            one = collectives.collective_time(collective, nbytes, group, algorithm=algorithm)
        except UsageError:
            continue
        links = dict(one.links)
        links["network"] = links.get("network", 0.0) * share
        worst = max(links, key=links.get)
        scaled = dataclasses.replace(
            one, bandwidth_s=links[worst] / collectives.PROTOCOL_SHARE[(one.algorithm, one.protocol)],
            binding=worst, links=tuple(sorted(links.items())))
        if best is None or scaled.seconds < best.seconds:
            best = scaled
    return best or t


def _chunks(total_bytes: int, elem_bytes: int = 2) -> list[int]:
    n = math.ceil(total_bytes / (BUCKET * elem_bytes))
    return [total_bytes // n] * n


def layout_step(layout: str, model: str, cluster: hardware.Cluster, micro_batches: int = 1,
                tokens_per_gpu: int = 4096, mfu: float = compute.KERNEL_SHARE, recipe: str = "mixed") -> dict:
    """One training step of ``layout`` (:data:`LAYOUTS`) on every GPU of ``cluster``: model-state
    bytes per GPU, communication seconds per micro-batch and per step, the seconds of them that
    cross the network, what stays exposed after overlap, and the step's seconds."""
    one_of(layout, tuple(LAYOUTS), "layout")
    node, cfg = cluster.node, models.get(model)
    psi, r, n = cfg.n_params(), node.gpus_per_node, cluster.gpus
    everyone, in_node = cluster.group(n), cluster.group(r)
    gpu = node.gpu_name
    compute_s = compute.seconds(compute.train_flops(psi, tokens_per_gpu), node.gpu, mfu)
    per_mb, per_step, exposed_mb = 0.0, 0.0, 0.0
    if layout in ("zero3", "hpz"):
        t = zero3_cost.zero3_step_time(model, n, gpu, everyone, mfu, tokens_per_gpu,
                                       backward_gathers=in_node if layout == "hpz" else None)
        per_mb, exposed_mb, binding = t["comm_s"], t["exposed_s"], t["binding"]
        states = accounting.model_states(psi, recipe, n, 3).total
        states += 2 * accounting.shard(psi, r) if layout == "hpz" else 0
    elif layout == "mics":
        t = zero3_cost.zero3_step_time(model, r, gpu, in_node, mfu, tokens_per_gpu)
        per_mb, exposed_mb = t["comm_s"], t["exposed_s"]
        across = cluster.group(cluster.nodes, stride=r)          # one rank per node
        ar = concurrent_time("all_reduce", 2 * accounting.shard(psi, r), across, groups_per_node=r)
        per_step, binding = ar.seconds, ar.binding
        states = accounting.model_states(psi, recipe, r, 3).total
    else:
        parts = [concurrent_time(c, b, everyone) for c in ("reduce_scatter", "all_gather")
                 for b in _chunks(2 * psi)]
        per_step = sum(p.seconds for p in parts)
        binding = max(parts, key=lambda p: p.seconds).binding
        states = accounting.model_states(psi, recipe, n, 1).total
    exposed = micro_batches * exposed_mb + per_step
    return {"layout": layout, "words": LAYOUTS[layout], "model": model, "gpus": n,
            "placement": everyone.describe(), "micro_batches": micro_batches,
            "tokens_per_gpu": tokens_per_gpu, "states_bytes": states,
            "comm_per_micro_batch_s": per_mb, "comm_per_step_s": per_step,
            "comm_s": micro_batches * per_mb + per_step, "exposed_s": exposed, "binding": binding,
            "compute_s": micro_batches * compute_s, "step_s": micro_batches * compute_s + exposed}
