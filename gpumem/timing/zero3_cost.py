"""When ZeRO-3 costs time: each collective DeepSpeed issues per micro-batch, timed on the group's
placement, against the compute it can hide behind.

Communication. DeepSpeed 0.19.8's ZeRO-3 gathers the parameters as its schedule, replayed by
:func:`gpumem.memory.zero3_schedule.simulate`, issues them (about 2 psi per step at 70B): one
coalesced ``all_gather_into_tensor`` per gather (``partition_parameters.py`` line 1362). It
reduce-scatters the gradients in buckets of ``reduce_bucket_size`` elements (default 5e8,
``stage3.py`` line 176), a bucket leaving when the next gradient would overflow it (line 1583).
Every collective is timed by :func:`gpumem.timing.collectives.collective_time` on the group's
placement: latency plus bytes over the link that binds. A ring crosses each node's NICs once, so a
group of whole DGX nodes moves its cross-node traffic through all eight NICs of a node together
(about NVLink's rate), a group of one rank per node through one NIC each.

Compute. 6 x params x tokens FLOPs (2 forward, 4 backward; no recomputation) at ``mfu`` x the GPU's
dense bf16 peak, by default :data:`gpumem.timing.compute.KERNEL_SHARE`: the share kernels
reach while computing, the planner's compute term. This compute is the window the traffic hides
behind, so it is the planner's compute time, not the whole-step MFU (40 %), which already counts
the waits. Prefetching hides a gather only behind the compute of the pass it serves, so the passes
are compared separately. The break-even is the tokens per GPU per micro-batch at which a pass
computes as long as it communicates.

Placements (``link``): ``"nvlink"``, all ranks in one node; ``"full-nodes"``, ``gpus`` / 8 whole
nodes; ``"rank-per-node"`` (alias ``"inter-node"``), one rank on each of ``gpus`` nodes, as a
data-parallel group is when tensor parallelism fills every node; ``"pcie"``, one PCIe-only node.
The node is the GPU's in :data:`NODE_OF_GPU` (DGX A100, DGX H100, HGX H200, the 8x L4 box). A
:class:`~gpumem.timing.hardware.Group` is used as given. A number is a what-if link: bytes/s per
direction that carries each rank's whole share, no latency.
"""

from collections import Counter
from functools import lru_cache

from ..errors import UsageError
from ..memory import gpus as gpu_table
from ..memory import models, zero3_schedule
from . import compute
from . import collectives, hardware

REDUCE_BUCKET = 500_000_000        # elements; DeepSpeed 0.19.8 stage3.py line 176, its default
PLACEMENTS = ("nvlink", "full-nodes", "rank-per-node", "inter-node", "pcie")
NODE_OF_GPU = {"a100-80gb": "dgx-a100", "h100-80gb": "dgx-h100", "h200": "hgx-h200",
               "l4": "g2-l4x8", "t4": "colab-t4"}


def node_of(gpu: str | gpu_table.GPU) -> hardware.NodeType:
    """The course's node type for a GPU (:data:`NODE_OF_GPU`); UsageError for a GPU without one."""
    name = gpu if isinstance(gpu, str) else gpu.name
    if name not in NODE_OF_GPU:
        raise UsageError(f"no node type holds {name!r} in gpumem.timing.hardware; GPUs with one: "
                         + ", ".join(NODE_OF_GPU))
    return hardware.node(NODE_OF_GPU[name])


