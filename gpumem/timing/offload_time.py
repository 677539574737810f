"""What offloading costs in time: the bytes of :mod:`gpumem.memory.offload_cost` over each link's
bandwidth, and the schedules that overlap them (torch-free).

Every step a rank's model states cross PCIe (31.5 GB/s per direction at Gen4 x16, 63 at Gen5), an
NVMe drive (:data:`NVME_DRIVES`, a datacenter Gen4 one by default) and the CPU runs Adam at the
rate its node's ranks share. :func:`step_time` turns the bytes per link
(:func:`~gpumem.memory.offload_cost.traffic_parts`) into seconds for measured
(:func:`links_from_ladder`, from :mod:`gpumem.memory.bandwidth`) or datasheet
(:func:`datasheet_links`) links; compute seconds come from :mod:`gpumem.timing.compute` at its
:data:`~gpumem.timing.compute.KERNEL_SHARE`, the planner's compute term (the window the transfers
hide behind).

Time: each term is bytes / bandwidth on its own resource. Only the *parameter* reads from NVMe
overlap compute: the coordinator prefetches the next layers' partitions with an asynchronous
swap-in (``partitioned_param_coordinator.py``, ``__prefetch_nvme_param_partitions``, lines
667-690, on when ``offload_param`` is NVMe: ``parameter_offload.py`` line 218). The optimizer
states are swapped in, updated and swapped out sub-group by sub-group inside ``step()``
(``stage3.py`` lines 2910-2927: ``_prepare_sub_group``, ``_optimizer_step``,
``_reassign_or_swap_out_partitioned_parameters``, ``_release_sub_group``): no DeepSpeed schedule
overlaps them with compute. Backward's fp32 gradient write overlaps backward only as far as the
swapper's pinned buffers let it (:mod:`.grad_swap`: nothing when the shard fits one buffer). So
``nvme`` splits into ``nvme_params`` (during compute), ``nvme_grad`` (the gradient write, of which
``nvme_grad_exposed`` shows) and ``nvme_states`` (the rest, in the step). ``overlap=False`` adds
the terms (the note's 155 ms example); ``overlap=True`` is :func:`ideal_schedule`. Hiding CPU Adam needs the paper's delayed parameter
update (DPU); stock DeepSpeed runs it after backward (:func:`stock_schedule`); 0.19.8's
overlapped path is ZenFlow (``zero_optimization.zenflow``, stale updates).

CPU Adam's rate (:func:`datasheet_links`) is an achieved one: :data:`CPU_ADAM_NODE_RATE`, the
ZeRO-Offload paper's measured DeepSpeed CPU-Adam on a DGX-2 host (its Table 4), or the caller's
``adam_rate``, for the whole node, divided evenly by the ranks on that node. The node's DRAM
bound (:func:`adam_dram_ceiling`: :data:`NODE_DRAM` / 30 B a parameter) is only the ceiling a rate
may not exceed.
"""

from dataclasses import dataclass
from typing import NamedTuple

from ..errors import UsageError, one_of
from ..memory import accounting, gpus as gpu_table
from ..memory.offload_cost import offload_traffic, traffic_parts
from ..units import GB
from . import compute, grad_swap


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

# CPU Adam's ceiling: per parameter it reads fp32 master, m, v and grad (16 B) and writes master,
# m, v (12 B) and the 16-bit copy (2 B). A DDR5-4800 socket with 8 channels moves 4.8e9 x 8 B x 8 =
# 307 GB/s (Intel ark, Xeon Platinum 8480+: 8 channels DDR5-4800); a two-socket node 614 GB/s, so
# no CPU Adam on it updates more than 614 / 30 = 20.48 G params/s (2.56 per rank of 8): a
# theoretical bound that STREAM-like kernels reach 75-80 % of, and Adam's extra passes less.
ADAM_BYTES_PER_PARAM = 16 + 12 + 2
NODE_DRAM = 2 * 4.8e9 * 8 * 8
RANKS_PER_NODE = 8

# CPU Adam's achieved rate, published: Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model
# Training", USENIX ATC 2021 (arXiv:2101.06840), Table 4 "Adam latency (s) for PyTorch (PT) and
# CPU-Adam": DeepSpeed's CPU-Adam takes 0.22 / 0.51 / 1.03 / 2.41 / 2.57 s for 1 / 2 / 4 / 8 / 10
# billion parameters (PT-CPU 1.39 ... 14.76 s), on the host of its Table 2, a DGX-2 node: 2 Intel
# Xeon Platinum 8168, 1.5 TB DDR4-2666. The largest row, where fixed costs weigh least: 10e9 / 2.57
# s = 3.89 G params/s for the whole host (the 8 B row gives 3.32, the 1 B row 4.55). At 30 B a
# parameter that is 117 GB/s, 46 % of that host's 256 GB/s (2 x 6 channels x 2,666 MT/s x 8 B).
# Assumptions: the ranks on a node share its cores and memory bandwidth evenly (per rank = node
# rate / ranks on the node), and a newer node's CPU Adam runs at the paper's host's rate; if it
# scaled with DRAM bandwidth instead (614 / 256 GB/s) this would be 2.4x pessimistic.
CPU_ADAM_PAPER_TABLE4 = {1_000_000_000: 0.22, 2_000_000_000: 0.51, 4_000_000_000: 1.03,
                         8_000_000_000: 2.41, 10_000_000_000: 2.57}
