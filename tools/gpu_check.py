"""`make gpu-check`: run every GPU item of the course, collect what it measured, and report.

    .venv/bin/python tools/gpu_check.py [--no-notebooks] [--chapters 02,05] [--budget S] [--results-dir DIR]
                                        [--report FILE] [-- PYTEST_ARGS]

The items, all found afresh each run:
  1. every ``gpu``-marked test (``pytest -m gpu``), with GPUMEM_GPU_RECORD set so each
     measurement a test makes through the ``gpu_record`` fixture is collected;
  2. every experiment in the registry (``gpumem.chapters.CHAPTERS``) on CUDA:
     ``python -m gpumem run NAME --device cuda --json`` (its wall time and every
     ``cuda_max_memory_allocated`` it reports become measurements);
  3. every chapter notebook under nbval, so its ``if torch.cuda.is_available()`` branches run.

With CUDA it writes ``results/gpu/<date>_<gpu>.json`` (gpumem.course.gpu_results' format) and
the report next to it (``.md``); commit both. ``--budget S`` (seconds, for a rented GPU by the
hour): each item runs under what is left of S, one that runs out is stopped and reported
"failed: out of time", and the items after it "skipped", so the report is always written. Without CUDA every item is reported as skipped
with its reason, nothing is written under results/, and the exit status is 0. The exit status
is 1 when an item failed.

This file is also a pytest plugin (``-p gpu_check``): it writes each test's outcome, as JSON
lines, to the file named by GPUMEM_GPU_OUTCOMES.
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = "no CUDA device on this machine (run `make gpu-check` on a GPU box)"


class Clock:
    """What is left of ``--budget``: the timeout for the next item, or None once it is spent."""

    def __init__(self, budget: float | None):
        self.end = None if budget is None else time.monotonic() + budget

    def left(self) -> float | None:
        return None if self.end is None else self.end - time.monotonic()

    def spent(self) -> bool:
        return self.end is not None and self.left() < 5


def _run(cmd, clock: Clock, capture_output=False, **kw):
    """subprocess.run under what is left of the budget; None when it ran out (the item's whole
    process group is killed: DeepSpeed's ranks and a notebook's kernel too, not only the child)."""
    pipe = subprocess.PIPE if capture_output else None
    with subprocess.Popen(cmd, stdout=pipe, stderr=pipe, start_new_session=True, **kw) as proc:
        try:
            out, err = proc.communicate(timeout=clock.left())
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None
        except KeyboardInterrupt:        # its own session: Ctrl-C reaches only us, so pass it on
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


OUT_OF_TIME = {"outcome": "skipped", "detail": "out of --budget time before it started"}


# -- the pytest plugin half --------------------------------------------------------------------

def pytest_runtest_logreport(report):
    """Append one line per test outcome (setup skips and call results) to GPUMEM_GPU_OUTCOMES."""
    path = os.environ.get("GPUMEM_GPU_OUTCOMES")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    detail = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        detail = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        detail = crash.message.splitlines()[0] if crash else str(report.longrepr).splitlines()[-1]
    with open(path, "a") as f:
        f.write(json.dumps({"item": report.nodeid, "outcome": report.outcome, "detail": detail[:300]}) + "\n")


# -- the machine ---------------------------------------------------------------------------------

def machine() -> dict:
    """What the results file records about the machine: GPU, driver, CUDA, torch, DeepSpeed."""
    from importlib import metadata

    import torch
    info = {"date": datetime.date.today().isoformat(), "cuda_available": torch.cuda.is_available(),
            "torch": torch.__version__, "cuda": torch.version.cuda or "none",
            "deepspeed": metadata.version("deepspeed"), "gpu": "none", "gpu_count": 0, "driver": "none"}
    if info["cuda_available"]:
        info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count())
        if shutil.which("nvidia-smi"):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                                 capture_output=True, text=True)
            info["driver"] = out.stdout.strip() or "unknown"
    return info


# -- the three kinds of item ---------------------------------------------------------------------

def gpu_tests(tmp: Path, pytest_args: list[str], clock: Clock) -> tuple[list[dict], list[dict]]:
    """Run ``pytest -m gpu``; returns (outcomes, measurements recorded by the tests)."""
    outcomes, records = tmp / "outcomes.jsonl", tmp / "records.jsonl"
    env = {**os.environ, "GPUMEM_GPU_RECORD": str(records), "GPUMEM_GPU_OUTCOMES": str(outcomes),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")])}
    proc = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-p", "no:cacheprovider",
                 "-p", "gpu_check", "tests", *pytest_args], clock, cwd=ROOT, env=env)
    rows = [json.loads(line) for line in outcomes.read_text().splitlines()] if outcomes.exists() else []
    if proc is None:
        rows.append({"item": "pytest -m gpu", "outcome": "failed", "detail": "out of --budget time: stopped"})
    elif proc.returncode not in (0, 1, 5) or (proc.returncode == 1 and not any(r["outcome"] == "failed" for r in rows)):
        rows.append({"item": "pytest -m gpu", "outcome": "failed",
                     "detail": f"pytest exited with status {proc.returncode} (collection or usage error)"})
    measured = [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []
    return rows, measured


def _cuda_peaks(data, path=""):
    """Every ``cuda_max_memory_allocated`` in an experiment's JSON, with where it was found."""
    if isinstance(data, dict):
        for k, v in data.items():
            if k == "cuda_max_memory_allocated" and isinstance(v, (int, float)):
                yield path.strip("."), int(v)
            else:
                yield from _cuda_peaks(v, f"{path}.{k}")
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _cuda_peaks(v, f"{path}.{i}")


