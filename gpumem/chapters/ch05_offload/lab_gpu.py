"""Lab 05's optional GPU part: a host <-> device copy of the optimizer states' size, timed with CUDA
events, at two sizes (the states and a quarter of them). The grader times the same copies itself
(:func:`reference_seconds`) and wants the learner's seconds within :data:`AGREE` of its own in each
direction and size (as lab 06 does for its matmul), without showing its own timing; the
detail then compares with the time engine's PCIe term (bytes / the GPU's datasheet PCIe rate per
direction, :mod:`gpumem.memory.gpus`). Without CUDA, or when the optional function is not written,
there is no row (a skipped row must not count as a passing check): :func:`grade` returns the line
to print instead. Not run on the course's CPU machines."""

from gpumem.course.copy_watch import graders_only
from gpumem.course.grading import Report, Todo, call, case_seconds, run_case

from ...memory import gpus as gpu_table
from . import lab_guard
from .lab_reference import ENTRIES
from ...units import GB

# torch.cuda.get_device_name() fragments -> gpumem.memory.gpus names (same PCIe per direction)
NAMES = (("H200", "h200"), ("H100", "h100-80gb"), ("A100", "a100-80gb"), ("L4", "l4"), ("T4", "t4"))
FLOOR = 0.25     # a pinned copy reaches well above a quarter of the link; pageable copies may not
CEILING = 1.05   # no copy beats the link's per-direction rate (5 % for the clock's resolution)
AGREE = 0.10     # two timings of one pinned copy: 3.4 % apart on the H200 (2026-12-04); the datasheet rate 14 %


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


@lab_guard.keep("the grader's own timing")
def reference_seconds(n_bytes: int, repeats: int = 5) -> dict:
    """The grader's own timing of the lab's copy: pinned host memory, one warm-up copy, CUDA events
    around each copy, the median of ``repeats`` per direction (seconds). Runs only below the lab's
    check() or a course test (:func:`gpumem.course.copy_watch.graders_only`): no timing saved before."""
    graders_only("lab_gpu.reference_seconds", ENTRIES)
    import torch
    host = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    out = {}
    for way, (dst, src) in {"h2d": (device, host), "d2h": (host, device)}.items():
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        out[way] = sorted(times)[len(times) // 2]
    del host, device
    torch.cuda.empty_cache()
    return out


def verdict(got, n_bytes: int, mine: dict) -> tuple[str, str]:
    """(status, detail) for the learner's ``{"h2d": s, "d2h": s}`` against the grader's own timing
    ``mine`` of the same copy (within :data:`AGREE`), then the datasheet PCIe rate."""
    if not isinstance(got, dict) or not all(isinstance(got.get(k), float) and got[k] > 0 for k in ("h2d", "d2h")):
        return "wrong", f"expected a dict with positive float seconds under 'h2d' and 'd2h', got {got!r}"[:200]
    for way in ("h2d", "d2h"):
        if abs(got[way] / mine[way] - 1) > AGREE:
            side = "longer" if got[way] > mine[way] else "shorter"      # never the grader's ms (review r13 #3)
            return "wrong", (f"{way}: your time is {side} than the grader's timing of the same copy by more than "
                             f"{AGREE:.0%}: time the copy itself, pinned host memory, warm up, record, copy, "
                             "record, synchronize")
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


def grade(report: Report, fn) -> str:
    """Add the optional row when CUDA is present and ``fn`` is written; the line to print either way."""
    reason = cuda_reason()
    if reason:
        return "skipped (no row): " + reason
    unwritten = "optional and not written (pcie_copy_seconds): no row"
    if fn is None:
        return unwritten
    n_bytes = optimizer_state_bytes()

    def body():
        # two sizes, the optimizer states and a quarter of them (where a copy's fixed cost weighs
        # more): a constant cannot agree with the grader's timing of both (review r13 #3)
        details = []
        for size in (n_bytes, n_bytes // 4):
            got = call(lab_guard.guarded(fn), size)     # the grader's own timing refuses meanwhile
            status, detail = verdict(got, size, reference_seconds(size))
            if status != "ok":
                return status, f"{size / GB:.3g} GB copy: {detail}"
            details.append(detail)
        return "ok", details[0]
    try:
        row = run_case(report, "pcie_copy_seconds", "optional GPU part", body, case_seconds(cases=4))
    except Todo:                                    # run_case turns it into a todo row; kept for safety
        return unwritten
    if row.status == "todo":                        # optional: an unwritten part adds no row
        report.rows.remove(row)
        return unwritten
    return f"{row.status}: {row.detail}"
