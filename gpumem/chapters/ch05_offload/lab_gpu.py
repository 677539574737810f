"""Lab 05's optional GPU part: host <-> device copies timed with CUDA events, at three sizes: the
optimizer states, a quarter of them, and :data:`SMALL` (64 KiB), where a copy's fixed cost outweighs
its bytes (review r15 #5: at the two large sizes ``n / (eff x the datasheet rate)``, eff 0.80-0.95,
passed without timing anything; bytes over any one rate that agrees at the large sizes is more than
:data:`AGREE` short at 64 KiB once a copy's fixed cost exceeds about 0.3 us).

The grader times the same copies itself (:func:`reference_seconds`) and wants the learner's seconds
within :data:`AGREE` of its own in each direction and size, without showing its own timing; the
detail then compares with the time engine's PCIe term (bytes / the GPU's datasheet PCIe rate per
direction, :mod:`gpumem.memory.gpus`). Both time a copy as NVIDIA's nvbandwidth does (README,
"Measurement Details"): the stream is held on the GPU (``torch.cuda._sleep``, nvbandwidth's spin
kernel) while the start event, the copies and the end event are queued, so Python's queueing (and
the grader's watch over the learner's call) stays out of the interval; a size under :data:`BATCH`
is timed as back-to-back copies moving :data:`BATCH` bytes, per copy (the events' resolution is
about 0.5 us). Without CUDA, or when the optional function is not written, there is no row (a
skipped row must not count as a passing check): :func:`grade` returns the line to print instead.

NOT RUN ON A GPU: the course's machines have none, and the three-size grading, the held-stream
timing and :data:`SMALL` were written without a GPU (2026-12-05). Assumed, not measured: a pinned
64 KiB copy costs a fixed 1 us or more on the GPU beside its bytes (host-timed small copies take
about 10 us, cs.virginia.edu/~mwb7w/cuda_support/memory_transfer_overhead.html, GTX 280; nvbandwidth
and GDRCopy describe a per-copy DMA overhead without a GPU-side figure). Left open: a guessed fixed
cost added to bytes / rate, tuned over several checks by the "longer" / "shorter" words."""

from gpumem.course.copy_watch import graders_only
from gpumem.course.grading import Report, Todo, call, case_seconds, run_case

from ...memory import gpus as gpu_table
from . import lab_guard
from .lab_reference import ENTRIES
from ...units import GB

# torch.cuda.get_device_name() fragments -> gpumem.memory.gpus names (same PCIe per direction)
NAMES = (("H200", "h200"), ("H100", "h100-80gb"), ("A100", "a100-80gb"), ("L4", "l4"), ("T4", "t4"))
FLOOR = 0.25     # a large pinned copy reaches well above a quarter of the link; pageable copies may not
LARGE = 64 << 20  # FLOOR holds from this size up: below it a copy's fixed cost may weigh more
CEILING = 1.05   # no copy beats the link's per-direction rate (5 % for the clock's resolution)
AGREE = 0.10     # two timings of one pinned copy: 3.4 % apart on the H200 (2026-12-04); the datasheet rate 14 %
SMALL = 64 << 10  # the size where a copy's fixed cost outweighs its bytes (review r15 #5)
BATCH = 8 << 20  # a smaller copy is timed as back-to-back copies moving this many bytes, per copy
SPIN = 40_000_000  # torch.cuda._sleep cycles (~20 ms at 2 GHz) holding the stream while copies queue


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


def sizes() -> tuple[int, int, int]:
    """The sizes graded: the optimizer states, a quarter of them, :data:`SMALL`."""
    n_bytes = optimizer_state_bytes()
    return n_bytes, n_bytes // 4, SMALL


