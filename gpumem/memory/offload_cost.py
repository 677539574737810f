"""What offloading costs in time: bytes per step on each link, and a step-time model built on them.

Offloading trades memory for traffic. Every step a rank's model states cross links far slower
than HBM: PCIe between GPU and host (31.5 GB/s per direction at Gen4 x16, 63 at Gen5), the NVMe
drive (a datacenter Gen4 drive: 6.8 GB/s read, 5.6 GB/s write), and the CPU runs Adam at the
speed of its memory. This module counts the bytes (:func:`offload_traffic`) from the chapter 01
accounting (:mod:`gpumem.memory.accounting`) and turns them into seconds (:func:`step_time`) for
any set of bandwidths (:class:`Links`): the ones measured on the learner's machine
(:mod:`gpumem.memory.bandwidth`) or datasheet figures (:func:`datasheet_links`, whose default
drive is a datacenter Gen4 one, :data:`NVME_DRIVES`).

Per rank and per step, with s = ceil(Psi / N) parameters in the rank's shard, p16 the bytes of one
parameter on the GPU (2 for the bf16 recipes, 4 for fp32) and g32 the bytes of the gradient the
CPU optimizer reads (4 with an fp32 master, :func:`~gpumem.memory.accounting.optimizer_grad_bytes`):

======================  ===================  ==============  ========================  ===============
stage + offload         d2h (grads down)     h2d (up)        NVMe read                 NVMe write
======================  ===================  ==============  ========================  ===============
none                    0                    0               0                         0
ZeRO-1/2 optimizer cpu  g32 * s              p16 * s         0                         0
ZeRO-3 optimizer cpu    p16 * s              p16 * s         0                         0
ZeRO-3 optimizer nvme   p16 * s              p16 * s         nvme states               nvme states
ZeRO-3 opt+params cpu   p16 * s              2 * p16 * s     0                         0
ZeRO-3 opt+params nvme  p16 * s              2 * p16 * s     nvme states + p16 * s     nvme states
======================  ===================  ==============  ========================  ===============

The gradient trip differs by stage in DeepSpeed 0.19.8. At ZeRO-1/2 the engine widens each
reduced gradient slice to fp32 *on the GPU* and copies the fp32 tensor down
(``stage_1_and_2.py``: ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` and
``copy_grads_in_partition`` call ``.to(fp32)`` before ``copy_(non_blocking=True)``), so 4 bytes
per shard parameter cross PCIe. At ZeRO-3 the reduce-scattered 16-bit partition is copied into the
host-resident ``grad_partitions_flat_buffer`` (2 bytes) and widened to fp32 on the CPU
(``stage3.py``: ``partition_grads`` then ``_offload_grad_partition_at_boundary``). The
ZeRO-Offload paper (arXiv:2101.06840) sends fp16 gradients at every stage: ``grads="paper"``
gives that design, ``grads="deepspeed"`` (the default) what DeepSpeed does.

"nvme states" is what :func:`~gpumem.memory.accounting.model_states` puts on the drive for the
rank (optimizer+params: fp32 master, m, v 12 B + fp32 gradient 4 B + bf16 parameters 2 B = 18 s).
Backward writes the fp32 gradient (``swap_out_gradients``), the step reads it with the optimizer
states and writes the states back, then the updated 16-bit shard is written; ZeRO-3 fetches each
layer's shard up in forward and again in backward (DeepSpeed releases gathered parameters after
use), so parameters cross PCIe twice and are read from NVMe twice: read 12 + 4 + 2 x 2 = 20 s,
write 4 + 12 + 2 = 18 s.

Time: each term is bytes / bandwidth on its own resource; ``overlap=False`` adds them (the note's
155 ms example does), ``overlap=True`` takes the largest (the best any schedule can reach, each
resource busy all step). Hiding CPU Adam behind compute needs the paper's one-step delayed
parameter update (DPU); stock DeepSpeed ZeRO-Offload runs CPU Adam after backward, serially (it
overlaps only the gradient copies with backward); 0.19.8's overlapped path is ZenFlow
(``zero_optimization.zenflow``, stale updates). ``bound`` names the term that sets the time.
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


# Drive figures, sequential read and write, bytes/s (stated, not measured here), by PCIe generation.
# "gen4", the cost model's default, is a datacenter drive, the kind a GPU server carries (DGX H100:
# 8 x 3.84 TB U.2 data drives): offload writes about as many bytes as it reads every step (18 and
# 20 B per shard parameter, 159 GB per drive for a 70B step on 8 GPUs), so what counts is the write
# a drive keeps up. A consumer drive's rated write lasts only while its SLC cache does (tens to a
# few hundred GB), so the consumer entries ("consumer" in their label) are for comparison.
NVME_DRIVES = {
    "gen3": Drive(3.5e9, 3.3e9, "consumer Samsung 970 EVO Plus datasheet: 3,500 MB/s read, 3,300 MB/s "
                                "write (PCIe 3.0 x4)", "Samsung 970 EVO Plus"),
    "gen4": Drive(6.8e9, 5.6e9, "datacenter Micron 7450 PRO (PCIe 4.0 x4 U.3, 1 drive write per day): "
                                "about 6.8 GB/s read, up to 5.6 GB/s write on the large capacities "
                                "(0.7-1.4 GB/s below 1 TB): Micron's launch figures as ServeTheHome "
                                "reports them, \"Micron 7450 SSDs Launched with 176-Layer NAND\"",
                  "Micron 7450 PRO"),
    "gen5": Drive(14.5e9, 12.7e9, "consumer Crucial T705 datasheet: 14,500 MB/s read, 12,700 MB/s write "
                                  "(PCIe 5.0 x4)", "Crucial T705"),
}
# A consumer Gen4 drive's rated (SLC-cache) speeds, for comparison with the datacenter "gen4".
CONSUMER_DRIVES = {
    "gen4-consumer": Drive(7.45e9, 6.9e9, "consumer Samsung 990 PRO datasheet: 7,450 MB/s read, 6,900 MB/s "
                                          "write (PCIe 4.0 x4), the write while its SLC cache lasts",
                           "Samsung 990 PRO"),
}
DRIVES = NVME_DRIVES | CONSUMER_DRIVES

# CPU Adam is memory-bound: per parameter it reads fp32 master, m, v and grad (16 B) and writes
# master, m, v (12 B) and the 16-bit copy (2 B). A DDR5-4800 socket with 8 channels moves
# 4.8e9 x 8 B x 8 = 307 GB/s; a two-socket node shared by 8 GPU ranks gives each 76.8 GB/s.
ADAM_BYTES_PER_PARAM = 16 + 12 + 2
NODE_DRAM = 2 * 4.8e9 * 8 * 8
RANKS_PER_NODE = 8


@dataclass(frozen=True)
class Links:
    """Bandwidths in bytes/s, per direction, and the CPU optimizer's rate in parameters/s per rank."""
    h2d: float          # host -> device (PCIe, pinned)
    d2h: float          # device -> host
    nvme_read: float
    nvme_write: float
    cpu_adam: float     # parameters per second one rank's CPU Adam updates
    source: str         # "measured on <machine> <date>" or "datasheet: <which>"


