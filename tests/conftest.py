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


def run_cli(*args, env=None):
    """Run ``python -m gpumem ARGS`` as a user would; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "gpumem", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=300)