def _chosen(chapters, info: dict):
    """The chapters ``--chapters`` names (all by default)."""
    wanted = info.get("chapters")
    return [c for c in chapters if not wanted or c.number in wanted]


def experiments(info: dict, clock: Clock) -> tuple[list[dict], list[dict]]:
    """Each registered experiment on CUDA; returns (outcomes, measurements)."""
    from gpumem.chapters import CHAPTERS
    rows, measured = [], []
    ranks = max(1, min(info["gpu_count"], 8))
    for chapter in _chosen(CHAPTERS, info):
        for exp in chapter.experiments:
            cmd = ["python", "-m", "gpumem", "run", exp.name, "--device", "cuda", "--ranks", str(ranks), "--json"]
            item = " ".join(cmd)
            if not info["cuda_available"]:
                rows.append({"item": item, "outcome": "skipped", "detail": NO_CUDA})
                continue
            if ranks < exp.min_ranks:
                rows.append({"item": item, "outcome": "skipped",
                             "detail": f"needs {exp.min_ranks} GPUs, this machine has {info['gpu_count']}; "
                                       "`make test` runs it on CPU ranks"})
                continue
            if clock.spent():
                rows.append({"item": item, **OUT_OF_TIME})
                continue
            start = time.monotonic()
            proc = _run([sys.executable, *cmd[1:]], clock, cwd=ROOT, capture_output=True, text=True)
            seconds = time.monotonic() - start
            if proc is None:
                rows.append({"item": item, "outcome": "failed", "detail": f"out of --budget time: stopped after {seconds:.0f} s"})
                continue
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                rows.append({"item": item, "outcome": "failed", "detail": tail[:300]})
                continue
            rows.append({"item": item, "outcome": "passed", "detail": f"{seconds:.1f} s"})
            key = f"ch{chapter.number}.run_{exp.name.replace('-', '_')}"
            measured.append({"test": item, "key": f"{key}_seconds", "value": round(seconds, 2), "unit": "s"})
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            for where, value in _cuda_peaks(result):
                measured.append({"test": item, "key": f"{key}.{where}.cuda_max_memory_allocated",
                                 "value": value, "unit": "B"})
    return rows, measured


