"""Chapter 08 run for real on the CPU (issue 23, part 2) and traced (part 3).

References independent of the code under test: hand counts from the tiny model's shapes and the
libraries' documented block sizes (NF4: 64 weights per uint8 absmax, 256 absmaxes per fp32 scale,
bitsandbytes ``quantize_4bit``; 8-bit AdamW: 256 values per fp32 absmax, fp32 states under
4,096 elements, bitsandbytes ``Optimizer2State.init_state``), and the formula of
``gpumem.memory.finetune`` written by another hand. Losses: behaviour stated per test.
"""

import pytest

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from gpumem.memory import finetune as F  # noqa: E402
from gpumem.memory.finetune_acts import finetune_activations  # noqa: E402
from gpumem.memory.hf_trace import raw_config  # noqa: E402
from gpumem.runs import finetune_run as fr  # noqa: E402

# the tiny model by hand: d 128, kv width 2 x 32 = 64, FFN 256, vocabulary 256, 2 layers
D, KV, FF, V, L, R = 128, 64, 256, 256, 2, 32
MATS = [(D, D), (D, KV), (D, KV), (D, D), (D, FF), (D, FF), (FF, D)]    # (in, out): q k v o gate up down
N_QUANT = L * sum(i * o for i, o in MATS)                                 # 294,912 NF4 weights
N_REST = 2 * V * D + (2 * L + 1) * D                                      # embedding, head, 5 norms
N = N_QUANT + N_REST                                                      # 361,088
N_LORA = L * sum(R * (i + o) for i, o in MATS)                            # 131,072
LORA_TENSORS = 2 * 7 * L                                                  # an A and a B per matrix


