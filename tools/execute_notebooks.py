"""Execute notebooks in place so their checked outputs are stored (nbval compares against them).

    .venv/bin/python tools/execute_notebooks.py notebooks/01_memory_anatomy.ipynb ...

Runs with GPUMEM_QUIZ_MODE=text (as nbval does) and a throwaway GPUMEM_HOME. A cell whose
first line is ``# NBVAL_CHECK_OUTPUT`` gets that line replaced by the cell tag
``nbval-check-output`` (nbval reads both; the tag keeps the comment out of the learner's way).
"""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient


MARKER, TAG = "# NBVAL_CHECK_OUTPUT", "nbval-check-output"


def markers_to_tags(nb) -> int:
    """Move ``# NBVAL_CHECK_OUTPUT`` comment lines into the cell tag; returns cells changed."""
    changed = 0
    for cell in nb.cells:
        lines = cell.source.splitlines()
        if cell.cell_type == "code" and any(line.strip() == MARKER for line in lines):
            cell.source = "\n".join(line for line in lines if line.strip() != MARKER)
            tags = cell.metadata.setdefault("tags", [])
            if TAG not in tags:
                tags.append(TAG)
            changed += 1
    return changed


_PRIVATE: list[Path] = []


def _private(name: str) -> Path:
    """A folder of this execution's own (quiz progress, the kernels' temp files), removed at exit."""
    if not _PRIVATE:
        _PRIVATE.append(Path(tempfile.mkdtemp(prefix="gpumem-execute-")))
        atexit.register(shutil.rmtree, _PRIVATE[0], True)
    folder = _PRIVATE[0] / name
    folder.mkdir(exist_ok=True)
    return folder


def execute(path: Path, timeout: int = 900) -> None:
    nb = nbformat.read(path, as_version=4)
    markers_to_tags(nb)
    os.environ["GPUMEM_QUIZ_MODE"] = "text"
    os.environ.setdefault("GPUMEM_HOME", str(_private("home")))
    os.environ["TMPDIR"] = str(_private("tmp"))     # another run's leftovers are not swept into outputs
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    os.environ.setdefault("TQDM_DISABLE", "1")      # no progress bars frozen in stored outputs
    os.environ.setdefault("GPUMEM_QUIZ_SEED", "0")  # quizzes draw the same numbers each execution
    if not Path("/dev/nvidia0").exists():           # DeepSpeed's "Setting accelerator to CPU" warning
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
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
