"""Chapter 05's claims: the note's section 3 (its speed ladder, what NVMe may hold, the 155 ms
example) and its summary table's two offload rows, against our numbers.

Speeds are datasheet figures (:mod:`gpumem.memory.gpus`, :mod:`gpumem.memory.offload_cost`);
bytes are chapter 01's accounting (:mod:`gpumem.memory.accounting`); times are the cost model
(:mod:`gpumem.memory.offload_cost`), whose byte counts the chapter's tests derive by hand.
"""

from gpumem.course.ledger import Claim
from gpumem.memory import accounting, gpus, offload_cost

GB = 10**9
N_70B = 70_553_706_496      # Llama-3-70B's parameters (gpumem.memory.models counts the same)


def hbm_over_nvme() -> float:
    """H100 SXM HBM over a Gen4 drive's read speed (datasheets)."""
    return gpus.get("h100-80gb").hbm / offload_cost.NVME_DRIVES["gen4"][0]


def gpu_state_saving(offload: str) -> float:
    """Percent of a GPU's model-state bytes an offload removes (mixed recipe, ZeRO-3, 8 GPUs)."""
    before = accounting.model_states(N_70B, "mixed", 8, 3).total
    after = accounting.model_states(N_70B, "mixed", 8, 3, offload, "nvme" if offload != "none" else "cpu").total
    return 100 * (1 - after / before)


def nvme_bytes_per_param() -> float:
    """Bytes per parameter ZeRO-Infinity puts on NVMe (mixed recipe): optimizer and parameters."""
    return accounting.model_states(1_000_000, "mixed", 1, 3, "optimizer+params", "nvme").nvme / 1_000_000


def d2h_ms(zero: int) -> float:
    """The gradients' trip down, in ms, when the note's parameters' trip up takes 20 ms, as DeepSpeed
    0.19.8 runs it (offload_cost.offload_traffic): fp32 gradients at ZeRO-1/2 (twice the bytes of
    the bf16 shard going up), the bf16 partition at ZeRO-3 (the same bytes)."""
    t = offload_cost.offload_traffic(N_70B, "mixed", zero, 8, "optimizer", "cpu")
    return 20.0 * t["d2h"] / t["h2d"]


TOKENS, PEAK, MFU = 4096, 989e12, 0.4      # the chapter's 70B example: 8 H100s, 40 % MFU


def time_overhead(offload: str, device: str) -> float:
    """Percent the offload adds to a 70B step on 8 H100s (ZeRO-3, 4,096 tokens per GPU, 40 % MFU)
    with the schedule stock DeepSpeed runs (offload_cost.stock_schedule: CPU Adam after backward),
    datasheet links."""
    links = offload_cost.datasheet_links("h100-80gb", "gen4")
    compute = offload_cost.compute_seconds(N_70B, TOKENS, PEAK, MFU)
    t = offload_cost.step_time(N_70B, "mixed", 3, 8, offload, device, compute, links)
    return 100 * (t["stock"] / compute - 1)


# what DeepSpeed's stage 3 writes to swap files (the chapter's run lists them per rank)
NVME_STATES = ("optimizer states (fp32 master, m, v)", "fp32 gradients", "16-bit parameters")   # bf16 grads: RAM

CLAIMS = [
    Claim("3-hbm", "GPU HBM ~3.5 TB/s", 3500, lambda: gpus.get("h100-80gb").hbm / GB,
          lambda: "H100 SXM datasheet: 3.35 TB/s (H200 4.8, A100 80GB 2.0)", unit="GB/s"),
    Claim("3-cpu-ram", "CPU RAM ~100 GB/s (PCIe)", 100, lambda: gpus.get("h100-80gb").pcie / GB,
          lambda: "two links in one line: an H100 reaches host memory over PCIe Gen5 x16, 63 GB/s per "
                  "direction at line rate (Gen4, A100: 31.5); the CPU's own DRAM is 307-461 GB/s per DDR5 "
                  "socket", unit="GB/s"),
    Claim("3-nvme", "NVMe SSD ~5 GB/s (PCIe 4.0)", 5, lambda: offload_cost.NVME_DRIVES["gen4"][0] / GB,
          lambda: offload_cost.NVME_DRIVES["gen4"][2] + "; a Gen4 x4 link carries 7.9 GB/s", unit="GB/s"),
    Claim("3-gap", "HBM vs NVMe gap 700x", 700, hbm_over_nvme,
          lambda: "3,350 / 7.45 = 450x; for CPU offload the gap that matters is HBM / PCIe, about 100x", unit="x"),
    Claim("3-nvme-holds", "NVMe offload acceptable only for optimizer states (1 kind of state)", 1,
          lambda: len(NVME_STATES),
          lambda: f"ZeRO-Infinity's swap files hold {len(NVME_STATES)} kinds of state at stage 3: "
                  + ", ".join(NVME_STATES)
                  + f"; {nvme_bytes_per_param():.0f} B per shard parameter (2 bf16 + 12 optimizer + 4 fp32 "
                  "gradient); only the bf16 gradient partition stays in host RAM", unit="kind(s)"),
    Claim("3-d2h", "GPU -> CPU transfer 5 ms beside 20 ms up", 5.0, lambda: d2h_ms(2),
          lambda: f"DeepSpeed ZeRO-1/2 widens the gradients to fp32 on the GPU before copying them down: "
                  f"{d2h_ms(2):.0f} ms, twice the bf16 parameters' trip up; at ZeRO-3 it sends the bf16 "
                  f"partition, {d2h_ms(3):.0f} ms, the same bytes (the ZeRO-Offload paper's design at every "
                  "stage); no layout makes the trip down a quarter of the trip up", unit="ms"),
    Claim("3-total", "155 ms per step, ~35 % efficiency loss", 35.0,
          lambda: 100 * (1 - offload_cost.note_example(False)["compute"] / offload_cost.note_example(False)["total"]),
          lambda: "arithmetic right (100 / 155 = 64.5 %), but only if nothing overlaps; overlapped, the "
                  "same terms give 100 ms", unit="%"),
    Claim("table-cpu", "CPU optimizer offload saves ~50 % memory", 50.0, lambda: gpu_state_saving("optimizer"),
          lambda: "of GPU model states (mixed, ZeRO-3, 8 GPUs): the 12 B optimizer moves, and DeepSpeed keeps "
                  "ZeRO-3's bf16 gradient partition in host memory too; only the 2 B bf16 shard stays", unit="%"),
    Claim("table-nvme", "NVMe parameter offload saves ~20 % memory", 20.0, lambda: gpu_state_saving("optimizer+params"),
          lambda: "with parameters and optimizer on NVMe no model state stays on the GPU between uses (the "
                  "bf16 gradient partition waits in host memory)", unit="%"),
    Claim("table-cpu-time", "CPU optimizer offload costs ~+20 % step time", 20.0,
          lambda: time_overhead("optimizer", "cpu"),
          lambda: "priced by the cost model: Llama-3-70B, ZeRO-3, 8 H100s, 4,096 tokens per GPU at 40 % MFU, "
                  "datasheet links, gradient copies inside backward, then CPU Adam, then parameters up, as "
                  "stock DeepSpeed runs it; fully overlapped (the paper's delayed update) it costs 0 %", unit="%"),
    Claim("table-nvme-time", "NVMe parameter offload costs ~+40 % step time", 40.0,
          lambda: time_overhead("optimizer+params", "nvme"),
          lambda: "same step with everything on one Gen4 drive per GPU: the drive reads 20 B and writes "
                  "18 B per shard parameter, tens of seconds against 4.4 s of compute", unit="%"),
]