CPU_ADAM_NODE_RATE = 10_000_000_000 / CPU_ADAM_PAPER_TABLE4[10_000_000_000]
CPU_ADAM_SOURCE = ("the ZeRO-Offload paper's Table 4, Ren et al., USENIX ATC 2021: DeepSpeed CPU-Adam "
                   "updates 10 B parameters in 2.57 s on a DGX-2 host, 2 x Xeon Platinum 8168, DDR4-2666")


def adam_dram_ceiling(ranks_on_node: int = 1) -> float:
    """Parameters/s CPU Adam cannot exceed on the planner's node, split over ``ranks_on_node``:
    :data:`NODE_DRAM` (614 GB/s) / ranks / :data:`ADAM_BYTES_PER_PARAM` (30 B); 20.48 G params/s
    for the whole node, 2.56 per rank of 8. A ceiling, not a rate any CPU Adam reaches."""
    return NODE_DRAM / ranks_on_node / ADAM_BYTES_PER_PARAM


def cpu_adam_per_rank(adam_rate: float | None = None, ranks_on_node: int = RANKS_PER_NODE) -> float:
    """Parameters/s one rank's CPU Adam updates: ``adam_rate`` (parameters/s for the whole node;
    None: :data:`CPU_ADAM_NODE_RATE`, the paper's) / ``ranks_on_node``, the ranks sharing the host.
    Refuses a node rate <= 0 or above :func:`adam_dram_ceiling`, and ranks_on_node < 1."""
    rate = CPU_ADAM_NODE_RATE if adam_rate is None else adam_rate
    ceiling = adam_dram_ceiling()
    if isinstance(ranks_on_node, bool) or not isinstance(ranks_on_node, int) or ranks_on_node < 1:
        raise UsageError(f"ranks on the node must be a whole number >= 1, got {ranks_on_node!r}")
    if not 0 < rate <= ceiling:
        raise UsageError(f"CPU Adam rate must be > 0 and at most {ceiling / 1e9:.2f}e9 parameters/s per "
                         f"node (its DRAM bound, {NODE_DRAM / GB:.0f} GB/s / 30 B), got {rate!r}")
    return rate / ranks_on_node


@dataclass(frozen=True)
class Links:
    """Bandwidths in bytes/s, per direction, and the CPU optimizer's rate in parameters/s per rank."""
    h2d: float          # host -> device (PCIe, pinned)
    d2h: float          # device -> host
    nvme_read: float
    nvme_write: float
    cpu_adam: float     # parameters per second one rank's CPU Adam updates
    source: str         # "measured on <machine> <date>" or "datasheet: <which>"


def datasheet_links(gpu: str = "h100-80gb", nvme: str = "gen4", adam_rate: float | None = None,
                    ranks_on_node: int = RANKS_PER_NODE) -> Links:
    """Links from stated figures: the GPU's PCIe per direction (:mod:`gpumem.memory.gpus`), an
    NVMe drive's figures (:data:`DRIVES`: ``gen4``, the datacenter drive, by default; ``gen3``,
    ``gen5``, ``gen4-consumer``) and CPU Adam per rank (:func:`cpu_adam_per_rank`): ``adam_rate``
    parameters/s for the whole node (None: the ZeRO-Offload paper's 3.89 G, :data:`CPU_ADAM_NODE_RATE`)
    shared by ``ranks_on_node`` ranks (8 by default; the planner passes min(gpus, GPUs per node))."""
    g = gpu_table.get(gpu)
    read, write, drive, _ = DRIVES[one_of(nvme, tuple(DRIVES), "NVMe drive")]
    adam = cpu_adam_per_rank(adam_rate, ranks_on_node)
    node = adam * ranks_on_node
    said = CPU_ADAM_SOURCE if adam_rate is None else "given"
    return Links(h2d=g.pcie, d2h=g.pcie, nvme_read=read, nvme_write=write, cpu_adam=adam,
                 source=(f"datasheet: {g.label} PCIe {g.pcie / GB:.1f} GB/s per direction; {drive}; "
                         f"CPU Adam {adam / 1e9:.2f} G params/s per rank: {node / 1e9:.2f} G params/s per "
                         f"node over the {ranks_on_node} rank{'s' if ranks_on_node > 1 else ''} on it, "
                         f"sharing its cores and memory evenly ({said}); ceiling "
                         f"{adam_dram_ceiling() / 1e9:.2f} G params/s per node ({NODE_DRAM / GB:.0f} GB/s "
                         f"DDR5 / {ADAM_BYTES_PER_PARAM} B per parameter)"))