def notebooks(info: dict, clock: Clock) -> list[dict]:
    """Each registered chapter's notebook under nbval (on CUDA its GPU branches run)."""
    from gpumem.chapters import CHAPTERS
    rows = []
    for chapter in _chosen(CHAPTERS, info):
        for nb in sorted((ROOT / "notebooks").glob(f"{chapter.number}_*.ipynb")):
            item = f"notebooks/{nb.name} under nbval (its CUDA branches)"
            if not info["cuda_available"]:
                rows.append({"item": item, "outcome": "skipped",
                             "detail": NO_CUDA + "; `make test-notebooks` runs its CPU path"})
                continue
            if clock.spent():
                rows.append({"item": item, **OUT_OF_TIME})
                continue
            env = {**os.environ, "GPUMEM_QUIZ_MODE": "text", "GPUMEM_QUIZ_SEED": "0", "MPLBACKEND": "Agg",
                   "TQDM_DISABLE": "1", "GPUMEM_HOME": tempfile.mkdtemp(prefix="gpumem-home-")}
            start = time.monotonic()
            proc = _run([sys.executable, "-m", "pytest", "-q", "--nbval-lax", "--nbval-current-env",
                         "-p", "no:cacheprovider", str(nb)], clock, cwd=ROOT, env=env,
                        capture_output=True, text=True)
            if proc is None:
                rows.append({"item": item, "outcome": "failed",
                             "detail": f"out of --budget time: stopped after {time.monotonic() - start:.0f} s"})
                continue
            last = (proc.stdout.strip().splitlines() or [""])[-1]
            if proc.returncode != 0:                 # the failing cells, for whoever reads the log
                print(f"== {item}: failed\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}", flush=True)
            rows.append({"item": item, "outcome": "passed" if proc.returncode == 0 else "failed", "detail": last[:300]})
    return rows


# -- the report -------------------------------------------------------------------------------------

def report(info: dict, rows: list[dict], measured: list[dict], results_file: str | None) -> str:
    """The short Markdown report: the machine, one line per item, the measurements."""
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "skipped")}
    if info["cuda_available"]:
        head = (f"{info['gpu_count']} x {info['gpu']}, driver {info['driver']}, CUDA {info['cuda']}, "
                f"torch {info['torch']}, DeepSpeed {info['deepspeed']}")
    else:
        head = (f"no CUDA device (torch {info['torch']}, DeepSpeed {info['deepspeed']}): every GPU item "
                f"skipped; nothing was measured")
    lines = [f"# make gpu-check, {info['date']}", "", head, "",
             f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped; "
             f"{len(measured)} measurements; " + (f"results file {results_file}" if results_file
                                                  else "no results file written"), "",
             "| item | outcome | detail |", "|---|---|---|"]
    lines += [f"| `{r['item']}` | {r['outcome']} | {r['detail'].replace('|', '/')} |" for r in rows]
    if measured:
        lines += ["", "| key | value | unit |", "|---|---|---|"]
        lines += [f"| {m['key']} | {m['value']} | {m['unit']} |" for m in measured]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every GPU item; write the results file (CUDA only) and the report; 1 if an item failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=ROOT / "results" / "gpu")
    parser.add_argument("--report", type=Path, default=None,
                        help="default: next to the results file; without CUDA .cache/gpu-check/report.md")
    parser.add_argument("--no-notebooks", action="store_true", help="skip item 3 (the notebooks)")
    parser.add_argument("--chapters", default="",
                        help="comma-separated chapter numbers (02,05) for items 2 and 3; default all")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for all items; what runs out is stopped, the rest skipped")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    sys.path.insert(0, str(ROOT))
    from gpumem.course import gpu_results

    info, clock = machine(), Clock(args.budget)
    info["chapters"] = {c.strip().zfill(2) for c in args.chapters.split(",") if c.strip()}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        rows, measured = gpu_tests(Path(tmp), pytest_args, clock)
    more_rows, more = experiments(info, clock)
    rows, measured = rows + more_rows, measured + more
    if not args.no_notebooks:
        rows += notebooks(info, clock)
    results_file = None
    if info["cuda_available"]:
        data = {k: info[k] for k in ("date", "gpu", "gpu_count", "driver", "cuda", "torch", "deepspeed")}
        data.update(measurements=measured, outcomes=rows)
        try:
            path = gpu_results.write(data, args.results_dir)
        except ValueError as err:           # keep what was measured; the report says why it is raw
            path = Path(args.results_dir) / "unvalidated.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1) + "\n")
            rows.append({"item": "results file", "outcome": "failed", "detail": str(err)[:300]})
        results_file = os.path.relpath(path, ROOT)
        report_path = args.report or path.with_suffix(".md")
    else:
        report_path = args.report or ROOT / ".cache" / "gpu-check" / "report.md"
    text = report(info, rows, measured, results_file)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text)
    print("\n" + text)
    print(f"report written to {os.path.relpath(report_path, ROOT)}")
    return 1 if any(r["outcome"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
