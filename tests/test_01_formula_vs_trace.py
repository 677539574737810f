"""Chapter 01's activation formula against fake-tensor traces of every registry model.

Its own file so that ``make test`` can run it last in the first stream: its two worker processes
then use the core the other stream has left idle by that time (the other stream ends earlier).
Expected values are traces of the real Llama code (``gpumem.memory.llama`` under
``torch.distributed._tools.mem_tracker.MemTracker``), not the formula's own output.
"""

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future

import pytest

from gpumem.memory import models


def _trace_seqs(model: str) -> tuple[int, int]:
    return (1024, 4096) if not models.get(model).teaching else (64, 256)


_LANE = """
import json, sys
from gpumem.memory import crosscheck
for job in json.loads(sys.argv[1]):
    print(json.dumps([job, crosscheck.formula_vs_trace(*job)]), flush=True)
"""


def _read_lane(proc: subprocess.Popen, futures: dict) -> None:
    """Hand each job's rows to its future as the lane prints them; a lane that dies fails the
    futures it had not answered, with its stderr."""
    for line in proc.stdout:
        job, rows = json.loads(line)
        futures[tuple(job)].set_result(rows)
    proc.wait()
    err = proc.stderr.read()
    for future in futures.values():
        if not future.done():
            future.set_exception(RuntimeError(f"lane exited {proc.returncode}: {err[-2000:]}"))


@pytest.fixture(scope="module")
def formula_rows():
    """``crosscheck.formula_vs_trace`` for every registry model and sequence length, started at
    once in two worker processes (each call is 15 fake-tensor traces; in one process the five
    models take about 7 minutes). Each test waits for its own model's rows only, so a model whose
    rows fail or raise fails its own test. Plain subprocesses, not a multiprocessing pool: a spawn
    pool leaves its resource-tracker process alive until pytest exits, and the launcher's tests
    check that no child process is left."""
    jobs = sorted(((m, s) for m in models.REGISTRY for s in _trace_seqs(m)),
                  key=lambda job: -models.get(job[0]).n_layers)          # the deepest first
    n = max(1, min(2, os.cpu_count() or 1))
    futures = {job: Future() for job in jobs}
    lanes = []
    for k in range(n):
        mine = jobs[k::n]
        proc = subprocess.Popen([sys.executable, "-c", _LANE, json.dumps(mine)], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        reader = threading.Thread(target=_read_lane, args=(proc, {j: futures[j] for j in mine}),
                                  daemon=True)
        reader.start()
        lanes.append((proc, reader))
    try:
        yield futures
    finally:
        for proc, reader in lanes:
            if proc.poll() is None:
                proc.kill()
            reader.join(timeout=30)


@pytest.mark.parametrize("model", list(models.REGISTRY))
def test_formula_matches_trace(model, formula_rows):
    """Every registry model x {1024, 4096} x kernel x policy: activations within 1 %, states exact."""
    worst = 0.0
    for seq in _trace_seqs(model):
        for row in formula_rows[model, seq].result():
            assert row["states_equal"], row
            worst = max(worst, abs(row["formula"] - row["trace"]) / row["trace"])
    assert worst <= 0.01