def ceil(a, b):
    return -(-a // b)


def adam8(sizes):
    """bitsandbytes 8-bit AdamW by hand: (two uint8 states + an fp32 absmax per 256 each), or two
    fp32 states under 4,096 elements."""
    return sum(2 * n + 8 * ceil(n, 256) if n >= 4096 else 8 * n for n in sizes)


def nf4(n):
    """NF4 with double quantisation by hand: packed codes, uint8 absmax per 64, fp32 per 256 absmaxes."""
    return n // 2 + ceil(n, 64) + 4 * ceil(ceil(n, 64), 256)


@pytest.fixture(scope="module")
def runs():
    return fr.run_all(steps=4)


@pytest.fixture(scope="module")
def cfg():
    return raw_config(fr.TINY)[1]


def test_trainable_counts_by_hand_formula_and_library(runs, cfg):
    assert N == 361_088 and N_LORA == 131_072
    for name in ("full", "full-8bit"):
        assert runs[name]["trainable"] == N == cfg.n_params()
    for name in ("lora", "qlora", "qlora-8bit"):
        assert runs[name]["trainable"] == N_LORA == F.lora_params(cfg, R)


def test_full_finetuning_bytes(runs, cfg):
    b, f = runs["full"]["bytes"], F.finetune_states(cfg, fr.SETUPS["full"])
    assert (b["weights"], b["grads"], b["optimizer"]) == (2 * N, 2 * N, 12 * N)   # bf16, bf16, fp32 x 3
    assert (f["base_weights"], f["grads"], f["master"] + f["optimizer_moments"]) == (2 * N, 2 * N, 12 * N)
    assert b["optimizer_constants"] == f["step_counters"] == 0     # MasterWeightAdamW: a Python int step


def test_full_8bit_adamw_bytes(runs, cfg):
    b, f = runs["full-8bit"]["bytes"], F.finetune_states(cfg, fr.SETUPS["full-8bit"])
    sizes = [i * o for i, o in MATS] * L + [V * D] * 2 + [D] * (2 * L + 1)
    assert b["optimizer"] == adam8(sizes) == 737_280
    assert b["optimizer_constants"] == 2 * 256 * 4                 # the two shared quantisation maps
    assert f["master"] == 0 and f["optimizer_moments"] + f["optimizer_scales"] == adam8(sizes) + 2048
    assert (b["weights"], b["grads"]) == (f["base_weights"], f["grads"]) == (2 * N, 2 * N)


def test_lora_bytes(runs, cfg):
    b, f = runs["lora"]["bytes"], F.finetune_states(cfg, fr.SETUPS["lora"])
    hand = {"weights": 2 * N, "adapters": 4 * N_LORA, "grads": 4 * N_LORA, "optimizer": 8 * N_LORA,
            "optimizer_constants": 4 * LORA_TENSORS}               # torch AdamW: a 4-byte step per tensor
    assert {k: b[k] for k in hand} == hand
    assert (f["base_weights"], f["adapter_weights"], f["grads"], f["optimizer_moments"], f["step_counters"]) \
        == (2 * N, 4 * N_LORA, 4 * N_LORA, 8 * N_LORA, 4 * LORA_TENSORS)


def test_qlora_bytes_by_hand(runs):
    q_sizes = [i * o for i, o in MATS] * L
    for name in ("qlora", "qlora-8bit"):
        b = runs[name]["bytes"]
        assert b["weights"] == 2 * N_REST + sum(nf4(n) for n in q_sizes) == 284_496
        # per quantised tensor: 16-value fp32 NF4 code, fp32 offset, 256-value fp32 nested code
        assert b["quant_constants"] == len(q_sizes) * (16 * 4 + 4 + 256 * 4)
        assert (b["adapters"], b["grads"]) == (4 * N_LORA, 4 * N_LORA)
    a_sizes = [n for i, o in MATS for n in (R * i, o * R)] * L
    assert runs["qlora"]["bytes"]["optimizer"] == 8 * N_LORA                # paged 32-bit: two fp32 states
    assert runs["qlora-8bit"]["bytes"]["optimizer"] == adam8(a_sizes)       # A at 4,096: 8-bit; k/v B: fp32
    assert runs["qlora"]["bytes"]["optimizer_constants"] == 0               # bitsandbytes' step: a Python int


def test_qlora_formula_agrees_on_packed_weights_adapters_and_8bit_states(runs, cfg):
    f8 = F.finetune_states(cfg, fr.SETUPS["qlora-8bit"])
    b8 = runs["qlora-8bit"]["bytes"]
    q_sizes = [i * o for i, o in MATS] * L
    assert f8["base_weights"] == 2 * N_REST + sum(n // 2 for n in q_sizes)
    assert (f8["adapter_weights"], f8["grads"]) == (b8["adapters"], b8["grads"])
    assert f8["optimizer_moments"] + f8["optimizer_scales"] == b8["optimizer"] + b8["optimizer_constants"]


@pytest.mark.xfail(reason="formula counts bitsandbytes' nested 256-value code once (shared); 0.50.2 "
                          "keeps one per quantised tensor (13 x 1 KiB more here)", strict=False)
def test_qlora_formula_constants_equal_measured(runs, cfg):
    f, b = F.finetune_states(cfg, fr.SETUPS["qlora-8bit"]), runs["qlora-8bit"]["bytes"]
    assert f["base_weights"] + f["quant_constants"] == b["weights"] + b["quant_constants"]


def test_losses_track_full_finetuning(runs):
    """Step 0 is the same model (LoRA's B starts at 0; QLoRA's base differs by NF4's rounding); 8-bit
    moments follow fp32 ones to 0.01 (measured 2e-4); QLoRA follows LoRA to 0.02 (measured 0.004:
    the NF4 base's error); every loss falls every step; a rank-32 update fits the batch more
    slowly than a full one, but at least a fifth as fast (measured a third)."""
    full, full8, lora, q, q8 = (runs[n]["losses"] for n in ("full", "full-8bit", "lora", "qlora", "qlora-8bit"))
    assert lora[0] == full[0] == full8[0]
    assert abs(q[0] - full[0]) < 0.02
    assert max(abs(a - b) for a, b in zip(full, full8)) < 0.01
    assert max(abs(a - b) for a, b in zip(lora, q)) < 0.02 and max(abs(a - b) for a, b in zip(q, q8)) < 0.02
    for losses in (full, full8, lora, q, q8):
        assert all(b < a for a, b in zip(losses, losses[1:]))
    assert 0.2 * (full[0] - full[-1]) < lora[0] - lora[-1] < full[0] - full[-1]
