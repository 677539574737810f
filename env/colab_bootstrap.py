"""Colab set-up: install DeepSpeed and gpumem next to Colab's own torch, and do nothing elsewhere.

Run from a clone of the course: ``python env/colab_bootstrap.py``. Colab ships a CUDA torch; the
course's torch pin is left out so it is kept. Imports nothing from gpumem (not installed yet).
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def on_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def colab_requirements(requirements: Path = REPO / "env" / "requirements.txt") -> list[str]:
    """The pinned list minus torch (Colab's CUDA build stays) and minus JupyterLab itself."""
    keep = []
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        name = line.split("==")[0].strip().lower()
        if line and name not in {"torch", "jupyterlab", "playwright"}:
            keep.append(line)
    return keep


def pip_commands() -> list[list[str]]:
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    return [pip + colab_requirements(), pip + ["--no-deps", "-e", str(REPO)]]


def bootstrap(force: bool = False) -> str:
    if not (force or on_colab()):
        return "not on Colab: nothing to install (use `make lab` on your own machine)"
    for cmd in pip_commands():
        subprocess.run(cmd, check=True)
    return "installed DeepSpeed and gpumem; Colab's torch was left as it is"


if __name__ == "__main__":
    print(bootstrap(force="--force" in sys.argv))
