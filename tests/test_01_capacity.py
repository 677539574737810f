"""Chapter 01 and the GPU table: capacity in the unit the device reports, usable after a stated
reserve, and every verdict of the chapter that depends on them.

Expected values are derived here by hand from nvidia-smi's MiB figures (81,559 MiB for an
"80 GB" H100), the reserve's three terms and Meta's parameter count, not read off the code.
"""

import math

import pytest

from gpumem.chapters.ch01_memory_anatomy import claims, diagrams
from gpumem.errors import UsageError
from gpumem.memory import accounting, gpus, models
from gpumem.memory.activations import activations

MiB, GiB, GB = 2**20, 2**30, 10**9
H100 = 81_559 * MiB


def h100_usable() -> int:
    return H100 - 2 * GiB - int(0.05 * H100)        # context 1 GiB + NCCL 1 GiB + 5 %


def test_capacity_is_what_the_device_reports():
    g = gpus.get("h100-80gb")
    assert g.capacity == H100 == 85_520_809_984
    assert round(g.capacity / GB, 1) == 85.5 and round(g.capacity / GiB, 1) == 79.6
    assert gpus.get("a100-80gb").capacity == 80 * GiB            # 81,920 MiB
    assert round(gpus.get("h200").capacity / GiB) == 140          # "141 GB" is about 140 GiB
    for g in gpus.REGISTRY.values():
        assert g.capacity % MiB == 0                              # nvidia-smi reports whole MiB
        assert g.capacity != round(g.capacity / GB) * GB          # never the name on the box


def test_usable_is_capacity_minus_the_stated_reserve():
    assert gpus.usable("h100-80gb") == h100_usable()
    assert gpus.usable(H100) == gpus.usable(gpus.get("h100-80gb"))
    text = gpus.DEFAULT_RESERVE.describe()
    assert "1.0 GiB" in text and "5%" in text
    table = gpus.table()
    assert "81,559 MiB" in table and "85.5 GB" in table and "79.6 GiB" in table
    assert f"{h100_usable() / GB:.1f} GB" in table and "reserve = " in table


def test_unknown_gpu_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown GPU 'v100'; accepted: a100-40gb"):
        gpus.get("v100")


def _step_bytes(recipe: str) -> int:
    """The scenario's total by hand: bytes per parameter x Meta's count + the activation peak."""
    n = models.get("llama-3-70b").n_params()
    per_param = {"pure-bf16": 8, "mixed": 16}[recipe]
    return per_param * n + activations(models.get("llama-3-70b"), 4096).peak


def test_pure_bf16_scenario_is_under_capacity_but_over_usable():
    total = _step_bytes("pure-bf16")
    assert round(total / GB, 1) == 678.6
    assert 8 * h100_usable() < total < 8 * H100                  # no headroom, not no capacity
    box = diagrams.scenario_box("llama-3-70b", recipe="pure-bf16", gpus=8, gpu="h100-80gb")
    assert "under capacity" in box and "over usable" in box and "does NOT fit" not in box
    assert f"{8 * H100 / GB:,.1f} GB" in box and f"{8 * h100_usable() / GB:,.1f} GB" in box


def test_mixed_scenario_is_over_capacity():
    total = _step_bytes("mixed")
    assert total > 8 * H100
    assert "does NOT fit: over the capacity" in diagrams.scenario_box("llama-3-70b", recipe="mixed")


def test_ledger_capacity_rows_say_what_fails():
    rows = {c.id: c for c in claims.CLAIMS}
    assert rows["1e"].ours() == 8 * H100 and rows["1e"].verdict() == "close"   # 640 vs 684.2 GB
    why = rows["1d"].why()
    assert "want of headroom" in why and f"{8 * h100_usable() / GB:,.1f} GB" in why
    # S2: pure bf16, ZeRO-3 on 8, full checkpointing. Without the working set the step is under
    # one GPU's capacity and over its usable memory; with it (2 x 2 B x the embedding + the
    # prefetch bucket) it is over the capacity as well.
    n, cfg = models.get("llama-3-70b").n_params(), models.get("llama-3-70b")
    states = (2 + 2 + 4) * math.ceil(n / 8) + 4 * (9 * 80 + 3)   # + torch AdamW step counters
    acts = activations(cfg, 4096, policy="full").peak
    gathered = 2 * 2 * cfg.vocab * cfg.d_model + 2 * 50_000_000
    assert rows["S2"].ours() == states + acts + gathered
    assert h100_usable() < states + acts < H100 < states + acts + gathered
    assert "want of headroom" in rows["S2"].why() and "working set" in rows["S2"].why()


def test_recipe_names_cover_every_recipe():
    text = diagrams.recipe_names()
    for recipe in accounting.RECIPES:
        assert recipe in text
    assert '"bf16": {"enabled": true}' in text and "MixedPrecision" in text and "--bf16" in text
