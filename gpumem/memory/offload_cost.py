"""What offloading costs in time: bytes per step on each link, and a step-time model built on them.

Offloading trades memory for traffic: every step a rank's model states cross PCIe (31.5 GB/s per
direction at Gen4 x16, 63 at Gen5), an NVMe drive (:data:`NVME_DRIVES`, a datacenter Gen4 one by
default) and the CPU runs Adam at the speed of its memory. This module counts the bytes from the
chapter 01 accounting (:mod:`gpumem.memory.accounting`) and turns them into seconds
(:func:`step_time`) for measured (:mod:`gpumem.memory.bandwidth`) or datasheet (:func:`datasheet_links`) links.

Per rank and per step, with s = ceil(Psi / N) parameters in the rank's shard, p16 the bytes of one
parameter on the GPU (2 for the bf16 recipes, 4 for fp32), g32 the bytes of the gradient the CPU
optimizer reads (4 with an fp32 master, :func:`~gpumem.memory.accounting.optimizer_grad_bytes`)
and one micro-batch per step (:func:`traffic_parts` and :func:`offload_traffic` take more):

======================  ===================  ==================  ========================  ===============
stage + offload         d2h (down)           h2d (up)            NVMe read                 NVMe write
======================  ===================  ==================  ========================  ===============
none                    0                    0                   0                         0
ZeRO-1/2 optimizer cpu  g32 * s              p16 * s             0                         0
ZeRO-3 optimizer cpu    (p16 + g32) * s      2 * p16 * s         0                         0
ZeRO-3 optimizer nvme   (p16 + g32) * s      2 * p16 * s         nvme states               nvme states
ZeRO-3 opt+params cpu   (p16 + g32) * s      3 * p16 * s         0                         0
ZeRO-3 opt+params nvme  (p16 + g32) * s      3 * p16 * s         nvme states + p16 * s     nvme states
======================  ===================  ==================  ========================  ===============

The gradient trip as DeepSpeed 0.19.8 runs it (:func:`gradient_trip`). At ZeRO-1/2 the engine
widens each reduced slice to fp32 *on the GPU* and copies the fp32 tensor down
(``stage_1_and_2.py``: ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` and
``copy_grads_in_partition`` call ``.to(fp32)`` before ``copy_(non_blocking=True)``): g32 down.
At ZeRO-3 (``stage3.py``, ``partition_grads``, lines 2006-2049) the 16-bit partition is copied
into the host-resident ``grad_partitions_flat_buffer`` (line 2025, p16 down; on the CPU whenever
the optimizer is offloaded, lines 333 and 791), brought back (line 2028,
``grad_buffer.to(grad_partition.device)``, p16 up), and at the accumulation boundary
``_offload_grad_partition_at_boundary`` (lines 1443-1457) widens that GPU copy to fp32 and copies
it down (``fp32_grad_tensor.copy_(grad_buffer.to(dtype=fp32))``, g32 down; on NVMe, line 1453
does the same before ``swap_out_gradients``): 6 B down and 2 B up in the mixed recipe. Each later
micro-batch adds a p16 round trip (lines 2031-2039: up, add, back down). All of it runs on one
CUDA stream, ``reduce_and_partition_stream`` (line 1669), so the copies follow one another
(``grad_trip`` in :func:`step_time`). ZeRO-1/2 with m > 1 micro-batches (stage_1_and_2.py
``async_accumulate_grad_in_cpu_via_gpu``): p16 down every micro-batch, up before each later one. The ZeRO-Offload paper
(arXiv:2101.06840) sends fp16 gradients once at every stage: ``grads="paper"``.

"nvme states" is what :func:`~gpumem.memory.accounting.model_states` puts on the drive (opt+params:
master, m, v 12 B + fp32 gradient 4 B + bf16 parameters 2 B = 18 s). Backward writes the fp32
gradient (``swap_out_gradients``), the step reads it with the states and writes the states and the
updated 16-bit shard back; the shard is read for forward and again for backward (DeepSpeed
releases gathered parameters after use): read 12 + 4 + 2 x 2 = 20 s, write 4 + 12 + 2 = 18 s.

Time: each term is bytes / bandwidth on its own resource. Only the *parameter* reads from NVMe
overlap compute: the coordinator prefetches the next layers' partitions with an asynchronous
swap-in (``partitioned_param_coordinator.py``, ``__prefetch_nvme_param_partitions``, lines
667-690, on when ``offload_param`` is NVMe: ``parameter_offload.py`` line 218). The optimizer
states are swapped in, updated and swapped out sub-group by sub-group inside ``step()``
(``stage3.py`` lines 2910-2927: ``_prepare_sub_group``, ``_optimizer_step``,
``_reassign_or_swap_out_partitioned_parameters``, ``_release_sub_group``), and backward's fp32
gradient write blocks the training thread once the swapper's few pinned buffers are in flight
(``swap_tensor/async_swapper.py``, ``_flush_buffers_until_complete``): no DeepSpeed schedule
overlaps them with compute. So ``nvme`` splits into ``nvme_params`` (during compute) and
``nvme_states`` (in the step). ``overlap=False`` adds the terms (the note's 155 ms example);
``overlap=True`` is :func:`ideal_schedule`. Hiding CPU Adam needs the paper's delayed parameter
update (DPU); stock DeepSpeed runs it after backward (:func:`stock_schedule`); 0.19.8's
overlapped path is ZenFlow (``zero_optimization.zenflow``, stale updates).

CPU Adam's rate (:func:`datasheet_links`) is the node's DRAM bound (:data:`NODE_DRAM` / ranks /
bytes a parameter), not derated; chapter 05 expects about half (STREAM reaches 75-80 % of peak,
and the step makes extra passes): ``adam_share`` sets the share.
"""

