"""Chapter 08's formulas (``gpumem.memory.finetune``): LoRA, QLoRA and 8-bit AdamW, counted by hand.

Every expected number below is derived here from the model's published dimensions and the papers'
or libraries' block sizes, not read from the code: LoRA's trainable count (peft's
``print_trainable_parameters`` for Llama-3-8B as published), QLoRA's 4.127 bits (arXiv:2305.14314
section 3), bitsandbytes' 8-bit AdamW blocks of 256 (``Optimizer2State.init_state``), and full
fine-tuning equal to ``accounting`` and ``activations`` byte for byte.
"""

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from gpumem import cli
from gpumem.memory import accounting, finetune, models
from gpumem.memory.activations import activations
from gpumem.memory.estimate import estimate, n_param_tensors
from gpumem.memory.finetune import Finetune

L8B = models.get("llama-3-8b")
L70B = models.get("llama-3-70b")
QLORA = Finetune(adapter="lora", base_dtype="nf4")


# --- LoRA's trainable parameters --------------------------------------------------------------

def test_lora_params_llama3_8b_by_hand_and_published():
    # Llama-3-8B (Meta): h 4096, 8 KV heads x 128 = 1024, FFN 14336, 32 layers. r (in + out):
    per_layer = 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))
    assert per_layer == 1_310_720
    assert finetune.lora_params(L8B, 16) == 32 * per_layer == 41_943_040
    # peft's print_trainable_parameters, as published for this model: all seven projections r=16
    # "trainable params: 41,943,040 || all params: 8,072,204,288"; q,v only r=8: "3,407,872 ||
    # all params: 8,033,669,120" (Meta's 8,030,261,248 base + the adapters)
    assert L8B.n_params() + 41_943_040 == 8_072_204_288
    assert finetune.lora_params(L8B, 8, ("q", "v")) == 32 * 8 * (8192 + 5120) == 3_407_872
    assert L8B.n_params() + 3_407_872 == 8_033_669_120


def test_lora_states_are_16_bytes_per_adapter_element_plus_step_counters():
    n = 41_943_040
    roles = finetune.finetune_states(L8B, Finetune(adapter="lora"))
    assert roles["adapter_weights"] == 4 * n and roles["grads"] == 4 * n           # fp32 (peft default)
    assert roles["optimizer_moments"] == 8 * n and roles["master"] == 0           # fp32 m, v; no master
    assert roles["step_counters"] == 4 * 2 * 7 * 32                                # one per A and B
    assert roles["base_weights"] == 2 * 8_030_261_248                              # frozen bf16 base


# --- QLoRA's NF4 base ---------------------------------------------------------------------------

def test_nf4_bits_per_parameter_from_the_paper():
    # QLoRA section 3: 32-bit absmax per 64 weights costs 32/64 = 0.5 bits; double quantisation
    # (8-bit absmax, one fp32 per 256 of them): 8/64 + 32/(64*256) = 0.127 bits
    assert 8 * finetune.nf4_bytes_per_param() - 4 == pytest.approx(0.127, abs=5e-4)
    assert 8 * finetune.nf4_bytes_per_param() == pytest.approx(4 + 8 / 64 + 32 / 16384)
    assert 8 * finetune.nf4_bytes_per_param(64, 256) < 4.127 + 1e-3


