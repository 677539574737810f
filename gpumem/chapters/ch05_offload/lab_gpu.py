"""Lab 05's optional GPU part: a host <-> device copy of the optimizer states' size, timed with CUDA
events, against the time engine's PCIe term (bytes / the GPU's datasheet PCIe rate per direction,
:mod:`gpumem.memory.gpus`). Skipped, with the reason, without CUDA."""

from ...memory import gpus as gpu_table
from ...units import GB

# torch.cuda.get_device_name() fragments -> gpumem.memory.gpus names (same PCIe per direction)
NAMES = (("H200", "h200"), ("H100", "h100-80gb"), ("A100", "a100-80gb"), ("L4", "l4"), ("T4", "t4"))
FLOOR = 0.25     # a pinned copy reaches well above a quarter of the link; pageable copies may not
CEILING = 1.05   # no copy beats the link's per-direction rate (5 % for the clock's resolution)


def cuda_reason() -> str:
    """'' when CUDA is usable, else why the GPU part is skipped."""
    import torch
    if not torch.cuda.is_available():
        return "no CUDA device here: the PCIe part runs only on a GPU machine"
    return ""


def datasheet_gpu():
    """The :class:`gpumem.memory.gpus.GPU` this device is, or None if the table lacks it."""
    import torch
    name = torch.cuda.get_device_name(0)
    return next((gpu_table.get(key) for frag, key in NAMES if frag in name), None)


def optimizer_state_bytes(n_params: int = 1_000_000_000, ranks: int = 8) -> int:
    """The part's copy size: master, m and v (12 B) of one rank's shard, by hand."""
    return 12 * -(-n_params // ranks)


def verdict(got, n_bytes: int) -> tuple[str, str]:
    """(status, detail) for the learner's ``{"h2d": s, "d2h": s}`` against the datasheet PCIe rate."""
    if not isinstance(got, dict) or not all(isinstance(got.get(k), float) and got[k] > 0 for k in ("h2d", "d2h")):
        return "wrong", f"expected a dict with positive float seconds under 'h2d' and 'd2h', got {got!r}"[:200]
    gpu = datasheet_gpu()
    if gpu is None:
        return "ok", (f"h2d {n_bytes / got['h2d'] / GB:.1f} GB/s, d2h {n_bytes / got['d2h'] / GB:.1f} GB/s "
                      "(this GPU is not in gpumem.memory.gpus: no datasheet to compare)")
    parts = []
    for way in ("h2d", "d2h"):
        rate, predicted = n_bytes / got[way], n_bytes / gpu.pcie
        if rate > CEILING * gpu.pcie:
            return "wrong", (f"{way}: {rate / GB:.1f} GB/s beats {gpu.label}'s PCIe ({gpu.pcie / GB:.1f} GB/s "
                             "per direction): the events must bracket the copy (record, copy, record, synchronize)")
        if rate < FLOOR * gpu.pcie:
            return "wrong", (f"{way}: {rate / GB:.1f} GB/s, under a quarter of {gpu.pcie / GB:.1f} GB/s: copy "
                             "from pinned host memory (pin_memory=True) and time only the copy")
        parts.append(f"{way} {1e3 * got[way]:.1f} ms vs {1e3 * predicted:.1f} ms predicted "
                     f"({predicted / got[way]:.0%} of the datasheet rate)")
    return "ok", f"{n_bytes / GB:.2f} GB on {gpu.label}: " + "; ".join(parts)
