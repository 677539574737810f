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
    """The scenario's sum by hand: bytes per parameter x Meta's count + the activation peak."""
    n = models.get("llama-3-70b").n_params()
    per_param = {"pure-bf16": 8, "mixed": 16}[recipe]
    return per_param * n + activations(models.get("llama-3-70b"), 4096).peak


def _gb(x) -> str:
    return f"{x / GB:,.1f} GB"


def test_pure_bf16_scenario_judged_per_gpu():
    """One sequence per GPU: the sum, the traced peak, and per GPU, nothing sharded and states
    split 8 ways (at least weights + optimizer states / 8 + one sequence's activations)."""
    cfg = models.get("llama-3-70b")
    n, acts = cfg.n_params(), activations(cfg, 4096).peak
    total = _step_bytes("pure-bf16")
    assert round(total / GB, 1) == 678.6
    box = diagrams.scenario_box("llama-3-70b", recipe="pure-bf16", gpus=8, gpu="h100-80gb")
    assert _gb(total) in box and "traced peak" in box
    counters = 4 * (9 * 80 + 3)                                   # torch AdamW's step counters
    at_least = (2 + 4) * math.ceil(n / 8) + counters + acts
    assert f"states split 8 ways: between {at_least / GB:,.1f} and" in box
    assert at_least > H100 and acts > h100_usable()               # no split of the states helps
    assert "activations alone" in box
    # all 8 GPUs: one copy of the states, 8 sequences' activations (the note counts one)
    assert f"at least {_gb((2 + 4) * n + 4 * (9 * 80 + 3) + 8 * acts)}, summed {_gb(8 * n + 4 * (9 * 80 + 3) + 8 * acts)}" in box
    assert f"{8 * H100 / GB:,.1f} GB capacity" in box and f"{8 * h100_usable() / GB:,.1f} GB usable" in box


def test_the_traced_peak_is_under_the_sum_and_decides():
    """Unsharded, the mixed step peaks in the optimizer step: 16 B/param + the per-tensor AdamW's
    workspace, 12 B x the largest tensor (the 128,256 x 8,192 embedding); no activation."""
    cfg = models.get("llama-3-70b")
    n = cfg.n_params()
    peak = claims.steps.trace("llama-3-70b", "mixed")
    assert abs(peak.total_peak - (16 * n + 12 * 128_256 * 8_192)) <= 64
    assert peak.total_peak < _step_bytes("mixed")
    box = diagrams.scenario_box("llama-3-70b", recipe="mixed")
    assert f"peak {_gb(peak.total_peak)} -> over capacity" in box
    assert "fits" not in box


def test_8b_fits_once_its_states_are_split():
    box = diagrams.scenario_box("llama-3-8b", recipe="mixed", gpus=8)
    cfg = models.get("llama-3-8b")
    total = 16 * math.ceil(cfg.n_params() / 8) + activations(cfg, 4096).peak
    temps = claims.steps.trace("llama-3-8b", "mixed").peaks["temporaries"]   # the logits' gradient
    assert total + temps < h100_usable()
    assert f"fits, at least {_gb(h100_usable() - total - temps)} under usable" in box


def test_ledger_capacity_rows_say_what_fails():
    rows = {c.id: c for c in claims.CLAIMS}
    assert [c.id for c in claims.CLAIMS] == ["1a", "1a'", "1b", "1c", "1d", "1e", "S2"]
    assert rows["1e"].ours() == 8 * H100 and rows["1e"].verdict() == "close"   # 640 vs 684.2 GB
    # 1d: the traced peak of one sequence's step, not the sum; the verdict is per GPU
    n, cfg = models.get("llama-3-70b").n_params(), models.get("llama-3-70b")
    assert abs(rows["1d"].ours() - (16 * n + 12 * cfg.vocab * cfg.d_model)) <= 64
    why = rows["1d"].why()
    assert "mixes one sequence with 8" in why and f"{h100_usable() / GB:.1f} GB" in why
    assert "want of headroom" not in why
    # S2: pure bf16, ZeRO-3 on 8, full checkpointing, one GPU's traced peak. It holds at least
    # the sharded states and the working set (2 x 2 B x the embedding + the prefetch bucket),
    # and less than the sum of every part.
    states = (2 + 2 + 4) * math.ceil(n / 8) + 4 * (9 * 80 + 3)    # + torch AdamW step counters
    acts = activations(cfg, 4096, policy="full").peak
    gathered = 2 * 2 * cfg.vocab * cfg.d_model + 2 * 50_000_000
    peak = rows["S2"].ours()
    assert states + gathered < peak < states + acts + gathered
    assert ("it fits" in rows["S2"].why()) == (peak <= h100_usable())
    assert "working set" in rows["S2"].why() and "pipeline parallelism" in rows["S2"].why()


def test_recipe_names_cover_every_recipe():
    text = diagrams.recipe_names()
    for recipe in accounting.RECIPES:
        assert recipe in text
    assert '"bf16": {"enabled": true}' in text and "MixedPrecision" in text and "--bf16" in text
    # mixed and mixed-ds are different DeepSpeed configurations; Megatron has a near pure-bf16
    assert '"grad_accum_dtype": "fp32"' in text and "--exp-avg-dtype bf16" in text


def test_deepspeed_stage3_reuses_the_bf16_partition_stages_1_2_clone_it():
    """The recipe table's pure-bf16 note, read from DeepSpeed 0.19.8's source: ZeRO-3 reuses a
    16-bit partition whose dtype is the master's; ZeRO-1/2 always clone the master partition;
    bf16 with fp32 gradient accumulation at stage 1 selects BF16_Optimizer."""
    import inspect
    from deepspeed.runtime import bf16_optimizer, engine
    from deepspeed.runtime.zero import stage3, stage_1_and_2
    src3 = inspect.getsource(stage3.DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions)
    assert "dtype == self.master_weights_and_grads_dtype" in src3
    assert "append(self.fp16_partitioned_groups_flat[i])" in src3
    src12 = inspect.getsource(stage_1_and_2.DeepSpeedZeroOptimizer.__init__)
    assert "detach().clone().to(" in src12 and "dtype=self.master_weights_and_grads_dtype" in src12
    check = inspect.getsource(engine.DeepSpeedEngine._do_optimizer_sanity_check)
    assert "grad_accum_dtype == torch.float32" in check and "== 1" in check
    assert "fp32_groups_gradients_flat" in inspect.getsource(bf16_optimizer.BF16_Optimizer.__init__)
