import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """`gpu` tests are skipped with a reason where CUDA is absent."""
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make gpu-check` on a GPU box)")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_home(tmp_path, monkeypatch):
    """Quiz progress goes to a temp folder, never the user's home."""
    monkeypatch.setenv("GPUMEM_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def frozen_heap():
    """For a module whose measurements call ``gc.collect()`` many times (lab 03's SAC runs): what
    is alive when the module starts is collected once, then frozen (``gc.freeze``), so each later
    collection walks only what the module's own tests made. In a long pytest process the heap is
    large and one collection took about 0.16 s (lab 03's SAC draw test: 85 s in the suite)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def run_cli(*args, env=None):
    """Run ``python -m gpumem ARGS`` as a user would; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "gpumem", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=300)


@pytest.fixture
def gpu_record(request):
    """Record one GPU measurement: ``gpu_record("sdpa_flash_peak_bytes", 123, "B")``.

    ``make gpu-check`` sets GPUMEM_GPU_RECORD to a JSON-lines file and turns the lines into the
    committed results file (GPU name, driver, versions, each measurement); elsewhere the values
    are only printed (``pytest -s`` shows them)."""
    import json
    path = os.environ.get("GPUMEM_GPU_RECORD")

    def record(key: str, value, unit: str = "") -> None:
        row = {"test": request.node.nodeid, "key": key, "value": value, "unit": unit}
        print(f"gpu measurement: {key} = {value} {unit}".rstrip())
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
    return record


def cell_output(cell) -> str:
    """A stored notebook cell's text outputs, joined (stream text and text/plain results)."""
    out = []
    for o in cell.get("outputs", []):
        text = o.get("text") or o.get("data", {}).get("text/plain", "")
        out.append("".join(text) if isinstance(text, list) else text)
    return "".join(out)
