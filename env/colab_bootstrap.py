"""Colab set-up: install DeepSpeed and gpumem next to Colab's own torch, and do nothing elsewhere.

Every chapter notebook starts with :data:`CELL`: on Colab it clones the course into
``/content/fitting-70b`` (once) and calls :func:`bootstrap`, which pip-installs the pinned list
minus torch (Colab ships a CUDA torch; the course's CPU pin would replace it), puts the checkout
on ``sys.path`` (an editable install only reaches a kernel started after it), moves into
``notebooks/`` and says which dtype and attention kernel the GPU branches will use (a free T4:
fp16 with a loss scaler and SDPA's memory-efficient kernel). Re-running the cell reinstalls
nothing. Anywhere else the cell prints one line and does nothing.

Also runnable from a clone: ``python env/colab_bootstrap.py [--force]``. Imports nothing from
gpumem before gpumem is installed.
"""

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPO_URL = "https://github.com/fitting-70b/fitting-70b"     # where the course is published
CLONE_DIR = "/content/fitting-70b"

CELL = f'''# Colab only: fetch the course, install DeepSpeed + gpumem beside Colab's torch. Elsewhere: nothing.
import sys
if "google.colab" in sys.modules:
    import os, subprocess
    if not os.path.isdir("{CLONE_DIR}"):
        subprocess.run(["git", "clone", "-q", "--depth=1", "{REPO_URL}", "{CLONE_DIR}"], check=True)
    sys.path.insert(0, "{CLONE_DIR}/env")
    import colab_bootstrap
    print(colab_bootstrap.bootstrap())
else:
    print("not on Colab: nothing to install")'''


def on_colab(environ=None, modules=None) -> bool:
    """Whether this kernel runs on Colab (its ``google.colab`` module or its release tag)."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    return "google.colab" in modules or "COLAB_RELEASE_TAG" in environ


def gpu_present() -> bool:
    """Whether an NVIDIA device node exists (Colab's GPU runtimes have one; CPU runtimes do not)."""
    return Path("/dev/nvidia0").exists()


NOT_ON_COLAB = {"torch", "jupyterlab", "playwright", "sphinx", "myst-nb", "sphinx-book-theme", "jupyterquiz"}


def colab_requirements(requirements: Path = REPO / "env" / "requirements.txt") -> list[str]:
    """The pinned list minus torch (Colab's CUDA build stays), JupyterLab itself, the browser tests'
    playwright and the book's builders (``make site``: Sphinx and its theme, not used on Colab)."""
    keep = []
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        name = line.split("==")[0].strip().lower()
        if line and name not in NOT_ON_COLAB:
            keep.append(line)
    return keep


def pip_commands() -> list[list[str]]:
    """The two pip commands: the pinned list without torch, then gpumem itself (editable)."""
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    return [pip + colab_requirements(), pip + ["--no-deps", "-e", str(REPO)]]


def installed() -> bool:
    """Whether the pinned DeepSpeed is installed already (a re-run of the cell)."""
    pin = next(r.split("==")[1] for r in colab_requirements() if r.startswith("deepspeed=="))
    try:
        return metadata.version("deepspeed") == pin
    except metadata.PackageNotFoundError:
        return False


def plan(environ=None, modules=None, gpu: bool | None = None) -> dict:
    """What :func:`bootstrap` does here, as data: pip commands, the path it adds, the folder it
    moves to and the variables it sets (nothing at all off Colab)."""
    if not on_colab(environ, modules):
        return {"on_colab": False, "commands": [], "sys_path": None, "chdir": None, "env": {}}
    gpu = gpu_present() if gpu is None else gpu
    env = {"TORCH_EXTENSIONS_DIR": str(REPO / ".cache" / "torch_extensions")}   # DeepSpeed's JIT ops, once
    if not gpu:
        env["DS_ACCELERATOR"] = "cpu"      # a CPU runtime: DeepSpeed's CPU accelerator, no warning
    return {"on_colab": True, "commands": [] if installed() else pip_commands(), "sys_path": str(REPO),
            "chdir": str(REPO / "notebooks"), "env": env}


def device_line() -> str:
    """What the GPU branches will use on this runtime (gpumem.course.device_choice)."""
    from gpumem.course import device_choice
    choice = device_choice.detect()
    line = choice.describe()
    if choice.device == "cuda":
        import torch
        total = torch.cuda.get_device_properties(0).total_memory
        line += f"; {total / 2**30:.1f} GiB of GPU memory"
    return line


def bootstrap(force: bool = False, install: bool = True, environ=None, modules=None) -> str:
    """Set up this kernel on Colab (``force``: anywhere); returns what was done, in words."""
    environ = os.environ if environ is None else environ
    if force:
        environ = {**environ, "COLAB_RELEASE_TAG": environ.get("COLAB_RELEASE_TAG", "forced")}
    steps = plan(environ, modules)
    if not steps["on_colab"]:
        return "not on Colab: nothing to install (use `make lab` on your own machine)"
    if install:
        for cmd in steps["commands"]:
            subprocess.run(cmd, check=True)
    os.environ.update(steps["env"])
    if steps["sys_path"] not in sys.path:
        sys.path.insert(0, steps["sys_path"])
    os.chdir(steps["chdir"])
    done = ("installed DeepSpeed and gpumem" if steps["commands"] and install
            else "DeepSpeed and gpumem already installed")
    return f"{done}; Colab's torch was left as it is. {device_line()}"


if __name__ == "__main__":
    print(bootstrap(force="--force" in sys.argv))
