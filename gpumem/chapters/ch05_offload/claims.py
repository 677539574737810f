"""Chapter 05's claims: the note's section 3 (its speed ladder, what NVMe may hold, the 155 ms
example) and its summary table's two offload rows, against our numbers.

Speeds are datasheet figures (:mod:`gpumem.memory.gpus`; :mod:`gpumem.memory.offload_cost`, whose
default drive is a datacenter Gen4 one, ``NVME_DRIVES["gen4"]``); bytes are chapter 01's accounting (:mod:`gpumem.memory.accounting`);
times are the cost model (:mod:`gpumem.memory.offload_cost`), whose byte counts the chapter's
tests derive by hand. The memory savings are graded twice (``ledger.table_two``): under the
note's own recipe (2 + 2 + 4 bytes per parameter, ``pure-bf16``) and under mixed precision.
"""

from gpumem.course.ledger import Claim
from gpumem.memory import accounting, gpus, offload_cost
from gpumem.timing import offload_time
from gpumem.timing.compute import KERNEL_SHARE

GB = 10**9
N_70B = 70_553_706_496      # Llama-3-70B's parameters (gpumem.memory.models counts the same)
NOTE_RECIPE = "pure-bf16"   # the note's 2 + 2 + 4 bytes per parameter

DRIVE = "gen4"             # offload_cost's default: a datacenter Gen4 drive (Micron 7450 PRO)
CONSUMER = "gen4-consumer"  # a consumer Gen4 drive's rated (SLC-cache) figures, for comparison


def drive_rate(direction: str = "write", drive: str = DRIVE) -> float:
    """A drive's sequential ``read`` or ``write`` rate in bytes/s (offload_time.DRIVES)."""
    return getattr(offload_time.DRIVES[drive], direction)


def nvme_written_per_drive() -> int:
    """Bytes one GPU's drive writes per 70B step on 8 GPUs with everything on NVMe: 18 B per shard
    parameter, what it holds (accounting.model_states)."""
    return accounting.model_states(N_70B, "mixed", 8, 3, "optimizer+params", "nvme").nvme


def hbm_over_nvme(direction: str = "write") -> float:
    """H100 SXM HBM over the datacenter drive's write (or read) rate (datasheets)."""
    return gpus.get("h100-80gb").hbm / drive_rate(direction)


def state_share(part: str, recipe: str) -> float:
    """Percent of a GPU's model-state bytes that ``part`` ("optimizer" or "params") is (ZeRO-3,
    8 GPUs): what moving that part alone off the GPU saves. Chapter 06's ledger asks the same."""
    s = accounting.model_states(N_70B, recipe, 8, 3)
    return 100 * getattr(s, part) / s.total


def gpu_state_saving(offload: str, recipe: str = "mixed") -> float:
    """Percent of a GPU's model-state bytes an offload removes as DeepSpeed 0.19.8 lays it out
    (ZeRO-3, 8 GPUs): with the optimizer, ZeRO-3's 16-bit gradient partition goes to the host too."""
    before = accounting.model_states(N_70B, recipe, 8, 3).total
    device = "nvme" if offload == "optimizer+params" else "cpu"
    after = accounting.model_states(N_70B, recipe, 8, 3, offload, device).total
    return 100 * (1 - after / before)


def _pct(v: float) -> str:
    return f"{v:.4g}\u00a0%"     # a no-break space: the ledger's wrapping keeps "25 %" on one line


def nvme_bytes_per_param() -> float:
    """Bytes per parameter ZeRO-Infinity puts on NVMe (mixed recipe): optimizer and parameters."""
    return accounting.model_states(1_000_000, "mixed", 1, 3, "optimizer+params", "nvme").nvme / 1_000_000


def d2h_ms(zero: int, grads: str = "deepspeed", direction: str = "down") -> float:
    """The gradients' trip down (or everything going up, ``direction="up"``), in ms, when the note's
    20 ms is the updated bf16 parameters' trip up, for 70B on 8 GPUs with the optimizer on the CPU
    (offload_cost.traffic_parts): DeepSpeed 0.19.8 sends fp32 gradients at ZeRO-1/2; at ZeRO-3 the
    bf16 partition down, back up, and the fp32 widening down; the paper 16-bit gradients."""
    t = offload_cost.traffic_parts(N_70B, "mixed", zero, 8, "optimizer", "cpu", grads)
    moved = t["grad_down"] if direction == "down" else t["grad_up"] + t["param_update"]
    return 20.0 * moved / t["param_update"]