from dataclasses import dataclass
from typing import NamedTuple

from ..errors import UsageError, one_of, positive_int
from . import accounting, gpus as gpu_table
from .accounting import DEVICES, OFFLOADS, RECIPES

GB = 10**9


class Drive(NamedTuple):
    """An NVMe drive's stated sequential rates (bytes/s), where they come from, and its name."""
    read: float
    write: float
    source: str
    name: str


# Sequential read and write, bytes/s (stated). "gen4", the default, is a datacenter drive as a GPU
# server carries (DGX H100: 8 x 3.84 TB U.2): offload writes about as many bytes as it reads (18 and
# 20 B per shard parameter), so the sustained write counts; consumer drives ("consumer") compare.
NVME_DRIVES = {
    "gen3": Drive(3.5e9, 3.3e9, "consumer Samsung 970 EVO Plus datasheet: 3,500 MB/s read, 3,300 MB/s "
                                "write (PCIe 3.0 x4)", "Samsung 970 EVO Plus"),
    "gen4": Drive(6.8e9, 5.6e9, "datacenter Micron 7450 PRO (PCIe 4.0 x4 U.3, 1 drive write per day): "
                                "about 6.8 GB/s read, up to 5.6 GB/s write on the large capacities "
                                "(0.7-1.4 GB/s below 1 TB): Micron's launch figures as ServeTheHome "
                                "reports them, \"Micron 7450 SSDs Launched with 176-Layer NAND\"", "Micron 7450 PRO"),
    "gen5": Drive(14.5e9, 12.7e9, "consumer Crucial T705 datasheet: 14,500 MB/s read, 12,700 MB/s write "
                                  "(PCIe 5.0 x4)", "Crucial T705"),
}
CONSUMER_DRIVES = {
    "gen4-consumer": Drive(7.45e9, 6.9e9, "consumer Samsung 990 PRO datasheet: 7,450 MB/s read, 6,900 MB/s "
                                          "write (PCIe 4.0 x4), the write while its SLC cache lasts",
                           "Samsung 990 PRO"),
}
DRIVES = NVME_DRIVES | CONSUMER_DRIVES

# CPU Adam is memory-bound: per parameter it reads fp32 master, m, v and grad (16 B) and writes
# master, m, v (12 B) and the 16-bit copy (2 B). A DDR5-4800 socket with 8 channels moves
# 4.8e9 x 8 B x 8 = 307 GB/s (Intel ark, Xeon Platinum 8480+: 8 channels DDR5-4800); a two-socket
# node shared by 8 GPU ranks gives each 76.8 GB/s: 2.56 G params/s, a theoretical upper bound.
ADAM_BYTES_PER_PARAM = 16 + 12 + 2
NODE_DRAM = 2 * 4.8e9 * 8 * 8
RANKS_PER_NODE = 8
GRAD_TRIPS = ("deepspeed", "paper")