@lab_guard.keep("the grader's own timing")
def reference_seconds(n_bytes: int, repeats: int = 5) -> dict:
    """The grader's own timing of one copy of ``n_bytes``, per direction (seconds): pinned host
    memory, one warm-up copy, then ``repeats`` trials of -(-BATCH // n_bytes) back-to-back copies
    (one for a large size) between two CUDA events, queued while ``torch.cuda._sleep`` holds the
    stream (a trial the GPU reached before all was queued is redone with a longer spin), the
    median trial's seconds per copy. Runs only below the lab's check() or a course test
    (:func:`gpumem.course.copy_watch.graders_only`): no timing saved before. Not run on a GPU."""
    graders_only("lab_gpu.reference_seconds", ENTRIES)
    import torch
    host = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    copies, out = max(1, -(-BATCH // n_bytes)), {}
    for way, (dst, src) in {"h2d": (device, host), "d2h": (host, device)}.items():
        times, spin = [], SPIN
        while len(times) < repeats:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(spin)
            start.record()
            for _ in range(copies):
                dst.copy_(src, non_blocking=True)
            end.record()
            early = start.query()               # the spin ended before everything was queued
            end.synchronize()
            if early and spin < 16 * SPIN:
                spin *= 2
                continue
            times.append(start.elapsed_time(end) / 1e3 / copies)
        out[way] = sorted(times)[len(times) // 2]
    del host, device
    torch.cuda.empty_cache()
    return out


def _span(seconds: float) -> str:
    return f"{1e3 * seconds:.1f} ms" if seconds >= 1e-3 else f"{1e6 * seconds:.2f} us"


def _size(n_bytes: int) -> str:
    return f"{n_bytes / GB:.3g} GB" if n_bytes >= LARGE else f"{n_bytes >> 10} KiB"


HOW = ("time the copy itself: pinned host memory, a warm-up copy, torch.cuda._sleep holding the stream "
       "while start, the copies (8 MiB of them for a small size) and end are queued; seconds per copy")


def verdict(got, n_bytes: int, mine: dict) -> tuple[str, str]:
    """(status, detail) for the learner's ``{"h2d": s, "d2h": s}`` against the grader's own timing
    ``mine`` of the same copy (within :data:`AGREE`), then the datasheet PCIe rate: no copy beats
    it (:data:`CEILING`), and a large one reaches a quarter of it (:data:`FLOOR`)."""
    if not isinstance(got, dict) or not all(isinstance(got.get(k), float) and got[k] > 0 for k in ("h2d", "d2h")):
        return "wrong", f"expected a dict with positive float seconds under 'h2d' and 'd2h', got {got!r}"[:200]
    for way in ("h2d", "d2h"):
        if abs(got[way] / mine[way] - 1) > AGREE:
            side = "longer" if got[way] > mine[way] else "shorter"      # never the grader's ms (review r13 #3)
            return "wrong", (f"{way}: your time is {side} than the grader's timing of the same copy by more than "
                             f"{AGREE:.0%}: {HOW}")
    gpu = datasheet_gpu()
    if gpu is None:
        return "ok", (f"h2d {n_bytes / got['h2d'] / GB:.1f} GB/s, d2h {n_bytes / got['d2h'] / GB:.1f} GB/s "
                      "(this GPU is not in gpumem.memory.gpus: no datasheet to compare)")
    parts = []
    for way in ("h2d", "d2h"):
        rate, predicted = n_bytes / got[way], n_bytes / gpu.pcie
        if rate > CEILING * gpu.pcie:
            return "wrong", (f"{way}: {rate / GB:.1f} GB/s beats {gpu.label}'s PCIe ({gpu.pcie / GB:.1f} GB/s "
                             "per direction): the events must bracket the copies (record, copy, record, synchronize)")
        if rate < FLOOR * gpu.pcie and n_bytes >= LARGE:
            return "wrong", (f"{way}: {rate / GB:.1f} GB/s, under a quarter of {gpu.pcie / GB:.1f} GB/s: copy "
                             "from pinned host memory (pin_memory=True) and time only the copy")
        parts.append(f"{way} {_span(got[way])} vs {_span(predicted)} predicted "
                     f"({predicted / got[way]:.0%} of the datasheet rate)")
    return "ok", f"{_size(n_bytes)} on {gpu.label}: " + "; ".join(parts)


def grade(report: Report, fn) -> str:
    """Add the optional row when CUDA is present and ``fn`` is written; the line to print either way."""
    reason = cuda_reason()
    if reason:
        return "skipped (no row): " + reason
    unwritten = "optional and not written (pcie_copy_seconds): no row"
    if fn is None:
        return unwritten

    def body():
        # the optimizer states and a quarter of them (a constant cannot agree with both, review r13
        # #3), and 64 KiB, where bytes over a rate misses a copy's fixed cost (review r15 #5)
        details = []
        for size in sizes():
            got = call(lab_guard.guarded(fn), size)     # the grader's own timing refuses meanwhile
            status, detail = verdict(got, size, reference_seconds(size))
            if status != "ok":
                return status, f"{_size(size)} copy: {detail}"
            details.append(detail)
        return "ok", f"{details[0]} | {details[-1]}"
    try:
        row = run_case(report, "pcie_copy_seconds", "optional GPU part", body, case_seconds(cases=6))
    except Todo:                                    # run_case turns it into a todo row; kept for safety
        return unwritten
    if row.status == "todo":                        # optional: an unwritten part adds no row
        report.rows.remove(row)
        return unwritten
    return f"{row.status}: {row.detail}"