# the chapter's 70B example: 8 H100s; compute at the planner's kernel share (timing.compute.KERNEL_SHARE):
# the window the transfers hide behind, to which the schedules add what they do not hide
TOKENS, PEAK, SHARE = 4096, 989e12, KERNEL_SHARE


def time_overhead(offload: str, device: str, schedule: str = "stock") -> float:
    """Percent the offload adds to a 70B step on 8 H100s (ZeRO-3, 4,096 tokens per GPU, compute at
    :data:`SHARE` of the peak) with the schedule stock DeepSpeed runs (offload_time.stock_schedule:
    CPU Adam after backward; ``schedule="total"``: the best, offload_time.ideal_schedule), datasheet
    links with the cost model's datacenter drive (``offload_time.datasheet_links()``)."""
    links = offload_time.datasheet_links()
    compute = offload_time.compute_seconds(N_70B, TOKENS, PEAK, SHARE)
    t = offload_time.step_time(N_70B, "mixed", 3, 8, offload, device, compute, links)
    return 100 * (t[schedule] / compute - 1)


# what DeepSpeed's stage 3 writes to swap files (the chapter's run lists them per rank)
NVME_STATES = ("optimizer states (fp32 master, m, v)", "fp32 gradients", "16-bit parameters")   # bf16 grads: RAM