@dataclass(frozen=True)
class Links:
    """Bandwidths in bytes/s, per direction, and the CPU optimizer's rate in parameters/s per rank."""
    h2d: float          # host -> device (PCIe, pinned)
    d2h: float          # device -> host
    nvme_read: float
    nvme_write: float
    cpu_adam: float     # parameters per second one rank's CPU Adam updates
    source: str         # "measured on <machine> <date>" or "datasheet: <which>"


def datasheet_links(gpu: str = "h100-80gb", nvme: str = "gen4", adam_share: float = 1.0) -> Links:
    """Links from stated figures: the GPU's PCIe per direction (:mod:`gpumem.memory.gpus`), an
    NVMe drive's figures (:data:`DRIVES`: ``gen4``, the datacenter drive, by default; ``gen3``,
    ``gen5``, ``gen4-consumer``) and CPU Adam per rank at ``adam_share`` of the node's DRAM bound
    (1.0, the default: the theoretical 2.56 G params/s; chapter 05 expects about 0.5)."""
    if not 0 < adam_share <= 1:
        raise UsageError(f"adam_share must be in (0, 1], got {adam_share!r}")
    g = gpu_table.get(gpu)
    read, write, drive, _ = DRIVES[one_of(nvme, tuple(DRIVES), "NVMe drive")]
    adam = adam_share * NODE_DRAM / RANKS_PER_NODE / ADAM_BYTES_PER_PARAM
    share = "theoretical bound, not derated" if adam_share == 1 else f"{adam_share:g} x the theoretical bound"
    return Links(h2d=g.pcie, d2h=g.pcie, nvme_read=read, nvme_write=write, cpu_adam=adam,
                 source=(f"datasheet: {g.label} PCIe {g.pcie / GB:.1f} GB/s per direction; {drive}; "
                         f"CPU Adam {adam / 1e9:.2f} G params/s per rank ({share}): "
                         f"{NODE_DRAM / GB:.0f} GB/s DDR5 per node (2 sockets x 8 channels x 4.8 GT/s "
                         f"x 8 B) / {RANKS_PER_NODE} ranks / {ADAM_BYTES_PER_PARAM} B per parameter"))


def _check(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str):
    n_params = positive_int(n_params, "parameter count")
    gpus = positive_int(gpus, "GPU count")
    if zero not in (0, 1, 2, 3):
        raise UsageError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero!r}")
    one_of(recipe, RECIPES, "recipe")
    one_of(offload, OFFLOADS, "offload")
    one_of(device, DEVICES, "offload device")
    accounting.check_offload(zero, offload, device)
    return n_params, gpus


def gradient_trip(recipe: str, zero: int, grads: str = "deepspeed", micro_batches: int = 1) -> dict[str, int]:
    """Bytes per shard parameter the gradients cross PCIe per step, ``down`` and ``up`` (the module
    says where in DeepSpeed's source each copy is)."""
    one_of(grads, GRAD_TRIPS, "gradient-trip model")
    m = positive_int(micro_batches, "micro-batches per step")
    r = accounting.RECIPE[one_of(recipe, RECIPES, "recipe")]
    if grads == "paper":
        return {"down": r.params, "up": 0}
    wide = accounting.optimizer_grad_bytes(r)
    if zero < 3:   # stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu: 16-bit down each micro-batch,
        return {"down": (m * r.params if m > 1 else 0) + wide, "up": (m - 1) * r.params}   # up after the first
    return {"down": m * r.params + wide, "up": m * r.params}


