"""Chapter 01's notebook as a learner reads it (issue 17): narrow checked outputs, the GPU table's
figures with their sources, section headings other chapters link to, results stated first, and a
main path under 4,500 words. Figures are derived here by hand (nvidia-smi MiB, datasheet speeds,
the layer's tensors counted one by one), never read back from the code that prints them."""

import json
import re
from pathlib import Path

import pytest

from conftest import cell_output
from gpumem.chapters.ch01_memory_anatomy import diagrams
from gpumem.memory import gpus, models

ROOT = Path(__file__).resolve().parents[1]
NB01 = ROOT / "notebooks" / "01_memory_anatomy.ipynb"
NB00 = ROOT / "notebooks" / "00_setup.ipynb"
GB, GiB, MiB = 10**9, 2**30, 2**20


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _checked_lines(path):
    for i, c in enumerate(_cells(path)):
        if c["cell_type"] == "code" and "nbval-check-output" in c.get("metadata", {}).get("tags", []):
            for line in cell_output(c).splitlines():
                yield i, line


def _markdown(path) -> list[str]:
    return ["".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown"]


def test_checked_outputs_of_chapter_01_fit_100_columns():
    wide = [(i, len(line)) for i, line in _checked_lines(NB01) if len(line) > 100]
    assert not wide, wide


def test_gpu_table_fits_100_columns_in_chapter_00_too():
    table = gpus.table()
    assert max(map(len, table.splitlines())) <= 100
    stored = [line for _, line in _checked_lines(NB00)]
    for line in table.splitlines():
        if line.strip():
            assert line in stored, line               # notebook 00 was re-executed with it


# nvidia-smi memory.total (MiB) and datasheet speeds, typed from the sources, not from gpus.py:
# dense bf16 TF, HBM TB/s, NVLink GB/s per direction (NVIDIA's 600/900 GB/s are both directions),
# PCIe per direction (Gen4 x16 31.5 GB/s, Gen5 x16 63 GB/s, Gen3 x16 15.75 GB/s).
SOURCES = {"a100-40gb": (40_960, "312 TF", "1.55 TB/s", "300 GB/s", "31.5 GB/s"),
           "a100-80gb": (81_920, "312 TF", "2.04 TB/s", "300 GB/s", "31.5 GB/s"),
           "h100-80gb": (81_559, "989 TF", "3.35 TB/s", "450 GB/s", "63.0 GB/s"),
           "h200": (143_771, "989 TF", "4.80 TB/s", "450 GB/s", "63.0 GB/s"),
           "l4": (23_034, "121 TF", "0.30 TB/s", None, "31.5 GB/s"),
           "t4": (15_360, "none", "0.32 TB/s", None, "15.8 GB/s")}


@pytest.mark.parametrize("name", list(SOURCES))
def test_gpu_table_keeps_every_figure(name):
    mib, bf16, hbm, link, pcie = SOURCES[name]
    table = gpus.table()
    mem = next(line for line in table.splitlines() if line.startswith(name + " ") and "MiB" in line)
    cap = mib * MiB
    usable = cap - 2 * GiB - int(0.05 * cap)         # 1 GiB context + 1 GiB NCCL + 5 %
    for figure in (f"{mib:,} MiB", f"{cap / GB:.1f} GB", f"{cap / GiB:.1f} GiB", f"{usable / GB:.1f} GB"):
        assert figure in mem, (figure, mem)
    speed = next(line for line in table.splitlines() if line.startswith(name + " ") and "TB/s" in line)
    for figure in (bf16, hbm, link or " - ", pcie):
        assert figure in speed, (figure, speed)


def test_gpu_table_names_its_sources_and_reserve():
    table = gpus.table()
    assert "nvidia-smi memory.total" in table and "PR #2797" in table and "datasheets" in table
    assert "128/130" in table and "per direction" in table
    assert "reserve = CUDA context 1.0 GiB + NCCL 1.0 GiB + 5% of capacity" in table


def test_megatron_table_fits_and_adds_up_by_hand():
    cfg = models.get("llama-3-70b")
    s, h, a, k, F = 4096, cfg.d_model, cfg.n_heads, cfg.kv_dim, cfg.ffn
    text = diagrams.megatron_table(cfg, s)
    assert max(map(len, text.splitlines())) <= 100
    korthikanti = 34 * s * h + 5 * a * s * s                     # Korthikanti et al., 4.1, b = 1
    # Llama, tensor by tensor: 6 tensors h wide (2 norm inputs, q/k/v input, q, W_o input, MLP
    # input), k and v, four F-wide SwiGLU tensors, fp32 logsumexp per head and row, 2 x fp32 1/rms
    llama = 2 * s * (6 * h + 2 * k + 4 * F) + 4 * a * s + 8 * s
    total = next(line for line in text.splitlines() if line.startswith("total"))
    assert f"{korthikanti / 1e6:,.0f} MB" in total and f"{llama / 1e6:,.0f} MB" in total
    assert f"{korthikanti / (s * h):.2f}" in total and f"{llama / (s * h):.2f}" in total


def test_recipe_names_fit_100_columns():
    assert max(map(len, diagrams.recipe_names().splitlines())) <= 100


HEADINGS = ["1 · The problem in numbers", "2 · Recipes: what a parameter costs",
            "3 · Activations, tensor by tensor",
            "4 · The exact trace: one full Llama-3-70B step on a laptop", "5 · Three ways, one answer",
            "6 · At scale: memory and time", "7 · In the frameworks", "8 · The note's claims",
            "9 · Your model"]


def test_section_headings_unchanged_and_results_first():
    md = "\n\n".join(_markdown(NB01))
    heads = re.findall(r"^## (.+)$", md, flags=re.M)
    assert [x for x in heads if x[0].isdigit()] == HEADINGS
    for head in HEADINGS:
        if head.startswith("7"):                              # a reference table, no finding
            continue
        body = md.split(f"## {head}\n", 1)[1].lstrip()
        assert body.startswith("**"), head                   # the section's finding comes first


def test_section_leads_quote_numbers_the_notebook_prints():
    """Every GB/MB figure in a section's lead sentence is in a stored output of the notebook."""
    md = "\n\n".join(_markdown(NB01))
    outputs = "\n".join(cell_output(c) for c in _cells(NB01) if c["cell_type"] == "code")
    for head in HEADINGS:
        lead = md.split(f"## {head}\n", 1)[1].lstrip()
        lead = lead.split("**", 2)[1] if lead.startswith("**") else ""
        for number, unit in re.findall(r"(\d[\d,]*(?:\.\d+)?) (GB|MB)", lead):
            assert f"{number} {unit}" in outputs, (head, number, unit)


def test_main_path_under_4500_words():
    words = sum(len(re.findall(r"\S+", m)) for m in _markdown(NB01))
    assert words < 4500, words


def test_zero3_full_checkpoint_peak_is_at_the_turn_to_backward():
    """Section 4's prose: with full checkpointing on 8 GPUs the peak is at the start of backward
    (the loss), where the gradient shard DeepSpeed allocates for the whole step (2 B x psi / 8)
    sits beside the layer inputs, the logits' gradient, the output head gathered whole and
    DeepSpeed's 5e8-element reduce bucket."""
    import math
    from gpumem.chapters.ch01_memory_anatomy import steps
    from gpumem.memory import accounting
    cfg = models.get("llama-3-70b")
    z = steps.timeline("llama-3-70b", "mixed", "full").zero3_per_gpu(
        8, accounting.zero3_gathered(cfg, "mixed"), cfg)
    i = z.peak()
    assert (z.phases[i], z.modules[i]) == ("backward", "loss")
    shard = 2 * math.ceil(cfg.n_params() / 8)
    assert min(z.series["grads"]) == shard == z.at(i)["grads"]      # held from the first operator
    by_hand = 2 * cfg.vocab * cfg.d_model + 2 * 500_000_000         # the head in bf16 + the bucket
    assert z.at(i)["gathered"] == by_hand