def test_nf4_one_matrix_in_bitsandbytes():
    n = 4096 * 4096       # packed codes; 8-bit absmaxes, fp32 scales, offset, NF4 code, nested map
    assert finetune.nf4_tensor_bytes(n) == (n // 2, n // 64 + 4 * (n // 64 // 256) + 4 + 64 + 1024)


def test_qlora_70b_base_by_hand():
    h, kv, F, L = 8192, 1024, 28672, 80
    linear = L * (2 * h * h + 2 * h * kv + 3 * h * F)           # what Linear4bit replaces
    assert linear == 68_451_041_280
    rest = 2 * 128_256 * h + (2 * L + 1) * h                     # embedding, head, norms: bf16
    assert linear + rest == L70B.n_params()
    roles = finetune.finetune_states(L70B, QLORA)
    assert roles["base_weights"] == linear // 2 + 2 * rest
    per_matrix_tensors = L * 7
    blocks = linear // 64
    assert roles["quant_constants"] == pytest.approx(blocks + 4 * blocks / 256 + 1092 * per_matrix_tensors, abs=3000)
    # the largest quantised matrix, 8192 x 28672, dequantised to bf16 with its fp32 absmaxes
    assert roles["dequant_buffer"] == 2 * h * F + 4 * h * F // 64
    # QLoRA's whole base: within 0.1 % of 4.127 bits for the quantised part
    quant_bits = 8 * (roles["base_weights"] - 2 * rest + roles["quant_constants"]) / linear
    assert quant_bits == pytest.approx(4.127, rel=1e-3)


def test_qlora_is_allowed_with_zero3_and_shards_the_packed_base():
    one = finetune.finetune_states(L70B, QLORA)
    eight = finetune.finetune_states(L70B, QLORA, gpus=8, zero=3)
    assert eight["base_weights"] == pytest.approx(one["base_weights"] / 8, abs=16)
    assert eight["quant_constants"] == one["quant_constants"]      # attributes, not parameters


# --- 8-bit AdamW --------------------------------------------------------------------------------

def test_adam8_blocks_of_256_and_the_small_tensor_rule():
    assert finetune.adam8_bytes([4096 * 4096]) == (2 * 4096 * 4096, 8 * 4096 * 4096 // 256 + 2 * 1024)
    assert finetune.adam8_bytes([4095]) == (8 * 4095, 0)          # under min_8bit_size: fp32 states
    assert finetune.adam8_bytes([257]) == (8 * 257, 0)


@pytest.mark.parametrize("recipe, master", [("mixed", 4), ("pure-bf16", 0)])
def test_full_finetuning_8bit_adamw_llama3_8b(recipe, master):
    # every Llama-3-8B tensor has a multiple of 256 elements and at least 4096: 2 B + 8/256 B each
    n = 8_030_261_248
    roles = finetune.finetune_states(L8B, Finetune(optimizer="adamw-8bit", recipe=recipe))
    g = finetune.grouped(roles)
    assert g["optimizer"] == master * n + 2 * n + n // 32 + 2048
    assert g["params"] == 2 * n and g["grads"] == 2 * n and roles["step_counters"] == 0


# --- full fine-tuning is the course's accounting, byte for byte ---------------------------------

@pytest.mark.parametrize("recipe", accounting.RECIPES)
@pytest.mark.parametrize("gpus, zero", [(1, 0), (8, 1), (8, 2), (8, 3), (3, 3)])
def test_full_finetuning_states_equal_accounting(recipe, gpus, zero):
    for cfg in (L8B, L70B, models.get("tiny")):
        s = accounting.model_states(cfg.n_params(), recipe, gpus, zero, n_tensors=n_param_tensors(cfg))
        g = finetune.grouped(finetune.finetune_states(cfg, Finetune(recipe=recipe), gpus=gpus, zero=zero))
        assert (g["params"], g["grads"], g["optimizer"], g["buffers"]) == (s.params, s.grads, s.optimizer, 0)


@pytest.mark.parametrize("kernel", ["flash", "naive", "eager"])
@pytest.mark.parametrize("policy", ["none", "full", "every-2", "every-other", "selective"])
def test_full_finetuning_activations_equal_activations(kernel, policy):
    for cfg, seq in ((L8B, 4096), (models.get("tiny"), 64)):
        a = activations(cfg, seq, 2, kernel, policy, "mixed")
        d = finetune.finetune_activation_bytes(cfg, Finetune(), seq, 2, attention=kernel, checkpoint=policy)
        assert (d["peak"], d["layers"], d["per_layer"]) == (a.peak, a.layers, a.per_layer)


def test_estimate_with_the_default_setup_is_unchanged():
    plain = estimate(model="llama-3-70b", gpus=8, zero=3).as_dict()
    given = estimate(model="llama-3-70b", gpus=8, zero=3, finetune=Finetune()).as_dict()
    assert plain == given and set(plain["per_gpu"]) == {"params", "grads", "optimizer", "activations",
                                                       "gathered", "total"}
    assert sum(plain["roles"].values()) == sum(plain["per_gpu"][k] for k in ("params", "grads", "optimizer"))


# --- LoRA's activations, from autograd's rules --------------------------------------------------

def test_lora_layer_by_hand_llama3_8b():
    T, h, k, F, a, r, V, s, hd = 4096, 4096, 1024, 14336, 32, 16, 128256, 4096, 128
    norm = 2 * T * h + 4 * T                                       # fused: input + fp32 1/rms
    core = 2 * T * (h + 2 * k) + 2 * T * h + 4 * a * T             # q, k, v, output, logsumexp
    mlp = 2 * T * F + 2 * 2 * T * F                                # silu's input; the product's factors
    a_out = 7 * 2 * T * r                                          # each A's output, bf16 under autocast
    # peft's default: fp32 adapters under autocast -> each adapted projection saves a bf16 copy
    copies = 3 * 2 * T * h + 2 * T * h + 2 * 2 * T * h + 2 * T * F
    later = norm + core + norm + mlp + copies + a_out
    first = later - norm                                           # the embedding needs no gradient
    d = finetune.finetune_activation_bytes(L8B, Finetune(adapter="lora"), s, 1)
    assert (d["per_layer"], d["first_layer"]) == (later, first)
    casts = 2 * 41_943_040                                         # A and B cast to bf16, cached
    outside = 2 * 2 * s * hd + norm                                # RoPE tables, final norm (head frozen)
    loss = (2 + 4 + 4) * T * V + 8
    assert d["peak"] == first + 31 * later + outside + loss + casts
    # bf16 adapters share the base's input tensors: one copy per input, not per projection
    shared = finetune.finetune_activation_bytes(L8B, Finetune(adapter="lora", adapter_dtype="bf16"), s, 1)
    assert shared["per_layer"] == norm + core + norm + mlp + (2 * T * h + 2 * T * h + 2 * T * F) + a_out
    # QLoRA under autocast: peft's Linear4bit does not cast the input: shared, as bf16 adapters
    q = finetune.finetune_activation_bytes(L8B, QLORA, s, 1)
    assert q["per_layer"] == shared["per_layer"] and q["adapter_casts"] == casts
    # ... but its check reads CUDA's autocast only: under CPU autocast it copies, as LoRA does
    q_cpu = finetune.finetune_activation_bytes(L8B, QLORA, s, 1, device="cpu")
    assert q_cpu["per_layer"] == later


def test_lora_full_checkpointing_keeps_layer_inputs():
    T, h = 4096, 4096
    d = finetune.finetune_activation_bytes(L8B, Finetune(adapter="lora"), 4096, 1, checkpoint="full")
    assert d["layers"] == 32 * 2 * T * h


def test_the_rtx3090_scenario_is_computable():
    line = finetune.single_gpu(L70B)
    assert line["capacity"] == 24_576 * 2**20 and line["total"] == line["states"] + line["activations"]
    assert line["short_by"] > 15 * 2**30          # the NF4 base alone is 38 GB: it cannot fit


# --- the command line -----------------------------------------------------------------------------

def one_line_exit_2(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpumem: error: "), err
    return err


@pytest.mark.parametrize("argv, words", [
    (["--base-dtype", "nf4"], "needs --adapter lora"),
    (["--adapter", "lora", "--lora-rank", "0"], "positive integer, got 0"),
    (["--adapter", "lora", "--lora-rank", "-3"], "positive integer"),
    (["--adapter", "lora", "--lora-rank", "x"], "positive integer"),
    (["--adapter", "lora", "--lora-targets", "q,qq"], "unknown LoRA target 'qq'; accepted: a comma-separated"),
    (["--adapter", "lora", "--lora-targets", "q,q"], "named twice"),
    (["--lora-rank", "8"], "goes with --adapter lora"),
    (["--adapter", "lora", "--recipe", "fp32"], "accepted --recipe mixed"),
    (["--adapter", "adapterx"], "invalid choice"),
    (["--optimizer", "adamw-4bit"], "invalid choice"),
    (["--optimizer", "paged-adamw"], "paged-adamw is counted for adapters"),
    (["--adapter", "lora", "--zero", "2", "--gpus", "2", "--offload", "optimizer"], "not counted"),
])
def test_bad_combinations_exit_2_with_one_line(argv, words, capsys):
    assert words in one_line_exit_2(capsys, "estimate", "--model", "llama-3-8b", *argv)


@pytest.mark.parametrize("option", [["--adapter", "lora"], ["--optimizer", "adamw-8bit"], ["--base-dtype", "bf16"]])
def test_trace_of_a_registry_model_refuses_the_finetune_options(option, capsys):
    """The course's Llama has no adapters: the options are refused (they used to be ignored)."""
    assert "goes with --config" in one_line_exit_2(capsys, "trace", "--model", "llama-3-70b", *option)


def test_params_with_an_adapter_is_refused(capsys):
    assert "need --model or --config" in one_line_exit_2(capsys, "estimate", "--params", "70B", "--adapter", "lora")


def test_estimate_json_has_the_roles(capsys):
    argv = ["estimate", "--model", "llama-3-70b", "--adapter", "lora", "--base-dtype", "nf4", "--lora-rank", "64",
            "--lora-targets", "q,v", "--gpus", "2", "--zero", "3", "--json"]
    assert cli.main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["finetune"]["lora_targets"] == ["q", "v"] and d["finetune"]["lora_rank"] == 64
    assert d["roles"]["adapter_weights"] == 4 * 80 * 64 * (8192 + 8192 + 8192 + 1024) // 2
    assert d["per_gpu"]["total"] == sum(d["per_gpu"][k] for k in d["per_gpu"] if k != "total")
    assert cli.main(["estimate", "--model", "llama-3-8b", "--optimizer", "adamw-8bit"]) == 0
    out = capsys.readouterr().out
    assert "8-bit block absmaxes" in out and max(map(len, out.splitlines())) <= 100
    assert cli.main(["estimate", "--model", "llama-3-70b", "--adapter", "lora", "--base-dtype", "nf4",
                     "--optimizer", "adamw-8bit", "--gpus", "2", "--zero", "3"]) == 0
    out = capsys.readouterr().out
    assert "QLoRA r=16" in out and "dequantised bf16 matrix" in out and max(map(len, out.splitlines())) <= 100
    # bitsandbytes' PagedAdamW32bit: two fp32 states per adapter element, no step tensors
    assert cli.main(["estimate", "--model", "llama-3-8b", "--adapter", "lora", "--base-dtype", "nf4",
                     "--optimizer", "paged-adamw", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    n_a = 32 * 16 * (4096 + 4096 + 2 * (4096 + 1024) + 4096 + 4096 + 2 * (4096 + 14336) + 14336 + 4096)
    assert d["roles"]["optimizer_moments"] == 8 * n_a and d["roles"]["step_counters"] == 0


def test_estimate_with_the_options_stays_torch_free():
    code = ("import sys, time; t = time.process_time(); from gpumem import cli\n"
            "rc = cli.main(['estimate', '--model', 'llama-3-70b', '--adapter', 'lora', '--base-dtype', 'nf4', "
            "'--json'])\n"
            "print(rc, time.process_time() - t, 'torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    rc, seconds, torch_loaded = proc.stderr.split()
    assert (rc, torch_loaded) == ("0", "False") and float(seconds) < 0.5, proc.stderr


def test_hf_norm_with_a_frozen_weight_keeps_no_normed_copy():
    # LlamaRMSNorm: pow and the 1/rms multiply save the fp32 input and 1/rms (4Th + 4T); the frozen
    # weight's multiply keeps only the weight. The fused norm keeps the bf16 input (2Th + 4T).
    T, h = 2 * 64, 64
    tiny = models.get("tiny")
    args = (tiny, Finetune(adapter="lora"), 64, 2)
    fused = finetune.finetune_activation_bytes(*args)
    hf = finetune.finetune_activation_bytes(*args, norm="hf", impl="hf")
    assert hf["per_layer"] - fused["per_layer"] == 2 * (4 * T * h - 2 * T * h)
    assert hf["first_layer"] - fused["first_layer"] == 4 * T * h - 2 * T * h     # the MLP norm only
