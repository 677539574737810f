"""Lab 04's optional GPU part, graded only where CUDA is present.

The learner writes ``measure_on_gpu(fn, *args)`` -> ``(peak_bytes, milliseconds)``: the most bytes
allocated during ``fn(*args)`` above what was allocated before it (``torch.cuda.max_memory_allocated``
after ``reset_peak_memory_stats``) and its time between two ``torch.cuda.Event``s. The grader runs it
on the learner's ``flash_backward`` and on SDPA's flash backend's backward at one size (batch 1, 16
heads of 64, s 4,096, bf16, causal) and checks:

* the learner's instrument agrees with the grader's own measurement of the same call (peak within
  10 % + 1 MiB; a fake or forgotten ``reset_peak_memory_stats`` fails; time within a factor of
  4 of the grader's own Event timing, taken once before and once after the learner's call). The
  grader's measurement (``_own_peak``) is switched off while the learner's ``measure_on_gpu`` runs
  (:mod:`.labblock`), so it cannot be borrowed;
* the learner's backward is O(s): its peak above the inputs stays below the bf16 probabilities a
  naive backward would hold, 16 x 4,096^2 x 2 B = 512 MiB (chapter 04 §1's count).

The part is optional: while ``measure_on_gpu`` (or ``flash_backward``) is unwritten it adds no row.

The times are checked only against the grader's own timing of the same call, never against SDPA:
a Python loop of small kernels is slower than SDPA's one fused kernel, and how much slower depends
on the GPU. Without CUDA nothing runs; :func:`grade` says why.
"""

import torch

from gpumem.course.grading import call, run_case

from .labblock import no_library_backward

SHAPE = dict(heads=16, seq=4096, head_dim=64, block=128)


def naive_probability_bytes(heads: int, seq: int, elem: int = 2) -> int:
    """Bytes of one sequence's s x s probabilities over all heads: what a naive backward holds."""
    return heads * seq * seq * elem


TIME_FACTOR = 4.0     # the learner's time may differ from the grader's by this factor either way


def _own_peak(fn, *args) -> tuple[int, float]:
    """The grader's own (peak bytes above the inputs, milliseconds) of one call ``fn(*args)``."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn(*args)
    end.record()
    torch.cuda.synchronize()
    del result
    return torch.cuda.max_memory_allocated() - base, start.elapsed_time(end)


def guard():
    """The library's backwards and the grader's own measurement off (the learner's call runs)."""
    return no_library_backward(("labgpu._own_peak", _own_peak,
                                "measure it yourself: {} is the grader's and is off meanwhile"))


def _inputs():
    from gpumem.memory import flash_tiled
    g = torch.Generator(device="cuda").manual_seed(0)
    a, s, d = SHAPE["heads"], SHAPE["seq"], SHAPE["head_dim"]
    q, k, v, dout = (torch.randn(1, a, s, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = flash_tiled.tiled_forward(q, k, v, True, SHAPE["block"], block_q=SHAPE["block"])
    return q, k, v, dout, out, lse


def _sdpa_backward(q, k, v, dout):
    """A function running SDPA's flash backward alone (its forward already done)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    return lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)


def compare(measure, bwd) -> dict:
    """Run the learner's ``measure`` on their ``bwd`` and on SDPA's flash backward (CUDA only);
    also the grader's own peak for the learner's call, and a line saying all of it."""
    q, k, v, dout, out, lse = _inputs()
    args = (dout, q, k, v, out, lse, True, SHAPE["block"])
    _, own_ms = _own_peak(bwd, *args)                 # also warms the kernels up for the learner
    with guard():                                     # the grader's instrument is off meanwhile
        got = call(measure, bwd, *args)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return {"error": "measure_on_gpu must return (peak_bytes, milliseconds)"}
    peak, ms = float(got[0]), float(got[1])
    own, after_ms = _own_peak(bwd, *args)
    with guard():
        sdpa_peak, sdpa_ms = (float(x) for x in call(measure, _sdpa_backward(q, k, v, dout)))
    naive = naive_probability_bytes(SHAPE["heads"], SHAPE["seq"])
    line = (f"your flash_backward: {peak / 2**20:,.1f} MiB above its inputs, {ms:,.1f} ms\n"
            f"SDPA's flash backward: {sdpa_peak / 2**20:,.1f} MiB, {sdpa_ms:,.2f} ms; "
            f"a naive backward's probabilities alone: {naive / 2**20:,.0f} MiB")
    return dict(peak=peak, ms=ms, own=own, own_ms=(min(own_ms, after_ms), max(own_ms, after_ms)),
                sdpa_peak=sdpa_peak, sdpa_ms=sdpa_ms, naive=naive, line=line)


def grade(report, ns: dict) -> str:
    """Add the GPU row when CUDA is present; return a line for the learner either way."""
    if not torch.cuda.is_available():
        return "skipped: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU"
    measure, bwd = ns.get("measure_on_gpu"), ns.get("flash_backward")
    unwritten = "optional and not written yet (measure_on_gpu and flash_backward): no row"
    if measure is None or bwd is None:
        return unwritten
    line = [""]

    def body():
        r = compare(measure, bwd)
        if "error" in r:
            return "wrong", r["error"]
        line[0] = r["line"]
        peak, own, naive = r["peak"], r["own"], r["naive"]
        if abs(peak - own) > 0.1 * own + 2**20:
            return "wrong", (f"measure_on_gpu says {peak / 2**20:,.1f} MiB, the grader measured "
                             f"{own / 2**20:,.1f} MiB for the same call: reset the peak and subtract "
                             f"what was allocated before")
        low, high = r["own_ms"]
        if not low / TIME_FACTOR <= r["ms"] <= high * TIME_FACTOR:
            return "wrong", (f"measure_on_gpu timed {r['ms']:,.2f} ms, the grader timed the same call at "
                             f"{low:,.2f} to {high:,.2f} ms: record one Event before the call, one after, "
                             f"synchronize, then read elapsed_time")
        if peak >= naive:
            return "wrong", (f"your backward held {peak / 2**20:,.0f} MiB on the GPU, as much as the "
                             f"naive s x s probabilities ({naive / 2**20:,.0f} MiB): it is not O(s)")
        return "ok", line[0]
    row = run_case(report, "measure_on_gpu", "s 4096 bf16 causal, 16 heads of 64", body)
    if row.status == "todo":                  # optional: an unwritten part adds no row
        report.rows.remove(row)
        return unwritten
    return line[0] or "see the measure_on_gpu row"
