"""Colab: the bootstrap (env/colab_bootstrap.py) in a simulated Colab kernel, the first cell of every
notebook, and the dtype / attention-kernel choice per GPU generation (gpumem.course.device_choice).

Colab is simulated the way Colab itself announces it: a ``google.colab`` module in sys.modules and
COLAB_RELEASE_TAG in the environment; its free GPU by what torch.cuda reports for a Tesla T4
(capability 7.5, 15,360 MiB). pip is not run (that would change this machine's .venv); everything
else the bootstrap does (path, folder, variables, the device line) runs for real."""

import json
import os
import sys
import types

import pytest
import torch

from conftest import ROOT
from gpumem.course import device_choice

sys.path.insert(0, str(ROOT / "env"))
import colab_bootstrap  # noqa: E402

T4_BYTES = 15_360 * 2**20


@pytest.fixture
def colab(monkeypatch):
    """A kernel that looks like Colab's (module + variable); cwd, sys.path and env restored after."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-20261120-060000-RC00")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR"):
        monkeypatch.setenv(name, os.environ.get(name, "unset-before"))


@pytest.fixture
def t4(monkeypatch):
    """torch.cuda as a Colab T4 runtime reports itself."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i=0: types.SimpleNamespace(total_memory=T4_BYTES, major=7, minor=5))


def test_off_colab_nothing_happens():
    assert colab_bootstrap.plan(environ={}, modules={})["on_colab"] is False
    assert "nothing to install" in colab_bootstrap.bootstrap(environ={}, modules={})


def test_on_colab_the_plan_keeps_colabs_torch(colab):
    steps = colab_bootstrap.plan(gpu=True)
    assert steps["on_colab"] and steps["chdir"] == str(ROOT / "notebooks")
    pinned = [a for cmd in steps["commands"] for a in cmd if "==" in a]
    if steps["commands"]:                      # this .venv has the pinned DeepSpeed: a re-run installs nothing
        assert not any(a.lower().startswith("torch==") for a in pinned)
    assert colab_bootstrap.installed()         # this machine's .venv holds the pin, so a re-run skips pip
    assert "DS_ACCELERATOR" not in steps["env"]
    assert colab_bootstrap.plan(gpu=False)["env"]["DS_ACCELERATOR"] == "cpu"


def test_bootstrap_on_a_colab_t4(colab, t4, tmp_path):
    msg = colab_bootstrap.bootstrap(install=False)
    assert os.getcwd() == str(ROOT / "notebooks") and str(ROOT) in sys.path
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(ROOT / ".cache" / "torch_extensions")
    assert "Colab's torch was left as it is" in msg
    assert "Tesla T4 (sm_75): float16 with a loss scaler, SDPA kernel EFFICIENT_ATTENTION" in msg
    assert "15.0 GiB" in msg and "no FlashAttention-2" in msg and "no bf16 tensor cores" in msg


def test_bootstrap_on_a_cpu_runtime(colab, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(colab_bootstrap, "gpu_present", lambda: False)
    msg = colab_bootstrap.bootstrap(install=False)
    assert os.environ["DS_ACCELERATOR"] == "cpu" and "no CUDA device" in msg


def test_the_cell_does_nothing_off_colab(capsys):
    exec(compile(colab_bootstrap.CELL, "cell", "exec"), {})
    assert capsys.readouterr().out == "not on Colab: nothing to install\n"


CHAPTER_NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_starts_with_the_colab_cell(path):
    """The first code cell of each chapter notebook is the bootstrap cell, verbatim."""
    cells = json.loads(path.read_text())["cells"]
    first = next(c for c in cells if c["cell_type"] == "code")
    assert "".join(first["source"]).strip() == colab_bootstrap.CELL.strip(), \
        f"{path.name}: first code cell is not colab_bootstrap.CELL"


def test_readme_badges_open_each_notebook_from_the_published_repo():
    readme = (ROOT / "README.md").read_text()
    slug = colab_bootstrap.REPO_URL.removeprefix("https://github.com/")
    for path in CHAPTER_NOTEBOOKS:
        assert f"https://colab.research.google.com/github/{slug}/blob/main/notebooks/{path.name}" in readme, path.name


# -- dtype and SDPA kernel by GPU generation -------------------------------------------------
# Facts from NVIDIA's architecture pages and PyTorch's SDPA kernel requirements, written out here
# independently of the module's thresholds: bf16 tensor cores arrive with Ampere (8.0), fp16
# tensor cores with Volta (7.0); PyTorch's flash kernel needs 8.0+, its memory-efficient one 5.0+.
GENERATIONS = [
    ("Tesla K80", (3, 7), "float32", "MATH", False),
    ("Tesla P100", (6, 0), "float32", "EFFICIENT_ATTENTION", False),
    ("Tesla V100", (7, 0), "float16", "EFFICIENT_ATTENTION", True),
    ("Tesla T4", (7, 5), "float16", "EFFICIENT_ATTENTION", True),
    ("A100-SXM4-80GB", (8, 0), "bfloat16", "FLASH_ATTENTION", False),
    ("NVIDIA L4", (8, 9), "bfloat16", "FLASH_ATTENTION", False),
    ("NVIDIA H100 80GB HBM3", (9, 0), "bfloat16", "FLASH_ATTENTION", False),
]


@pytest.mark.parametrize("gpu, cap, dtype, sdpa, scaler", GENERATIONS, ids=[g[0] for g in GENERATIONS])
def test_choice_per_generation(gpu, cap, dtype, sdpa, scaler):
    c = device_choice.choose(cap, gpu)
    assert (c.dtype, c.sdpa, c.loss_scaling) == (dtype, sdpa, scaler)
    assert hasattr(torch.nn.attention.SDPBackend, c.sdpa)       # a real kernel name of this torch
    assert device_choice.torch_dtype(c).itemsize == {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    assert gpu in c.describe()


def test_detect_on_this_machine_and_on_a_simulated_t4(t4):
    c = device_choice.detect()
    assert (c.gpu, c.capability, c.dtype) == ("Tesla T4", (7, 5), "float16")


def test_cpu_choice_runs_and_matches_attention_by_hand():
    """The CPU choice restricts SDPA to a kernel this machine has; its output is softmax(QK^T/sqrt d)V."""
    c = device_choice.choose(None)
    assert c.device == "cpu" and c.dtype == "float32"
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))       # (batch, heads, seq, head_dim)
    with device_choice.sdpa_kernel(c):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    by_hand = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1) @ v
    assert torch.allclose(out, by_hand, atol=1e-6)
