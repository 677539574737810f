"""``python -m gpumem.memory.bench`` (``make bench``): how long tracing a full Llama-3-70B step takes.

Three ways, one run, same machine: MemTracker with its stock per-module peak bookkeeping over
all 80 layers (the naive way), the lean full trace (``trace_step``), and the composed trace
(``trace_fast``). All three must report the same bytes.
"""

import argparse
import json
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


def main(argv: list[str]) -> int:
    """``python -m gpumem.memory.bench``: print the timings; exit status 1 when the traces disagree."""
    p = argparse.ArgumentParser(prog="python -m gpumem.memory.bench")
    p.add_argument("--model", default="llama-3-70b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--skip-naive", action="store_true", help="skip the ~3.5 minute stock run")
    args = p.parse_args(argv)
    out = run(args.model, args.seq, args.skip_naive)
    for name, sec in out["seconds"].items():
        print(f"{name:36s} {sec:8.2f} s   {out['speedup_vs_composed'][name]:6.1f} x the composed time")
    print("all report the same bytes:", out["same_bytes"])
    return 0 if out["same_bytes"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