def datasheet_links(gpu: str = "h100-80gb", nvme: str = "gen4") -> Links:
    """Links from stated figures: the GPU's PCIe per direction (:mod:`gpumem.memory.gpus`), an
    NVMe drive's figures (:data:`DRIVES`: ``gen4``, the datacenter drive, by default; ``gen3``,
    ``gen5``, ``gen4-consumer``) and a memory-bound CPU Adam per rank."""
    g = gpu_table.get(gpu)
    read, write, drive, _ = DRIVES[one_of(nvme, tuple(DRIVES), "NVMe drive")]
    adam = NODE_DRAM / RANKS_PER_NODE / ADAM_BYTES_PER_PARAM
    return Links(h2d=g.pcie, d2h=g.pcie, nvme_read=read, nvme_write=write, cpu_adam=adam,
                 source=(f"datasheet: {g.label} PCIe {g.pcie / GB:.1f} GB/s per direction; {drive}; "
                         f"CPU Adam memory-bound at {NODE_DRAM / GB:.0f} GB/s DDR5 per node / "
                         f"{RANKS_PER_NODE} ranks / {ADAM_BYTES_PER_PARAM} B per parameter"))


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


def offload_traffic(n_params: int, recipe: str, zero: int, gpus: int, offload: str,
                    device: str, grads: str = "deepspeed") -> dict[str, int]:
    """Bytes one rank moves per step over each link: ``h2d``, ``d2h``, ``nvme_read``, ``nvme_write``.

    See the module's table. ``grads="deepspeed"`` follows DeepSpeed 0.19.8 (fp32 gradients down at
    ZeRO-1/2, 16-bit at ZeRO-3); ``grads="paper"`` the ZeRO-Offload paper (16-bit at every stage).
    Raises :class:`UsageError` for combinations DeepSpeed lacks.
    """
    one_of(grads, ("deepspeed", "paper"), "gradient-trip model")
    n_params, gpus = _check(n_params, recipe, zero, gpus, offload, device)
    out = {"h2d": 0, "d2h": 0, "nvme_read": 0, "nvme_write": 0}
    if offload == "none":
        return out
    s = accounting.shard(n_params, gpus)
    p16 = accounting.RECIPE[recipe].params
    states = accounting.model_states(n_params, recipe, gpus, zero, offload, device)
    wide = zero < 3 and grads == "deepspeed"      # ZeRO-1/2 widen to fp32 on the GPU, then copy
    out["d2h"] = (accounting.optimizer_grad_bytes(accounting.RECIPE[recipe]) if wide else p16) * s
    out["h2d"] = (2 if offload == "optimizer+params" else 1) * p16 * s
    if device == "nvme":
        out["nvme_write"] = states.nvme
        out["nvme_read"] = states.nvme + (p16 * s if offload == "optimizer+params" else 0)
    return out


