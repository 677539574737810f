"""When ZeRO-3 costs time: bytes each GPU moves per step against the step's compute, per link.

Communication. Per training step ZeRO-3 all-gathers the parameters (the volume DeepSpeed's
schedule gives, :func:`zero3_schedule.step_volume`: about 2 psi for 70B) and reduce-scatters the
gradients (psi). In a ring over N ranks every rank sends and receives (N - 1) / N of each
collective's bytes, so the time is that many bytes over the link's bandwidth *per direction*.

Compute. A step costs 6 x params x tokens FLOPs (2 forward, 4 backward; no recomputation), run
at ``mfu`` x the GPU's dense bf16 peak (:mod:`gpumem.memory.speed`, 40 % by default). Forward and backward are compared with the bytes they
gather separately, because prefetching can only hide a gather behind the compute of the same
pass. Both ratios are independent of the model's size: what decides is the tokens each GPU
processes per micro-batch against the link's bytes per FLOP.

Links: NVLink and PCIe per direction from :mod:`gpumem.memory.gpus`; between nodes
:data:`INTER_NODE`, a stated 400 Gb/s network port per GPU (the DGX H100 layout: one 400 Gb/s
InfiniBand NDR or Ethernet port per GPU) = 50 GB/s per direction. These are link peaks: the
bandwidth NCCL achieves for an all-gather is lower (protocol overhead, message sizes, topology),
so the communication times are optimistic (a lower bound).
"""

from ..errors import UsageError
from ..memory import gpus as gpu_table
from ..memory import models, speed
from . import zero3_schedule

INTER_NODE = gpu_table.INTER_NODE     # 400 Gb/s per GPU, per direction (stated, not measured)


def link_bandwidth(gpu: gpu_table.GPU, link: str | float) -> float:
    """Bytes/s per direction of ``link``: "nvlink", "pcie", "inter-node", or a number."""
    if not isinstance(link, str):
        return float(link)
    table = {"nvlink": gpu.nvlink, "pcie": gpu.pcie, "inter-node": INTER_NODE}
    if link not in table or table[link] is None:
        raise UsageError(f"link {link!r} is not available on {gpu.name}; accepted: "
                         + ", ".join(k for k, v in table.items() if v))
    return table[link]


def zero3_step_time(model: str = "llama-3-70b", gpus: int = 8, gpu: str = "h100-80gb",
                    link: str | float = "nvlink", mfu: float = speed.MFU, tokens_per_gpu: int = 4096,
                    param_bytes: int = 2, config: dict | None = None) -> dict:
    """Seconds of communication and of compute for one ZeRO-3 micro-batch step on each GPU,
    forward and backward separately, and the tokens per GPU at which they break even."""
    cfg, g = models.get(model), gpu_table.get(gpu)
    bw = link_bandwidth(g, link)
    vol = zero3_schedule.step_volume(cfg, config)
    psi, ring = cfg.n_params(), (gpus - 1) / gpus
    moved = {"forward": vol["served_elements"]["forward"] * param_bytes * ring,
             "backward": (vol["served_elements"]["backward"] + psi) * param_bytes * ring}   # + reduce-scatter
    step = speed.train_flops(psi, tokens_per_gpu)
    work = {"forward": step // 3, "backward": step - step // 3}         # 2 : 4
    out = {"model": model, "gpus": gpus, "gpu": g.label, "link": link if isinstance(link, str) else "custom",
           "link_bytes_per_s": bw, "mfu": mfu, "bf16_flops": g.bf16_flops, "tokens_per_gpu": tokens_per_gpu,
           "gathered_psi": vol["gathered_psi"], "phases": {}}
    for ph in ("forward", "backward"):
        comm, comp = moved[ph] / bw, speed.seconds(work[ph], g, mfu)
        out["phases"][ph] = {"bytes_moved": moved[ph], "comm_s": comm, "compute_s": comp,
                             "hidden": comm <= comp, "exposed_s": max(0.0, comm - comp)}
    out["bytes_moved"] = sum(moved.values())
    out["comm_s"] = sum(p["comm_s"] for p in out["phases"].values())
    out["compute_s"] = sum(p["compute_s"] for p in out["phases"].values())
    out["exposed_s"] = sum(p["exposed_s"] for p in out["phases"].values())
    # tokens per GPU at which each phase's communication equals its compute
    out["break_even_tokens"] = max(tokens_per_gpu * out["phases"][ph]["comm_s"] / out["phases"][ph]["compute_s"]
                                   for ph in moved)
    return out