def traffic_parts(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str,
                  grads: str = "deepspeed", micro_batches: int = 1) -> dict[str, int]:
    """Bytes one rank moves per step, by purpose: ``grad_down``, ``grad_up`` (:func:`gradient_trip`),
    ``param_fetch`` (ZeRO-3 parameters offloaded: the shard up in every forward and backward),
    ``param_update`` (optimizer only offloaded: the updated 16-bit shard up after the step),
    ``nvme_param_read`` (the fetches' reads from the drive), ``nvme_state_read`` and ``nvme_write``."""
    n_params, gpus = _check(n_params, recipe, zero, gpus, offload, device)
    m = positive_int(micro_batches, "micro-batches per step")
    keys = ("grad_down", "grad_up", "param_fetch", "param_update", "nvme_param_read", "nvme_state_read",
            "nvme_write")
    out = dict.fromkeys(keys, 0)
    if offload == "none":
        return out
    s = accounting.shard(n_params, gpus)
    p16 = accounting.RECIPE[recipe].params
    trip = gradient_trip(recipe, zero, grads, m)
    out["grad_down"], out["grad_up"] = trip["down"] * s, trip["up"] * s
    params_off = offload == "optimizer+params"
    out["param_fetch" if params_off else "param_update"] = (2 * m if params_off else 1) * p16 * s
    if device == "nvme":
        states = accounting.model_states(n_params, recipe, gpus, zero, offload, device).nvme
        on_drive = p16 * s if params_off else 0             # the 16-bit shard's own file
        out["nvme_write"] = states
        out["nvme_state_read"] = states - on_drive
        out["nvme_param_read"] = out["param_fetch"] if params_off else 0
    return out


def offload_traffic(n_params: int, recipe: str, zero: int, gpus: int, offload: str,
                    device: str, grads: str = "deepspeed", micro_batches: int = 1) -> dict[str, int]:
    """Bytes one rank moves per step over each link: ``h2d``, ``d2h``, ``nvme_read``, ``nvme_write``
    (the sums of :func:`traffic_parts`; see the module's table). ``grads="deepspeed"`` follows
    DeepSpeed 0.19.8, ``grads="paper"`` the ZeRO-Offload paper (16-bit gradients down, once).
    Raises :class:`UsageError` for combinations DeepSpeed lacks."""
    one_of(grads, GRAD_TRIPS, "gradient-trip model")
    t = traffic_parts(n_params, recipe, zero, gpus, offload, device, grads, micro_batches)
    return {"h2d": t["grad_up"] + t["param_fetch"] + t["param_update"], "d2h": t["grad_down"],
            "nvme_read": t["nvme_param_read"] + t["nvme_state_read"], "nvme_write": t["nvme_write"]}


def step_time(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str,
              compute_s: float, links: Links, overlap: bool = True, grads: str = "deepspeed",
              micro_batches: int = 1) -> dict:
    """Seconds per step: ``compute`` (given), ``h2d``/``d2h`` (each direction's bytes), ``grad_trip``
    (the gradient copies in turn on their one stream), ``h2d_after`` (the updated shard, after the
    step), ``nvme`` = ``nvme_params`` (prefetched reads) + ``nvme_states`` (not overlapped),
    ``cpu_adam``, ``total`` (``overlap``: :func:`ideal_schedule`, else the sum of compute, h2d, d2h,
    nvme, cpu_adam), ``stock`` (:func:`stock_schedule`) and ``bound`` (the largest of those five)."""
    if not compute_s >= 0:
        raise UsageError(f"compute time must be >= 0 seconds, got {compute_s!r}")
    p = traffic_parts(n_params, recipe, zero, gpus, offload, device, grads, micro_batches)
    t = offload_traffic(n_params, recipe, zero, gpus, offload, device, grads, micro_batches)
    params = p["nvme_param_read"] / links.nvme_read
    terms = {"compute": float(compute_s), "h2d": t["h2d"] / links.h2d, "d2h": t["d2h"] / links.d2h,
             "nvme": t["nvme_read"] / links.nvme_read + t["nvme_write"] / links.nvme_write,
             "cpu_adam": (accounting.shard(n_params, gpus) / links.cpu_adam if offload != "none" else 0.0)}
    bound = max(terms, key=terms.get)
    terms |= {"nvme_params": params, "nvme_states": terms["nvme"] - params,
              "grad_trip": p["grad_down"] / links.d2h + p["grad_up"] / links.h2d,
              "h2d_after": p["param_update"] / links.h2d}
    total = ideal_schedule(terms) if overlap else sum(terms[k] for k in ("compute", "h2d", "d2h", "nvme", "cpu_adam"))
    return {**terms, "total": total, "stock": stock_schedule(terms), "bound": bound}


