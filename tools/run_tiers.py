"""``make test``'s scheduler: run the test groups (make targets) N at a time, in the order given.

Each group is a ``make`` target run in its own process (its own pytest, temp folder and ports); its
output goes to ``.cache/<target>.log`` and is printed whole when it ends, so two groups never
interleave. The Makefile lists the groups in an order measured on 2 cores (see its comment): with
2 workers that keeps both cores busy to the end. A line says when each starts and ends. Exit status 1
when any group failed (every group runs regardless), 2 on bad arguments.

    python tools/run_tiers.py 2 test-unit-rest-a test-notebooks ...
"""

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SAY = threading.Lock()


def _say(text: str) -> None:
    with _SAY:
        print(text, flush=True)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def run(target: str, start: float) -> tuple[str, int, float, Path]:
    log = ROOT / ".cache" / f"{target}.log"
    _say(f"-- {_clock(time.monotonic() - start)} started {target} (output in {log.relative_to(ROOT)})")
    began = time.monotonic()
    with open(log, "wb") as out:
        code = subprocess.call(["make", "--no-print-directory", target], cwd=ROOT, stdout=out,
                               stderr=subprocess.STDOUT)
    return target, code, time.monotonic() - began, log


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: run_tiers.py WORKERS TARGET [TARGET ...] (WORKERS a whole number >= 1)", file=sys.stderr)
        return 2
    workers, targets = int(argv[0]), argv[1:]
    (ROOT / ".cache").mkdir(exist_ok=True)
    start, failed = time.monotonic(), []
    _say(f"== {len(targets)} test groups, {workers} at a time: {', '.join(targets)}")
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(run, t, start) for t in targets]       # taken in this order
        for future in as_completed(futures):
            target, code, seconds, log = future.result()
            verdict = "passed" if code == 0 else f"FAILED (exit {code})"
            with _SAY:
                print(f"\n== {target}: {verdict} in {_clock(seconds)} "
                      f"(at {_clock(time.monotonic() - start)})", flush=True)
                sys.stdout.write(log.read_text(errors="replace"))
                sys.stdout.flush()
            if code:
                failed.append(target)
    _say(f"\n== all {len(targets)} groups in {_clock(time.monotonic() - start)}: "
         + (f"FAILED: {', '.join(failed)}" if failed else "every group passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