def step_time(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str,
              compute_s: float, links: Links, overlap: bool = True, grads: str = "deepspeed") -> dict:
    """Seconds per step: ``compute`` (forward + backward, given), ``h2d``, ``d2h``, ``nvme``
    (read + write, one drive), ``cpu_adam`` (the rank's shard, when the optimizer is offloaded),
    ``total`` (largest term with ``overlap``, sum without), ``stock`` (:func:`stock_schedule`) and
    ``bound`` (the largest term's name)."""
    if not compute_s >= 0:
        raise UsageError(f"compute time must be >= 0 seconds, got {compute_s!r}")
    t = offload_traffic(n_params, recipe, zero, gpus, offload, device, grads)
    terms = {"compute": float(compute_s), "h2d": t["h2d"] / links.h2d, "d2h": t["d2h"] / links.d2h,
             "nvme": t["nvme_read"] / links.nvme_read + t["nvme_write"] / links.nvme_write,
             "cpu_adam": (accounting.shard(n_params, gpus) / links.cpu_adam if offload != "none" else 0.0)}
    bound = max(terms, key=terms.get)
    total = max(terms.values()) if overlap else sum(terms.values())
    return {**terms, "total": total, "stock": stock_schedule(terms), "bound": bound}


def stock_schedule(terms: dict) -> float:
    """Seconds of a step as stock DeepSpeed ZeRO-Offload orders it (no delayed update): the gradient
    copies run during backward, then the drive's swaps and CPU Adam, then the parameters go up:
    max(compute, d2h) + nvme + cpu_adam + h2d (the whole h2d term counted after the step: ZeRO-3's
    forward and backward parameter fetches partly prefetch during compute, so there it is an upper
    bound)."""
    return max(terms["compute"], terms["d2h"]) + terms["nvme"] + terms["cpu_adam"] + terms["h2d"]


def compute_seconds(n_params: int, tokens: int, flops: float, mfu: float = 0.4) -> float:
    """Forward + backward seconds for ``tokens`` tokens on one GPU: 6 x Psi x tokens FLOPs at
    ``mfu`` of a peak of ``flops`` FLOP/s (the usual 6N rule; 2N forward, 4N backward)."""
    if not (0 < mfu <= 1) or not flops > 0:
        raise UsageError(f"need 0 < mfu <= 1 and flops > 0, got mfu={mfu!r}, flops={flops!r}")
    return 6 * positive_int(n_params, "parameter count") * positive_int(tokens, "token count") / (flops * mfu)


def break_even_tokens(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str,
                      links: Links, flops: float, mfu: float = 0.4) -> int:
    """Tokens per rank per step below which the step is transfer-bound even with perfect overlap:
    the compute (6 Psi tokens / (flops x mfu)) must cover the largest offload term."""
    terms = step_time(n_params, recipe, zero, gpus, offload, device, 0.0, links, overlap=True)
    slowest = max(terms[k] for k in ("h2d", "d2h", "nvme", "cpu_adam"))
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
