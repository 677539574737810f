"""``python -m gpumem.memory.bench`` (``make bench``): how long the course's commands take here.

Speed is measured here, not asserted in tests (a learner's slower laptop would fail them). Two
parts, one run, same machine:

* the command line: median wall time of ``estimate``, ``plan`` and ``trace`` (5 runs each), and
  each as a ratio to starting Python itself (``python -c pass``), so the figures travel between
  machines;
* tracing a full Llama-3-70B step three ways: MemTracker with its stock per-module peak
  bookkeeping over all 80 layers (the naive way), the lean full trace (``trace_step``) and the
  composed trace (``trace_fast``). All three must report the same bytes.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

from torch.distributed._tools.mem_tracker import MemTracker

from . import tracing


class StockPeakTracker(tracing.PeakTracker):
    """PeakTracker that also does MemTracker's own per-module peak bookkeeping (the naive cost)."""

    def _update_peak_stats(self, peak_state) -> None:
        MemTracker._update_peak_stats(self, peak_state)
        super()._update_peak_stats(peak_state)


def run(model: str = "llama-3-70b", seq: int = 4096, skip_naive: bool = False) -> dict:
    """Time each way of tracing ``model``: seconds, speed-up vs the composed trace, whether bytes agree."""
    rows = {}
    ways = [("composed (trace_fast)", lambda: tracing.trace_fast(model, "mixed", seq=seq)),
            ("full, lean tracker (trace_step)", lambda: tracing.trace_step(model, "mixed", seq=seq))]
    if not skip_naive:
        ways.append(("full, stock MemTracker bookkeeping",
                     lambda: tracing.trace_step(model, "mixed", seq=seq, tracker_cls=StockPeakTracker)))
    peaks = {}
    for name, fn in ways:
        print(f"tracing {model} at seq {seq}: {name} ...", flush=True)
        start = time.perf_counter()
        tr = fn()
        rows[name] = time.perf_counter() - start
        peaks[name] = (tr.peaks, tr.total_peak)
    fast = rows["composed (trace_fast)"]
    out = {"model": model, "seq": seq,
           "seconds": {k: round(v, 2) for k, v in rows.items()},
           "speedup_vs_composed": {k: round(v / fast, 1) for k, v in rows.items()},
           "same_bytes": len({json.dumps(v, sort_keys=True) for v in peaks.values()}) == 1}
    return out


COMMANDS = {
    "python -c pass (start-up)": ["-c", "pass"],
    "estimate 70B, 8 GPUs, ZeRO-3": ["-m", "gpumem", "estimate", "--model", "llama-3-70b", "--gpus", "8",
                                     "--zero", "3", "--json"],
    "plan 70B, 8 x H100-80GB": ["-m", "gpumem", "plan", "--model", "llama-3-70b", "--gpus", "8",
                                "--gpu", "H100-80GB", "--json"],
    "trace 70B (composed)": ["-m", "gpumem", "trace", "--model", "llama-3-70b", "--json"],
}


def commands(repeats: int = 5) -> dict:
    """Median wall seconds of each command in :data:`COMMANDS`, and its ratio to Python's start-up."""
    med = {}
    for name, args in COMMANDS.items():
        walls = []
        for _ in range(repeats):
            start = time.perf_counter()
            subprocess.run([sys.executable, *args], capture_output=True, check=True)
            walls.append(time.perf_counter() - start)
        med[name] = statistics.median(walls)
    base = med["python -c pass (start-up)"]
    return {name: {"median_s": round(v, 3), "x_startup": round(v / base, 1)} for name, v in med.items()}


def main(argv: list[str]) -> int:
    """``python -m gpumem.memory.bench``: print the timings; exit status 1 when the traces disagree."""
    p = argparse.ArgumentParser(prog="python -m gpumem.memory.bench")
    p.add_argument("--model", default="llama-3-70b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--skip-naive", action="store_true", help="skip the ~3.5 minute stock run")
    p.add_argument("--repeats", type=int, default=5, help="runs of each command (median shown)")
    args = p.parse_args(argv)
    print(f"command line, median of {args.repeats} runs:", flush=True)
    for name, row in commands(args.repeats).items():
        print(f"  {name:34s} {row['median_s']:7.2f} s   {row['x_startup']:6.1f} x start-up", flush=True)
    out = run(args.model, args.seq, args.skip_naive)
    for name, sec in out["seconds"].items():
        print(f"{name:36s} {sec:8.2f} s   {out['speedup_vs_composed'][name]:6.1f} x the composed time")
    print("all report the same bytes:", out["same_bytes"])
    return 0 if out["same_bytes"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
