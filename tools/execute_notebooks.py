"""Execute notebooks in place so their checked outputs are stored (nbval compares against them).

    .venv/bin/python tools/execute_notebooks.py notebooks/01_memory_anatomy.ipynb ...

Runs with GPUMEM_QUIZ_MODE=text (as nbval does) and a throwaway GPUMEM_HOME.
"""

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout: int = 900) -> None:
    nb = nbformat.read(path, as_version=4)
    os.environ["GPUMEM_QUIZ_MODE"] = "text"
    os.environ.setdefault("GPUMEM_HOME", tempfile.mkdtemp(prefix="gpumem-home-"))
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    print("executed", path)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        execute(Path(arg))
    if any("solutions" in arg for arg in sys.argv[1:]):   # execution metadata changed: regenerate
        from gpumem.course import labgen
        labgen.sync(Path(__file__).resolve().parents[1])