def step_time(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str,
              compute_s: float, links: Links, overlap: bool = True, grads: str = "deepspeed",
              micro_batches: int = 1) -> dict:
    """Seconds per step: ``compute`` (given), ``h2d``/``d2h`` (each direction's bytes), ``grad_trip``
    (the gradient copies in turn on their one stream), ``h2d_after`` (the updated shard, after the
    step), ``nvme`` = ``nvme_params`` (prefetched reads) + ``nvme_grad`` (backward's fp32 gradient
    write; ``nvme_grad_exposed``: what of it the step waits for, :func:`.grad_swap.exposed_seconds`
    over the last micro-batch's backward, ``backward``: :func:`.grad_swap.backward_seconds`) +
    ``nvme_states`` (the state swaps, not overlapped),
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
    s = accounting.shard(n_params, gpus)
    grad = p["nvme_grad_write"] / links.nvme_write
    trip = p["grad_down"] / links.d2h + p["grad_up"] / links.h2d
    back = grad_swap.backward_seconds(compute_s, trip, (p["grad_up"] + p["param_fetch"] / 2) / links.h2d,
                                      params, micro_batches)
    shown = (grad_swap.exposed_seconds(s, p["nvme_grad_write"] // s, links.nvme_write, back,
                                       grad_swap.SUB_GROUP_SIZE, grad_swap.BUFFER_COUNT) if grad else 0.0)
    terms |= {"nvme_params": params, "nvme_grad": grad, "nvme_grad_exposed": shown, "backward": back,
              "nvme_states": terms["nvme"] - params - grad, "grad_trip": trip,
              "h2d_after": p["param_update"] / links.h2d}
    total = ideal_schedule(terms) if overlap else sum(terms[k] for k in ("compute", "h2d", "d2h", "nvme", "cpu_adam"))
    return {**terms, "total": total, "stock": stock_schedule(terms), "bound": bound}


def _split(terms: dict) -> tuple[float, float, float, float]:
    """(gradient stream, up during compute, parameter reads, state swaps); a dict of compute, h2d,
    d2h, nvme, cpu_adam only reads as: d2h the gradients, h2d all after the step, nvme all states
    (the gradient write among them)."""
    after = terms.get("h2d_after", terms["h2d"])
    params = terms.get("nvme_params", 0.0)
    return (terms.get("grad_trip", terms["d2h"]), terms["h2d"] - after, params,
            terms.get("nvme_states", terms["nvme"] - params))


def ideal_schedule(terms: dict) -> float:
    """The best any schedule reaches: overlappable terms beside compute (CPU Adam and the whole
    gradient write too), then the state swaps, which nothing overlaps."""
    grad, _, params, states = _split(terms)
    return max(terms["compute"], grad, terms["h2d"], terms["d2h"], params, terms["cpu_adam"],
               terms.get("nvme_grad", 0.0)) + states


def stock_schedule(terms: dict) -> float:
    """Seconds of a step as stock DeepSpeed orders it (no delayed update): during forward and
    backward the gradient copies (one stream), the parameter fetches and their NVMe reads run beside
    compute, and the gradient's NVMe write as far as its buffers let it; then the state swaps, CPU
    Adam and the updated shard's upload, in series: max(compute, grad_trip, h2d during,
    nvme_params) + nvme_grad_exposed + nvme_states + cpu_adam + h2d_after."""
    grad, up, params, states = _split(terms)
    after = terms["h2d"] - up
    shown = terms.get("nvme_grad_exposed", 0.0)
    return max(terms["compute"], grad, up, params) + shown + states + terms["cpu_adam"] + after


def compute_seconds(n_params: int, tokens: int, flops: float, mfu: float = compute.KERNEL_SHARE) -> float:
    """Forward + backward seconds for ``tokens`` tokens on one GPU of a peak of ``flops`` FLOP/s:
    :func:`~gpumem.timing.compute.train_flops` (6 x Psi x tokens, the usual 6N rule; 2N forward,
    4N backward) at ``mfu`` of it. The default is :data:`~gpumem.timing.compute.KERNEL_SHARE`
    (the share kernels reach while computing), the planner's compute term: the schedules add the
    transfers this compute does not hide, so it must not already count waits, as the whole-step
    MFU (40 %) does."""
    if not (0 < mfu <= 1) or not flops > 0:
        raise UsageError(f"need 0 < mfu <= 1 and flops > 0, got mfu={mfu!r}, flops={flops!r}")
    return compute.train_flops(n_params, tokens) / (flops * mfu)


def break_even_tokens(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str,
                      links: Links, flops: float, mfu: float = compute.KERNEL_SHARE) -> int | None:
    """Tokens per rank per step below which the step is transfer-bound even with the best schedule
    (:func:`ideal_schedule`): compute (6 Psi tokens / (flops x mfu), :func:`compute_seconds`, at
    :data:`~gpumem.timing.compute.KERNEL_SHARE` by default) must cover the largest overlappable
    term. None when optimizer states swap with NVMe: those swaps run in the step at any token
    count, so the step is never compute-bound."""
    terms = step_time(n_params, recipe, zero, gpus, offload, device, 0.0, links, overlap=True)
    if terms["nvme_states"] > 0:
        return None
    slowest = ideal_schedule(terms)
    return int(-(-slowest * flops * mfu // compute.train_flops(n_params, 1)))


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