CLAIMS = [
    Claim("3-hbm", "GPU HBM ~3.5 TB/s", 3500, lambda: gpus.get("h100-80gb").hbm / GB,
          lambda: "H100 SXM datasheet: 3.35 TB/s (H200 4.8, A100 80GB 2.0)", unit="GB/s"),
    Claim("3-cpu-ram", "CPU RAM ~100 GB/s (PCIe)", 100, lambda: gpus.get("h100-80gb").pcie / GB,
          lambda: "two links in one line: an H100 reaches host memory over PCIe Gen5 x16, 63 GB/s per "
                  "direction at line rate (Gen4, A100: 31.5); the CPU's own DRAM is 307-461 GB/s per DDR5 "
                  "socket", unit="GB/s"),
    Claim("3-nvme", "NVMe SSD ~5 GB/s (PCIe 4.0)", 5, lambda: drive_rate() / GB,
          lambda: f"{offload_time.DRIVES[DRIVE].source}; offload writes almost as many bytes as it reads (18 and "
                  "20 B per shard parameter), so the write rate paces the drive. A consumer drive's rated "
                  f"write ({offload_time.DRIVES[CONSUMER].name}: {drive_rate('write', CONSUMER) / GB:.1f} GB/s) holds only while its SLC cache does, far less than the "
                  f"{nvme_written_per_drive() / GB:.0f} GB a 70B step writes per drive. Measure yours with DeepSpeed's ds_io and ds_nvme_tune",
          unit="GB/s"),
    Claim("3-gap", "HBM vs NVMe gap 700x", 700, hbm_over_nvme,
          lambda: f"{gpus.get('h100-80gb').hbm / GB:,.0f} GB/s over the datacenter drive: {hbm_over_nvme():.0f}x against its write, "
                  f"{hbm_over_nvme('read'):.0f}x against its read; the note's 5 GB/s drive gives its 700x. "
                  f"For CPU offload the gap that matters is HBM / PCIe: "
                  f"{gpus.get('h100-80gb').hbm / gpus.get('h100-80gb').pcie:.0f}x at the H100's Gen5",
          unit="x"),
    Claim("3-nvme-holds", "NVMe offload acceptable only for optimizer states (1 kind of state)", 1,
          lambda: len(NVME_STATES),
          lambda: f"ZeRO-Infinity's swap files hold {len(NVME_STATES)} kinds of state at stage 3: "
                  + ", ".join(NVME_STATES)
                  + f"; {nvme_bytes_per_param():.0f} B per shard parameter (2 bf16 + 12 optimizer + 4 fp32 "
                  "gradient); only the bf16 gradient partition stays in host RAM", unit="kind(s)"),
    Claim("3-d2h", "GPU -> CPU transfer 5 ms beside 20 ms up", 5.0, lambda: d2h_ms(3),
          lambda: f"the note's example is ZeRO-3 with the optimizer on the CPU. As DeepSpeed 0.19.8 runs it, "
                  f"stage3.py copies the bf16 gradient partition down, brings it back up, widens it to fp32 on "
                  f"the GPU and copies that down: {d2h_ms(3):.0f} ms down while {d2h_ms(3, direction='up'):.0f} "
                  f"ms go up (the parameters' 20 and the gradients' return). ZeRO-1/2 send fp32 gradients once: "
                  f"{d2h_ms(2):.0f} ms; the ZeRO-Offload paper's 16-bit gradients {d2h_ms(3, 'paper'):.0f} ms, "
                  "the bytes of the trip up. No layout makes the trip down a quarter of the trip up", unit="ms"),
    Claim("3-total", "155 ms per step, ~35 % efficiency loss", 35.0,
          lambda: 100 * (1 - offload_time.note_example(False)["compute"] / offload_time.note_example(False)["total"]),
          lambda: "arithmetic right (100 / 155 = 64.5 %), but only if nothing overlaps; overlapped, the "
                  "same terms give 100 ms", unit="%"),
    Claim("table-cpu", "CPU optimizer offload saves ~50 % memory", 50.0,
          lambda: state_share("optimizer", "mixed"), unit="%",
          ours_note=lambda: state_share("optimizer", NOTE_RECIPE),
          why=lambda: f"share of a GPU's model states (ZeRO-3, 8 GPUs) held by the optimizer states: "
                      f"4 of the note's 8 B, {_pct(state_share('optimizer', NOTE_RECIPE))}, exactly its "
                      f"figure; 12 of 16 B under mixed precision. DeepSpeed also moves ZeRO-3's 16-bit "
                      f"gradient partition to the host, so only the 2 B bf16 shard stays: "
                      f"{_pct(gpu_state_saving('optimizer', NOTE_RECIPE))} and "
                      f"{_pct(gpu_state_saving('optimizer'))} removed"),
    Claim("table-nvme", "NVMe parameter offload saves ~20 % memory", 20.0,
          lambda: state_share("params", "mixed"), unit="%",
          ours_note=lambda: state_share("params", NOTE_RECIPE),
          why=lambda: f"the bf16 parameters are 2 of the note's 8 B ({_pct(state_share('params', NOTE_RECIPE))}) "
                      f"and 2 of 16 under mixed precision; moved with the optimizer (ZeRO-Infinity) no model "
                      f"state stays on the GPU between uses: {_pct(gpu_state_saving('optimizer+params'))} "
                      f"under either recipe (the bf16 gradient partition waits in host memory)"),
    Claim("table-cpu-time", "CPU optimizer offload costs ~+20 % step time", 20.0,
          lambda: time_overhead("optimizer", "cpu"),
          lambda: f"priced by the cost model: Llama-3-70B, ZeRO-3, 8 H100s, 4,096 tokens per GPU, "
                  f"compute at {100 * SHARE:.0f} % of peak (the planner's kernel share), datasheet links, "
                  "gradient copies inside backward, then CPU Adam, then parameters up, as stock DeepSpeed "
                  "runs it; fully overlapped (the paper's delayed update) it costs "
                  f"{time_overhead('optimizer', 'cpu', 'total'):.0f} %"
                  + ("" if time_overhead("optimizer", "cpu", "total") < 0.5 else
                     ", what CPU Adam takes beyond the compute"), unit="%"),
    Claim("table-nvme-time", "NVMe parameter offload costs ~+40 % step time", 40.0,
          lambda: time_overhead("optimizer+params", "nvme"),
          lambda: "same step with everything on one datacenter Gen4 drive per GPU: the drive reads 20 B "
                  "and writes 18 B per shard parameter; only the 4 B of parameter reads are prefetched "
                  "during compute, the state swaps run inside the step: tens of seconds against "
                  f"{offload_time.compute_seconds(N_70B, TOKENS, PEAK, SHARE):.1f} s of compute", unit="%"),
]
