"""Transformers' own models traced on fake tensors (issue 22, part 3) against the activation formula.

The references are independent of the formula: the trace of ``AutoModelForCausalLM`` built from each
config (``gpumem.memory.hf_trace``), the same step on real tensors for the fake-tensor settings, and
hand counts (bytes per element written out) for the terms where Hugging Face's code saves other
tensors than the course's Llama.
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpumem import cli
from gpumem.memory import activations, hf_compare, hf_config, tracer

pytest.importorskip("transformers")
from gpumem.memory import hf_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
S = 4096
SMALL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "hidden_act": "silu",
         "max_position_embeddings": 64, "tie_word_embeddings": False}

GPT2_SMALL = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
              "vocab_size": 256, "activation_function": "gelu_new"}


def formula(cfg, seq=S, batch=1):
    return activations.activations(cfg, seq, batch, "flash", "none", "mixed", "hf", impl="hf").peak


@pytest.fixture(scope="module")
def llama2():
    """Llama-3-70B at two layers, seq 4096: the trace and its config."""
    return hf_trace.trace_hf("meta-llama-3-70b", S, layers=2), hf_trace.raw_config("meta-llama-3-70b", 2)[1]


@pytest.mark.parametrize("raw", [SMALL, SMALL | {"model_type": "mistral", "sliding_window": 16},
                                 SMALL | {"model_type": "qwen3", "head_dim": 32}, GPT2_SMALL],
                         ids=["llama", "mistral-window", "qwen3-head_dim", "gpt2"])
def test_fake_tensors_save_what_real_tensors_save(raw):
    """Real tensors answer transformers' packed-sequence question from the position ids; the fake
    trace answers it the same way (not packed), so every category's peak agrees to the byte."""
    for batch in (1, 2):
        fake = hf_trace.trace_hf(raw, 32, batch)
        real = hf_trace.trace_hf(raw, 32, batch, fake=False)
        assert fake.peaks == real.peaks
        assert formula(hf_trace.raw_config(raw)[1], 32, batch) == real.peaks["activations"]


@pytest.mark.parametrize("name", ["mistral-7b-v0.1", "qwen2.5-72b", "qwen3-8b"])
def test_formula_equals_the_trace_at_two_layers(name):
    tr = hf_trace.trace_hf(name, S, layers=2)
    cfg = hf_trace.raw_config(name, 2)[1]
    assert abs(tr.peaks["activations"] / formula(cfg) - 1) < 0.01
    assert tr.peaks["params"] == 2 * cfg.n_params()                # bf16 weights, counted exactly
    assert tr.peaks["optimizer"] == 12 * cfg.n_params()            # fp32 master, m and v


def test_llama_70b_formula_equals_the_trace_and_states_are_exact(llama2):
    tr, cfg = llama2
    assert abs(tr.peaks["activations"] / formula(cfg) - 1) < 0.01
    assert (tr.peaks["params"], tr.peaks["optimizer"]) == (2 * cfg.n_params(), 12 * cfg.n_params())


def test_eager_attention_llama_70b():
    tr = hf_trace.trace_hf("meta-llama-3-70b", 1024, attention="eager", layers=2)
    cfg = hf_trace.raw_config("meta-llama-3-70b", 2)[1]
    assert abs(tr.peaks["activations"] / hf_trace.formula_activations(cfg, 1024, 1, "eager") - 1) < 0.01


@pytest.mark.parametrize("name, seq", [("qwen3-8b", S), ("mistral-7b-v0.1", S), ("gpt2", 1024)])
def test_full_depth(name, seq):
    tr = hf_trace.trace_hf(name, seq)
    assert abs(tr.peaks["activations"] / formula(hf_config.load(name), seq) - 1) < 0.01


