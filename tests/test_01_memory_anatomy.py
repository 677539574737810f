"""Chapter 01: recipes, ZeRO arithmetic, activation formulas, exact traces, CLI, DeepSpeed estimators.

(Capacity, the ZeRO-3 working set, the norm option, Megatron's formula, the timeline and the
AdamW implementations have their own files: tests/test_01_capacity.py, tests/test_memory_*.py.)

Expected figures come from outside the code: the ZeRO paper's worked example, the errata's
hand counts (shared/reference/seed-errata.md), Meta's configs, torch's own AdamW and RMSNorm.
"""

import json
import math

import pytest
import torch

from conftest import run_cli
from gpumem.chapters.ch01_memory_anatomy import claims as ch01_claims
from gpumem.memory import accounting, activations, ds_estimators, models, tracing
from gpumem.errors import UsageError
from gpumem.memory.estimate import estimate, n_param_tensors
from gpumem.memory.llama import RMSNorm
from gpumem.memory.optim import MasterWeightAdamW

GB = 10**9


def test_bytes_per_parameter_by_recipe():
    assert {r: accounting.recipe(r).total for r in accounting.RECIPES} == \
        {"pure-bf16": 8, "mixed": 16, "mixed-ds": 18, "fp32": 16}


def test_zero_paper_worked_example():
    # ZeRO paper, Figure 1: 7.5 B params, K = 12, N_d = 64 -> 120, 31.4, 16.6, 1.9 GB
    got = [accounting.model_states(7_500_000_000, "mixed", 64, z).total / GB for z in range(4)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


def test_note_zero1_arithmetic_is_corrected():
    n = models.get("llama-3-70b").n_params()
    # the note's own recipe: 2 + 2 + 4/8 = 4.5 bytes per parameter, not 215 GB
    assert accounting.model_states(n, "pure-bf16", 8, 1).total == 4 * n + 4 * math.ceil(n / 8)
    assert round(accounting.model_states(n, "pure-bf16", 8, 1).total / GB, 1) == 317.5


def test_offload_moves_states_and_checks_stage():
    """Bytes written out from what DeepSpeed 0.19.8 allocates (chapter 05 measures it on 2 ranks):
    offloaded, the host (or drive) holds fp32 master 4 + m 4 + v 4 + the optimizer's fp32 gradient 4
    per shard element; ZeRO-2 keeps no gradient partition on the GPU, ZeRO-1 backward's whole bf16
    gradient until the end-of-backward reduction, ZeRO-3 its bf16 gradient partition in host memory."""
    n, sh = 1_000_000, 250_000
    for recipe in ("mixed", "mixed-ds"):           # offloaded, both recipes describe the same run
        s = accounting.model_states(n, recipe, 4, 2, offload="optimizer")
        assert (s.params, s.grads, s.optimizer, s.host, s.nvme) == (2 * n, 0, 0, (4 + 4 + 4 + 4) * sh, 0)
        s = accounting.model_states(n, recipe, 4, 1, offload="optimizer")   # stage 1 offloads too
        assert (s.params, s.grads, s.optimizer, s.host) == (2 * n, 2 * n, 0, 16 * sh)
        s = accounting.model_states(n, recipe, 4, 3, offload="optimizer")
        assert (s.params, s.grads, s.optimizer, s.host) == (2 * sh, 0, 0, (16 + 2) * sh)
        s = accounting.model_states(n, recipe, 4, 3, offload="optimizer+params")
        assert (s.params, s.grads, s.host) == (0, 0, (16 + 2 + 2) * sh)
    s = accounting.model_states(n, "mixed", 4, 3, offload="optimizer", device="nvme")
    assert (s.params, s.grads, s.host, s.nvme) == (2 * sh, 0, 2 * sh, 16 * sh)   # bf16 grad partition in RAM
    s = accounting.model_states(n, "mixed", 4, 3, offload="optimizer+params", device="nvme")
    assert (s.params, s.grads, s.optimizer, s.host, s.nvme) == (0, 0, 0, 2 * sh, (16 + 2) * sh)
    # no fp32 anywhere: AdamW's bf16 m, v (4 B) and a bf16 gradient for the CPU optimizer (2 B)
    s = accounting.model_states(n, "pure-bf16", 4, 2, offload="optimizer")
    assert (s.params, s.grads, s.host) == (2 * n, 0, (2 + 2 + 2) * sh)
    s = accounting.model_states(n, "fp32", 4, 3, offload="optimizer")   # fp32 m, v, gradient copy, partition
    assert (s.params, s.grads, s.host) == (4 * sh, 0, (8 + 4 + 4) * sh)
    with pytest.raises(UsageError, match="ZeRO stage 3"):
        accounting.model_states(n, "mixed", 4, 2, offload="optimizer+params")
    with pytest.raises(UsageError, match="NVMe"):
        accounting.model_states(n, "mixed", 4, 1, offload="optimizer", device="nvme")
    with pytest.raises(UsageError, match="stage 0"):
        accounting.model_states(n, "mixed", 4, 0, offload="optimizer")
    with pytest.raises(UsageError, match="offloads nothing"):
        accounting.model_states(n, "mixed", 4, 3, offload="none", device="nvme")


def test_deepspeed_reads_offload_only_with_a_zero_stage():
    """The refusal of --zero 0 --offload optimizer follows DeepSpeed 0.19.8: its ZeRO optimizers,
    which do the offloading, exist only when ``zero_enabled`` (stage > 0)."""
    from deepspeed.runtime.config import DeepSpeedConfig
    enabled = {stage: DeepSpeedConfig({"train_batch_size": 1, "zero_optimization": {
        "stage": stage, "offload_optimizer": {"device": "cpu"}}}).zero_enabled for stage in range(4)}
    assert enabled == {0: False, 1: True, 2: True, 3: True}


def test_activation_counts_match_the_errata_hand_count():
    # errata 1c / 5b: flash layer = 2*(6 + 2k/h + 4F/h) sbh bytes: 40.5 sbh (70B), 41 sbh (8B)
    for name, per_sbh in [("llama-3-70b", 40.5), ("llama-3-8b", 41.0)]:
        cfg = models.get(name)
        a = activations.activations(cfg, 4096, 1, "flash")
        assert round(a.per_layer / (4096 * cfg.d_model), 1) == per_sbh   # + logsumexp, 1/rms: 0.03
    a = activations.activations(models.get("llama-3-70b"), 4096)
    assert round(a.layers / GB) == 109          # 80 layers: "109 GB"
    assert round(a.loss / GB, 2) == 5.25        # bf16 + fp32 logits + fp32 log-softmax
    naive = activations.layer_parts(models.get("llama-3-70b"), 4096, 1, "naive", 2)
    assert naive["probabilities"] == 2 * 64 * 4096**2   # per query head: GQA does not help


def test_rmsnorm_gradients_match_torch():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    ours, ref = RMSNorm(16, 1e-5).double(), torch.nn.RMSNorm(16, eps=1e-5).double()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(ours.weight)
    g = torch.randn(3, 5, 16, dtype=torch.float64)
    gx_ours, gw_ours = torch.autograd.grad(ours(x), (x, ours.weight), g)
    gx_ref, gw_ref = torch.autograd.grad(ref(x), (x, ref.weight), g)
    torch.testing.assert_close(gx_ours, gx_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gw_ours, gw_ref, rtol=1e-10, atol=1e-12)


def test_master_weight_adamw_matches_torch_adamw():
    torch.manual_seed(0)
    ref = [torch.randn(7, 3, requires_grad=True), torch.randn(5, requires_grad=True)]
    ours = [p.detach().clone().requires_grad_() for p in ref]
    opt_ref = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, foreach=False)
    opt_ours = MasterWeightAdamW(ours, lr=1e-2, weight_decay=0.1, fp32_grads=True)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in ref]
        for p, q, g in zip(ref, ours, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt_ref.step()
        opt_ours.step()
    for p, q in zip(ref, ours):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("recipe", accounting.RECIPES)
def test_real_step_equals_fake_trace(recipe):
    for kernel, policy in [("flash", "none"), ("eager", "every-other"), ("naive", "selective")]:
        real = tracing.trace_step("tiny", recipe, kernel, policy, seq=48, micro_batch=2, fake=False)
        fake = tracing.trace_step("tiny", recipe, kernel, policy, seq=48, micro_batch=2, fake=True)
        assert real.peaks == fake.peaks and real.total_peak == fake.total_peak


def test_states_equal_trace_for_every_recipe():
    cfg = models.get("mini")
    for recipe in accounting.RECIPES:
        tr = tracing.trace_step(cfg, recipe, seq=32)
        s = accounting.model_states(cfg.n_params(), recipe, n_tensors=n_param_tensors(cfg))
        assert (tr.peaks["params"], tr.peaks["grads"], tr.peaks["optimizer"]) == (s.params, s.grads, s.optimizer)


def test_fast_trace_equals_full_trace_on_full_llama_3_8b():
    full = tracing.trace_step("llama-3-8b", "mixed", "flash", "every-other", 4096)
    fast = tracing.trace_fast("llama-3-8b", "mixed", "flash", "every-other", 4096)
    assert fast.method == "composed"
    assert fast.as_dict() | {"seconds": 0, "method": ""} == full.as_dict() | {"seconds": 0, "method": ""}


def test_estimate_json_contract():
    proc = run_cli("estimate", "--model", "llama-3-70b", "--gpus", "8", "--zero", "3", "--json")
    data = json.loads(proc.stdout)
    per_gpu = data["per_gpu"]
    assert set(per_gpu) == {"params", "grads", "optimizer", "activations", "gathered", "total"}
    assert all(isinstance(v, int) for v in per_gpu.values())
    assert per_gpu["total"] == sum(v for k, v in per_gpu.items() if k != "total")
    # ZeRO-3's working set in bf16: the steady step's fullest gather (embedding, layer 0, layer 1's
    # q, k, v), the embedding's (128,256 x 8,192) gradient, DeepSpeed's 5e8-element reduce bucket
    d, kv, f, emb = 8_192, 1_024, 28_672, 128_256 * 8_192
    steady = emb + (2 * d * d + 2 * d * kv + 3 * d * f) + (d * d + 2 * d * kv)
    assert per_gpu["gathered"] == 2 * steady + 2 * emb + 2 * 500_000_000
    assert sum(data["gathered_parts"].values()) == per_gpu["gathered"]
    n = models.get("llama-3-70b").n_params()
    assert per_gpu["params"] == 2 * math.ceil(n / 8)          # existing keys keep their meaning
    for zero in (0, 1, 2):
        data = json.loads(run_cli("estimate", "--model", "llama-3-70b", "--gpus", "8", "--zero", str(zero),
                                  "--json").stdout)
        assert data["per_gpu"]["gathered"] == 0 and "gathered_parts" not in data
    proc = run_cli("estimate", "--params", "70B", "--zero", "2", "--gpus", "8", "--offload", "optimizer", "--json")
    data = json.loads(proc.stdout)
    assert data["host"] == 16 * 70 * 10**9 // 8 and data["per_gpu"]["activations"] == 0   # 12 B states + fp32 grads
    assert data["per_gpu"]["grads"] == 0 and data["per_gpu"]["params"] == 2 * 70 * 10**9


def test_estimate_table_names_the_working_set():
    proc = run_cli("estimate", "--model", "llama-3-8b", "--gpus", "64", "--zero", "3")
    assert proc.returncode == 0, proc.stderr
    assert "gathered" in proc.stdout and "ZeRO-3 working set" in proc.stdout
    assert "steady step" in proc.stdout and "reduce) bucket" in proc.stdout
    assert "gathered" not in run_cli("estimate", "--model", "llama-3-8b", "--zero", "2", "--gpus", "8").stdout


@pytest.mark.parametrize("args, key, value", [
    (["--model", "tiny", "--seq", "4k"], "seq", 4096),
    (["--model", "tiny", "--seq", "8K"], "seq", 8192),
    (["--model", "tiny", "--seq", "4096"], "seq", 4096),
    (["--params", "7.5e9"], "n_params", 7_500_000_000),
    (["--params", "70B"], "n_params", 70_000_000_000),
    (["--params", "8.03B"], "n_params", 8_030_000_000),
    (["--params", "125M"], "n_params", 125_000_000),
    (["--params", "8030261248"], "n_params", 8_030_261_248),
])
def test_friendly_counts(args, key, value):
    proc = run_cli("estimate", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[key] == value


@pytest.mark.parametrize("args, says", [
    (["estimate", "--model", "llama-2-7b"], "unknown model 'llama-2-7b'"),
    (["estimate", "--params", "0"], "--params must be a positive count"),
    (["estimate", "--params", "-70B"], "--params must be a positive count"),
    (["estimate", "--model", "tiny", "--gpus", "0"], "--gpus must be a positive integer"),
    (["estimate", "--model", "tiny", "--zero", "4"], "invalid choice: 4"),
    (["estimate", "--model", "tiny", "--seq", "4q"], "--seq must be a positive whole number"),
    (["estimate", "--model", "tiny", "--seq", "0"], "--seq must be a positive whole number"),
    (["estimate", "--model", "tiny", "--seq", "4.1k"], "--seq must be a positive whole number"),
    (["estimate", "--params", "7.5e9.1"], "--params must be a positive count"),
    (["estimate", "--params", "1e-3"], "--params must be a positive count"),
    (["estimate", "--params", "0.5"], "--params must be a positive count"),
    (["estimate", "--params", "70G"], "--params must be a positive count"),
    (["estimate", "--params", "70B", "--offload", "optimizer"], "needs ZeRO stage 1, 2 or 3"),
    (["estimate", "--model", "tiny", "--offload-device", "nvme"], "--offload-device nvme with --offload none"),
    (["estimate", "--model", "tiny", "--zero", "2", "--offload", "optimizer", "--offload-device", "nvme"],
     "NVMe offload needs ZeRO stage 3"),
    (["estimate", "--model", "tiny", "--largest-layer", "1B"], "--largest-layer goes with --params"),
    (["trace", "--model", "tiny", "--adamw", "foreach"], "applies to the pure-bf16 and fp32 recipes"),
    (["estimate", "--model", "tiny", "--offload-device", "tape"], "invalid choice: 'tape'"),
    (["estimate", "--params", "7B", "--checkpoint", "full"], "--params counts model states only"),
    (["trace", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["estimate", "--model", "tiny", "--recipe", "fp8"], "invalid choice: 'fp8'"),
])
def test_bad_input_one_line_exit_2(args, says):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr, proc.stderr


def test_deepspeed_estimators_differ_by_what_we_say():
    cfg = models.get("llama-3-70b")
    rows = {r["stage"]: r for r in ds_estimators.compare("llama-3-70b", 8)}
    shard = math.ceil(cfg.n_params() / 8)
    assert abs(rows[2]["difference"] - 2 * shard) <= 8          # bf16 grads, sharded (int rounding)
    assert abs(rows[3]["difference"] - 4 * cfg.largest_layer_params()) <= 8   # gathered layer buffer


def test_ledger_verdicts():
    verdicts = {c.id: c.verdict() for c in ch01_claims.CLAIMS}
    # errata: 1a right, 1b wrong for the standard recipe, 1c right number by coincidence,
    # 1d total low; 1e: 640 GB is 8 x the box's name, the GPUs report 8 x 81,559 MiB (+6.9 %)
    assert verdicts == {"1a": "agrees", "1a'": "agrees", "1b": "wrong", "1c": "close", "1e": "close",
                        "1d": "wrong", "S2": "wrong"}


def test_tracker_wrapper_pins_the_private_api():
    """PeakTracker relies on MemTracker internals: this torch version, these attributes."""
    from torch.distributed._tools.mem_tracker import MemTracker
    assert torch.__version__.split("+")[0] == "2.13.0"
    t = MemTracker()
    for attr in ("_curr_mem_snap", "_mod_tracker", "_in_opt", "_update_and_maybe_create_winfos",
                 "_track", "_update_peak_stats"):
        assert hasattr(t, attr), attr


def test_trace_rejects_bad_options():
    with pytest.raises(UsageError):
        tracing.trace_step("tiny", "fp8")
    with pytest.raises(UsageError):
        estimate(model="tiny", seq=0)


def test_lab_prints_the_layer_code_without_its_comments():
    """Lab 01 shows the code part 2's layer runs (the course's layer with Qwen3's attention) and asks
    what each operation saves: the source is the code that runs, and its comments (which name what is
    saved) are gone."""
    import inspect
    from gpumem.chapters.ch01_memory_anatomy import labcheck
    from gpumem.memory import llama
    text = labcheck.layer_source()
    for name in ("WideBlock", "RMSNorm (fused)", "WideAttention", "core_attention", "repeat_kv",
                 "MLP", "apply_rope"):
        assert f"# {name}\n" in text
    assert "# bf16, saved" in inspect.getsource(llama.core_attention) and "saved" not in text
    assert "ctx.save_for_backward(x, weight, rstd)" in text and "scaled_dot_product_attention" in text


def test_split_states_brackets_the_per_gpu_peak():
    """With the states split evenly (no working set), one GPU's traced peak lies between the
    bounds the scenario box prints: weights + optimizer states / N + the activation peak, and
    every part at its largest (temporaries included). The sum of states and activations alone is
    no bound: at 64 GPUs the logits' gradient outweighs the gradient shard it double-counts."""
    from gpumem.chapters.ch01_memory_anatomy import steps
    from gpumem.memory import timeline
    tl = timeline.record("llama-3-8b", "mixed", seq=2048)
    for n in (2, 8, 64):
        z = tl.zero3_per_gpu(n, accounting.GatheredBytes(0, 0, 0, 0))
        bounds = steps.split_states("llama-3-8b", "mixed", n, seq=2048)
        assert bounds["at_least"] <= z.total(z.peak()) <= bounds["at_most"], n
    assert z.total(z.peak()) > bounds["sum"]