def _split(terms: dict) -> tuple[float, float, float, float]:
    """(gradient stream, up during compute, parameter reads, state swaps); a dict of compute, h2d,
    d2h, nvme, cpu_adam only reads as: d2h the gradients, h2d all after the step, nvme all states."""
    after = terms.get("h2d_after", terms["h2d"])
    params = terms.get("nvme_params", 0.0)
    return (terms.get("grad_trip", terms["d2h"]), terms["h2d"] - after, params,
            terms.get("nvme_states", terms["nvme"] - params))


def ideal_schedule(terms: dict) -> float:
    """The best any schedule reaches: overlappable terms beside compute (CPU Adam too, with the
    paper's delayed update), then the state swaps, which nothing overlaps."""
    grad, _, params, states = _split(terms)
    return max(terms["compute"], grad, terms["h2d"], terms["d2h"], params, terms["cpu_adam"]) + states


def stock_schedule(terms: dict) -> float:
    """Seconds of a step as stock DeepSpeed orders it (no delayed update): during forward and
    backward the gradient copies (one stream), the parameter fetches and their NVMe reads run beside
    compute; then the state swaps, CPU Adam and the updated shard's upload, in series:
    max(compute, grad_trip, h2d during, nvme_params) + nvme_states + cpu_adam + h2d_after."""
    grad, up, params, states = _split(terms)
    after = terms["h2d"] - up
    return max(terms["compute"], grad, up, params) + states + terms["cpu_adam"] + after


def compute_seconds(n_params: int, tokens: int, flops: float, mfu: float = 0.4) -> float:
    """Forward + backward seconds for ``tokens`` tokens on one GPU: 6 x Psi x tokens FLOPs at
    ``mfu`` of a peak of ``flops`` FLOP/s (the usual 6N rule; 2N forward, 4N backward)."""
    if not (0 < mfu <= 1) or not flops > 0:
        raise UsageError(f"need 0 < mfu <= 1 and flops > 0, got mfu={mfu!r}, flops={flops!r}")
    return 6 * positive_int(n_params, "parameter count") * positive_int(tokens, "token count") / (flops * mfu)


def break_even_tokens(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str,
                      links: Links, flops: float, mfu: float = 0.4) -> int | None:
    """Tokens per rank per step below which the step is transfer-bound even with the best schedule
    (:func:`ideal_schedule`): compute (6 Psi tokens / (flops x mfu)) must cover the largest
    overlappable term. None when optimizer states swap with NVMe: those swaps run in the step at any
    token count, so the step is never compute-bound."""
    terms = step_time(n_params, recipe, zero, gpus, offload, device, 0.0, links, overlap=True)
    if terms["nvme_states"] > 0:
        return None
    slowest = ideal_schedule(terms)
    return int(-(-slowest * flops * mfu // (6 * n_params)))


# The note's example of ZeRO-3 with the optimizer on the CPU (its section 3), as it states it.
NOTE_EXAMPLE_S = {"compute": 0.100, "h2d": 0.020, "cpu_adam": 0.030, "d2h": 0.005}


def note_example(overlap: bool) -> dict:
    """The note's 155 ms breakdown (quoted, not derived), summed (its reading) or overlapped."""
    terms = dict(NOTE_EXAMPLE_S)
    total = max(terms.values()) if overlap else sum(terms.values())
    return {**terms, "total": total, "bound": max(terms, key=terms.get)}


def links_from_ladder(ladder: dict[str, float], source: str, cpu_adam: float) -> Links:
    """Links from a measured ladder (rung name -> bytes/s, as :mod:`gpumem.memory.bandwidth`
    names them). Without CUDA the host-device rungs are absent; the RAM copy stands in for them
    (on CPU ranks the "device" is host memory)."""
    ram = ladder["ram_copy"]
    return Links(h2d=ladder.get("h2d_pinned", ram), d2h=ladder.get("d2h_pinned", ram),
                 nvme_read=ladder["disk_read"], nvme_write=ladder["disk_write"],
                 cpu_adam=cpu_adam, source=source)