def test_the_differing_terms_by_hand():
    """Hugging Face's code against the course's Llama with its norm (``norm="hf"``), term by term."""
    T = S
    q3 = replace(hf_config.load("qwen3-8b"), explicit_head_dim=256)          # a*head_dim = 8192 != d
    terms = activations.layer_parts(q3, S, 1, "flash", 2, norm="hf", impl="hf")
    # q: 32 heads x 256, rows of 256: fp32 copy + bf16 normed copy (6 bytes) + fp32 1/rms per row
    assert terms["q norm per head (fp32 input, normed copy, 1/rms)"] == 6 * T * 8192 + 4 * T * 32
    assert terms["k norm per head (fp32 input, normed copy, 1/rms)"] == 6 * T * 8 * 256 + 4 * T * 8
    assert terms["q, k, v"] == 2 * T * (8192 + 2 * 8 * 256)
    assert terms["output = W_o input"] == 2 * T * 8192
    mistral = hf_config.load("mistral-7b-v0.1")                                # window 4096 <= seq
    terms = activations.layer_parts(mistral, S, 1, "flash", 2, norm="hf", impl="hf")
    assert terms["window mask, SDPA's bf16 copy"] == 2 * S * S
    assert terms["q, k and v expanded to all heads"] == 3 * 2 * T * 4096
    assert "q, k, v" in activations.layer_parts(mistral, S - 1, 1, "flash", 2, norm="hf", impl="hf")
    gpt2 = hf_config.load("gpt2")    # LayerNorm: input + bf16 mean and 1/std per row (CPU); gelu_new
    terms = activations.layer_parts(gpt2, 1024, 1, "flash", 2, norm="hf", impl="hf")
    assert terms["attn norm (input, mean, 1/std)"] == 2 * 1024 * 768 + 2 * 2 * 1024
    assert terms["gelu_new: 4 saved, the output"] == 5 * 2 * 1024 * 3072
    assert activations.outside_terms(gpt2, 1024, 2, 2)["position ids, token ids (int64)"][0] == 8 * (1024 + 2048)
    loss = activations.loss_terms(mistral, S, 2, 2, "hf")
    assert loss["labels padded by one (int64)"][0] == 8 * 2 * (S + 1)
    assert loss["labels shifted, a copy (int64)"][0] == 8 * 2 * S


def test_difference_table_against_both_traces(llama2):
    """The table's Hugging Face column sums to the HF trace, its course column to the course's own
    Llama traced with its default (fused) norm; the table fits 100 columns."""
    tr, cfg = llama2
    rows = hf_compare.difference_rows(cfg, S)
    step = lambda i: sum(r[i] * (cfg.n_layers if r[0] == "layer" else 1) for r in rows)  # noqa: E731
    assert step(3) == tr.peaks["activations"]
    course = tracer.trace_step(replace(hf_config.load("meta-llama-3-70b"), n_layers=2), seq=S)
    assert step(2) == course.peaks["activations"]
    diff = {r[1]: r[3] - r[2] for r in rows if r[3] != r[2]}
    assert diff == {"attn norm": 4 * S * 8192, "mlp norm": 4 * S * 8192, "final norm": 4 * S * 8192,
                    "labels (int64)": 8 * (S + 1)}
    text = hf_compare.difference_table(hf_config.load("meta-llama-3-70b"), S)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "135,801.65 MB" in text            # 80 layers: the full-depth trace's 135,801,651,216 B


def test_saved_tensors_list_the_norm_copies():
    rows = hf_trace.saved_tensors("meta-llama-3-70b", 256, layers=1)
    norm = [r for r in rows if r[0] == "model.layers.0.input_layernorm"]
    assert sorted((r[2], r[3]) for r in norm) == [("bfloat16", 2 * 256 * 8192), ("float32", 4 * 256),
                                                  ("float32", 4 * 256 * 8192)]
    assert not [r for r in rows if r[1][-2:] == (256, 256)]              # no (s, s) mask saved


def test_cli_trace_config(capsys):
    assert cli.main(["trace", "--model", "qwen2.5-72b", "--layers", "1", "--seq", "512", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["attention_impl"] == "sdpa" and out["layers"] == 1
    assert out["peaks"]["activations"] == out["formula_activations"]


def test_cli_trace_config_mistakes_before_torch(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(SMALL | {"num_key_value_heads": 3}))
    cases = [["trace", "--config", str(tmp_path / "nope.json")], ["trace", "--config", str(bad)],
             ["trace", "--model", "mixtral-8x7b", "--attention", "eager"],
             ["trace", "--model", "qwen3-8b", "--checkpoint", "full"],
             ["trace", "--model", "qwen3-8b", "--attention", "naive"],
             ["trace", "--model", "llama-3-8b", "--layers", "2"], ["trace", "--model", "gpt2"]]
    code = ("import sys; from gpumem import cli\n"
            f"for argv in {cases!r}:\n"
            "    print(cli.main(argv), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.split("\n")[:-1] == ["2 False"] * len(cases), proc
    assert proc.stderr.count("gpumem: error: ") == len(cases)


def test_estimate_counts_qwen3_activations():
    from gpumem.memory.estimate import estimate
    est = estimate(model=hf_config.load("qwen3-8b"), norm="hf")
    assert est.acts is not None and est.acts.peak == formula(hf_config.load("qwen3-8b"))