def placed_group(gpu: str, gpus: int, link: str) -> hardware.Group:
    """The group of ``gpus`` ranks that placement ``link`` (:data:`PLACEMENTS`) puts on ``gpu``'s node."""
    node = node_of(gpu)
    per = node.gpus_per_node
    ok = [p for p in PLACEMENTS if (p != "nvlink" or node.nvlink) and (p != "pcie" or not node.nvlink)
          and (p in ("nvlink", "pcie") or node.nics)]
    if link not in ok:
        raise UsageError(f"link {link!r} is not available on {node.label}; accepted: " + ", ".join(ok))
    if link in ("nvlink", "pcie"):
        if gpus > per:
            raise UsageError(f"{gpus} ranks do not fit one {node.label} ({per} GPUs); use full-nodes")
        return hardware.Cluster(node, 1).group(gpus)
    if link == "full-nodes":
        if gpus % per:
            raise UsageError(f"full-nodes needs a multiple of {per} GPUs, got {gpus}")
        return hardware.Cluster(node, gpus // per).group(gpus)
    return hardware.Cluster(node, gpus).group(gpus, stride=per)


def link_bandwidth(gpu: gpu_table.GPU, link: str | float) -> float:
    """Line rate in bytes/s per direction of the link each rank sends through: "nvlink" and
    "pcie" the GPU's own (:mod:`gpumem.memory.gpus`), "inter-node"/"rank-per-node" one NIC of
    the GPU's node (:mod:`gpumem.timing.hardware`), or a number. Datasheet peaks, not achieved."""
    if not isinstance(link, str):
        return float(link)
    table = {"nvlink": gpu.nvlink, "pcie": gpu.pcie}
    if gpu.name in NODE_OF_GPU and node_of(gpu).nics:
        table |= {"inter-node": node_of(gpu).nic_bw, "rank-per-node": node_of(gpu).nic_bw}
    if link not in table or table[link] is None:
        raise UsageError(f"link {link!r} is not available on {gpu.name}; accepted: "
                         + ", ".join(k for k, v in table.items() if v))
    return table[link]


@lru_cache(maxsize=16)
def _schedule(model: str, config: tuple) -> tuple:
    """(all-gathers as Counter{(elements, serving forward): count}, reduce-scatter buckets as
    Counter{elements: count}) of one steady step, from DeepSpeed's replayed schedule."""
    cfg, keys = models.get(model), dict(config)
    params, order = zero3_schedule.llama_params(cfg), zero3_schedule.fetch_order(cfg)
    gathers = Counter((e["bytes"], e["serves"]["forward"])
                      for e in zero3_schedule.simulate(order, params, keys, elem_bytes=1)
                      if e["event"] == "all-gather")
    bucket_size, buckets, filled = keys.get("reduce_bucket_size", REDUCE_BUCKET), Counter(), 0
    for phase, module in order:        # gradients arrive in backward's order
        for _, n in params[module] if phase == "backward" else ():
            if filled and filled + n > bucket_size:
                buckets[filled] += 1
                filled = 0
            filled += n
    buckets[filled] += 1
    return gathers, buckets


def _seconds(coll: str, nbytes: float, where, latency: bool, ring: float) -> tuple[float, str]:
    if not isinstance(where, hardware.Group):          # a what-if link: bytes per rank / rate
        return nbytes * ring / where, "custom"
    t = collectives.collective_time(coll, nbytes, where)
    if not latency:                    # bytes over the achieved bandwidth, at full protocol share
        return max(dict(t.links).values(), default=0.0), t.binding
    return t.seconds, t.binding


def zero3_step_time(model: str = "llama-3-70b", gpus: int = 8, gpu: str = "h100-80gb",
                    link="nvlink", mfu: float = compute.KERNEL_SHARE, tokens_per_gpu: int = 4096,
                    param_bytes: int = 2, config: dict | None = None, latency: bool = True,
                    backward_gathers: hardware.Group | None = None) -> dict:
    """Seconds of communication and of compute for one ZeRO-3 micro-batch on each GPU, forward
    and backward separately, the link that binds, and the tokens per GPU at which they break
    even. ``link``: a placement name, a Group, or bytes/s; ``latency=False`` drops alpha;
    ``backward_gathers``: the group backward gathers from (ZeRO++ hpZ's node-local copy)."""
    cfg, g = models.get(model), gpu_table.get(gpu)
    if isinstance(link, hardware.Group):
        where, gpus, name = link, link.size, "placed"
    elif isinstance(link, str):
        where, name = placed_group(g.name, gpus, link), link
    else:
        where, name = float(link), "custom"
    gathers, buckets = _schedule(cfg.name, tuple(sorted((config or {}).items())))
    psi = cfg.n_params()
    phases = {ph: {"bytes_moved": 0.0, "comm_s": 0.0, "collectives": 0, "binding": Counter()}
              for ph in ("forward", "backward")}

    def add(ph, coll, elements, share, count):
        group = backward_gathers if (ph, coll) == ("backward", "all_gather") and backward_gathers else where
        size = group.size if isinstance(group, hardware.Group) else gpus
        s, binding = _seconds(coll, elements * param_bytes, group, latency, (size - 1) / size)
        p = phases[ph]
        p["bytes_moved"] += count * share * elements * param_bytes * (size - 1) / size
        p["comm_s"] += count * share * s
        p["collectives"] += count * share
        p["binding"][binding] += count * share * s
    for (elements, forward), count in gathers.items():
        add("forward", "all_gather", elements, forward / elements, count)
        add("backward", "all_gather", elements, 1 - forward / elements, count)
    for elements, count in buckets.items():
        add("backward", "reduce_scatter", elements, 1.0, count)
    step = compute.train_flops(psi, tokens_per_gpu)
    work = {"forward": step // 3, "backward": step - step // 3}         # 2 : 4
    out = {"model": model, "gpus": gpus, "gpu": g.label, "link": name,
           "placement": where.describe() if isinstance(where, hardware.Group) else "custom link",
           "mfu": mfu, "bf16_flops": g.bf16_flops, "tokens_per_gpu": tokens_per_gpu,
           "gathered_psi": sum(n * c for (n, _), c in gathers.items()) / psi, "phases": {}}
    for ph, p in phases.items():
        comp = compute.seconds(work[ph], g, mfu)
        out["phases"][ph] = {"bytes_moved": p["bytes_moved"], "comm_s": p["comm_s"], "compute_s": comp,
                             "hidden": p["comm_s"] <= comp, "exposed_s": max(0.0, p["comm_s"] - comp),
                             "collectives": round(p["collectives"]),
                             "binding": max(p["binding"], key=p["binding"].get)}
    out["bytes_moved"] = sum(p["bytes_moved"] for p in out["phases"].values())
    out["comm_s"] = sum(p["comm_s"] for p in out["phases"].values())
    out["compute_s"] = sum(p["compute_s"] for p in out["phases"].values())
    out["exposed_s"] = sum(p["exposed_s"] for p in out["phases"].values())
    out["binding"] = out["phases"]["backward"]["binding"]
    # the rate at which each rank's share moves (bytes per second of communication)
    out["link_bytes_per_s"] = out["bytes_moved"] / out["comm_s"] if out["comm_s"] else float("inf")
    out["break_even_tokens"] = max(tokens_per_gpu * p["comm_s"] / p["compute_s"]
                                   for p in out["phases"].values())
    return out
