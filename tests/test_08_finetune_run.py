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


def test_qlora_bytes_by_hand(runs, cfg):
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
    # the formula's paged-adamw counts the same: fp32 states, no step tensors
    f = F.finetune_states(cfg, fr.SETUPS["qlora"])
    assert runs["qlora"]["optimizer_class"] == "PagedAdamW32bit"
    assert (f["optimizer_moments"], f["step_counters"], f["optimizer_scales"]) == (8 * N_LORA, 0, 0)


def test_qlora_formula_agrees_on_packed_weights_adapters_and_8bit_states(runs, cfg):
    f8 = F.finetune_states(cfg, fr.SETUPS["qlora-8bit"])
    b8 = runs["qlora-8bit"]["bytes"]
    q_sizes = [i * o for i, o in MATS] * L
    assert f8["base_weights"] == 2 * N_REST + sum(n // 2 for n in q_sizes)
    assert (f8["adapter_weights"], f8["grads"]) == (b8["adapters"], b8["grads"])
    assert f8["optimizer_moments"] + f8["optimizer_scales"] == b8["optimizer"] + b8["optimizer_constants"]


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


# --- part 3: what a LoRA / QLoRA step saves, traced (gpumem.memory.lora_trace) ---------------------
SMALL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "hidden_act": "silu",
         "max_position_embeddings": 64, "tie_word_embeddings": False}
h, q, f, r, T = 64, 64, 160, 8, 48      # SMALL by hand; rank 8; 48 tokens (no weight has a 48-long side)


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("ft", [F.Finetune(adapter="lora", lora_rank=r),
                                F.Finetune(adapter="lora", lora_rank=r, lora_targets=("q", "v"), autocast=False)],
                         ids=["all-seven-autocast", "q-v-fp32"])
def test_lora_formula_equals_trace_on_reduced_depths(ft, layers):
    """The formula counts what autograd saves; the trace's peak (in transformers' loss code) also
    holds the final norm's output, the frozen head's input, which nothing saves but
    ``outputs.last_hidden_state`` keeps alive: 2 T h bytes the formula may leave out."""
    from gpumem.memory import lora_trace as lt
    tr = lt.trace_ft(SMALL, ft, T, 1, layers=layers)
    formula = finetune_activations(raw_config(SMALL, layers)[1], ft, T, 1, "flash", "none", "hf", "hf")["peak"]
    assert tr.peaks["activations"] - formula in (0, 2 * T * h)


def test_lora_saves_by_role():
    """A frozen base projection saves nothing (its weight is a parameter); each adapter saves its
    own bf16 copy of its input (autocast's cast of peft's fp32 cast) and A's output (T x r); with
    lora_dropout > 0 the CPU's dropout keeps an fp32 noise tensor per adapter input (peft drops out
    its fp32 copy; CUDA's fused kernel would keep a 1-byte mask)."""
    from gpumem.memory import lora_trace as lt
    rows, ops = lt.saved_by_role(SMALL, F.Finetune(adapter="lora", lora_rank=r), T, 1, layers=2, dropout=0.1)
    assert lt.by_role(rows)["base"] == 0 and ops == []
    widths = {"q": h, "k": h, "v": h, "o": q, "gate": h, "up": h, "down": f}
    for name, width in widths.items():
        block = "mlp" if name in ("gate", "up", "down") else "self_attn"
        got = {(row[1], row[2], row[3]) for row in rows if f"layers.1.{block}.{name}_proj." in row[0]}
        assert ("lora_A", (T, width), "bfloat16") in got            # the input copy, 2 bytes
        assert ("lora_B", (T, r), "bfloat16") in got                # A's output
        assert ("dropout", (1, T, width), "float32") in got         # the noise tensor
    # layer 0's q, k, v read the frozen embedding's output: no gradient, so their dropout records nothing
    assert lt.by_role(rows)["dropout"] == 4 * T * (2 * sum(widths.values()) - 3 * h)


def test_qlora_recomputes_the_dequantised_weight_and_saves_what_lora_saves():
    """bitsandbytes' MatMul4Bit keeps only the packed weight: no saved tensor has a weight's shape;
    backward dequantises again for every base matmul whose input needs a gradient (all but layer
    0's q, k, v: the frozen embedding's output needs none). On a CPU the adapters' inputs are
    copied as with a bf16 base, so the saved bytes equal LoRA's."""
    from gpumem.memory import lora_trace as lt
    lora = F.Finetune(adapter="lora", lora_rank=r)
    rows_q, ops = lt.saved_by_role(SMALL, F.Finetune(adapter="lora", lora_rank=r, base_dtype="nf4"), T, 1, layers=2)
    rows_l, _ = lt.saved_by_role(SMALL, lora, T, 1, layers=2)
    assert lt.by_role(rows_q) == lt.by_role(rows_l)
    weights = {(o, i) for i, o in [(h, q), (h, 32), (q, h), (h, f), (f, h)]}
    assert not any(row[2] in weights for row in rows_q)
    fwd = [o for o in ops if o[0] == "forward" and o[1] == "gemm_4bit"]
    bwd = [o for o in ops if o[0] == "backward" and o[1] == "dequantize_4bit"]
    assert len(fwd) == 7 * 2 and len(bwd) == 7 * 2 - 3
    assert all(o[3] == "bfloat16" and o[2] in weights for o in bwd)


def test_prepare_model_for_kbit_training_makes_qlora_save_more_than_lora():
    """The QLoRA recipe's peft.prepare_model_for_kbit_training upcasts the embedding, norms and head
    to fp32; a norm's fp32 weight times its bf16 output is fp32, so the hidden states after every
    norm, and what is computed from them outside the projections, are saved in fp32: the adapters'
    own saves do not change, the rest of the model saves more than with a bf16 base (LoRA)."""
    from gpumem.memory import lora_trace as lt
    qlora = F.Finetune(adapter="lora", lora_rank=r, base_dtype="nf4")
    plain = lt.by_role(lt.saved_by_role(SMALL, F.Finetune(adapter="lora", lora_rank=r), T, 1, layers=2)[0])
    prepared = lt.by_role(lt.saved_by_role(SMALL, qlora, T, 1, layers=2, prepare=True)[0])
    assert (prepared["lora_A"], prepared["lora_B"], prepared["base"]) == (plain["lora_A"], plain["lora_B"], 0)
    assert prepared["rest"] > 1.3 * plain["rest"]


def test_cli_trace_lora_json_and_mistakes_before_torch(tmp_path, capsys):
    import json
    import subprocess
    import sys

    from gpumem import cli
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL))
    assert cli.main(["trace", "--config", str(path), "--seq", str(T), "--adapter", "lora", "--lora-rank", str(r),
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saved_by_role"]["base"] == 0 and out["finetune"]["lora_rank"] == r
    assert out["peaks"]["activations"] - out["formula_activations"] in (0, 2 * T * h)
    cases = [["trace", "--config", str(path), "--base-dtype", "nf4"],
             ["trace", "--config", str(path), "--adapter", "lora", "--lora-rank", "0"],
             ["trace", "--config", str(path), "--adapter", "lora", "--lora-targets", "q,wq"],
             ["trace", "--config", "meta-llama-3-70b", "--lora-rank", "8"]]
    code = ("import sys; from gpumem import cli\n"
            f"for argv in {cases!r}:\n"
            "    print(cli.main(argv), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split("\n")[:-1] == ["2 False"] * len(cases), proc
