"""Models from Hugging Face config files (issue 22, first part): parameter counts against published
figures and against transformers' own modules, the Llama registry unchanged, and bad files refused.

Independent derivations: the published counts (model cards, papers' tables: sources in
``hf_config.SHIPPED``), Gemma 2's paper Table 2 (embedding and non-embedding counts, exact), and the
parameters transformers builds from the same config on the meta device (no bytes allocated).
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpumem import cli
from gpumem.memory import activations, hf_config, models
from gpumem.memory.estimate import estimate, n_param_tensors

ROOT = Path(__file__).resolve().parents[1]


def _printed_as(counted: float, published: float) -> bool:
    """Does ``counted`` print as ``published`` at the publisher's digits, rounded or truncated?
    (Qwen's cards truncate: Qwen3-30B-A3B's 3.353B active is printed 3.3B.)"""
    text = repr(published)
    unit = 10 ** -(len(text.split(".")[1]) if "." in text else 0)
    return published - unit / 2 - 1e-12 <= counted < published + unit


@pytest.mark.parametrize("name", [n for n in hf_config.SHIPPED if n != "gpt3-175b"])
def test_counted_parameters_print_as_the_published_figure(name):
    cfg = hf_config.load(name)
    total, active, _ = hf_config.SHIPPED[name]
    assert _printed_as(cfg.n_params() / 1e9, total)
    if active is not None:
        assert _printed_as(cfg.n_params(active=True) / 1e9, active)
        assert cfg.n_params(active=True) < cfg.n_params()


def test_gpt3_is_the_papers_shape_and_its_175b_is_rounded_up():
    """Brown et al. Table 2.1 prints 175.0B; its own dimensions give 174.6B (0.23 % less; the paper
    does not say what else it counted). The Megatron papers' formula 12 L h^2 (1 + 13/(12h) +
    (V + s)/(12 L h)) gives the same 174.6B, less the final LayerNorm's 2h it leaves out."""
    cfg = hf_config.load("gpt3-175b")
    L, h, V, s = 96, 12288, 50257, 2048
    megatron = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    assert cfg.n_params() == round(megatron) + 2 * h
    assert 0.997 < cfg.n_params() / 175.0e9 < 0.998


def test_gemma2_embedding_split_matches_the_papers_table_2():
    cfg = hf_config.load("gemma-2-9b")
    assert cfg.embedding_params() == 917_504_000                      # tied: counted once
    assert cfg.n_params() - cfg.embedding_params() == 8_324_201_984


def test_hand_counts():
    """Per-layer counts by hand from the modelling code's modules."""
    q = hf_config.load("qwen2.5-72b")          # q/k/v carry a bias, o does not
    assert q.attention_params() == 2 * 8192 * 8192 + 2 * 8192 * 1024 + (8192 + 2 * 1024)
    g = hf_config.load("gpt2")                 # c_attn, c_proj, c_fc, c_proj with biases, 2 LayerNorms
    assert g.layer_params() == (768 * 2304 + 2304) + (768 * 768 + 768) + (768 * 3072 + 3072) \
        + (3072 * 768 + 768) + 2 * 2 * 768
    m = hf_config.load("qwen3-30b-a3b")        # 128 experts of width 768, a router, q/k norms
    assert m.mlp_params() == 128 * 3 * 2048 * 768 + 2048 * 128
    assert m.mlp_params(active=True) == 8 * 3 * 2048 * 768 + 2048 * 128
    assert m.attention_params() == 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128


def test_the_llama_config_is_the_registrys_llama_byte_for_byte():
    hf, ours = hf_config.load("meta-llama-3-70b"), models.get("llama-3-70b")
    assert (hf.n_params(), hf.layer_params(), hf.head_dim, hf.kv_dim, n_param_tensors(hf)) == \
        (ours.n_params(), ours.layer_params(), ours.head_dim, ours.kv_dim, n_param_tensors(ours))
    for kernel in ("flash", "naive"):
        a = activations.activations(hf, 4096, 1, kernel)
        b = activations.activations(ours, 4096, 1, kernel)
        assert (a.peak, a.parts) == (b.peak, b.parts)
    e_hf, e_ours = estimate(model=hf, gpus=8, zero=1), estimate(model="llama-3-70b", gpus=8, zero=1)
    assert e_hf.total == e_ours.total


def test_parameters_equal_what_transformers_builds():
    """Every shipped config at two layers, built by transformers on the meta device: the parameter
    count and the number of parameter tensors (AdamW's step counters) equal ours."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name in hf_config.SHIPPED:
        raw = json.loads((hf_config.CONFIG_DIR / f"{name}.json").read_text())
        raw["n_layer" if raw["model_type"] == "gpt2" else "num_hidden_layers"] = 2
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**raw))
        params = list(model.parameters())       # a tied head is the embedding: listed once
        cfg = replace(hf_config.load(name), n_layers=2)
        assert (sum(p.numel() for p in params), len(params)) == (cfg.n_params(), n_param_tensors(cfg)), name


def test_defaults_are_transformers_defaults():
    """What a config may omit is read as transformers' config classes read it."""
    transformers = pytest.importorskip("transformers")
    for mt, kind in hf_config.KINDS.items():
        defaults = transformers.AutoConfig.for_model(mt)
        assert bool(defaults.tie_word_embeddings) == kind.tied, mt
        for key, value in kind.defaults.items():
            if key == "n_inner" or key not in defaults.to_dict():
                continue
            assert getattr(defaults, key) == value, (mt, key)


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": 8190}, "num_attention_heads 64 does not divide hidden_size 8190"),
    ({"num_key_value_heads": 7}, "num_key_value_heads 7 does not divide num_attention_heads 64"),
    ({"hidden_act": "tanh"}, "hidden_act 'tanh' is not supported"),
    ({"model_type": "falcon"}, "model_type 'falcon' is not supported; accepted: llama,"),
    ({"vocab_size": None}, "missing field 'vocab_size'"),
    ({"num_hidden_layers": -2}, "'num_hidden_layers' must be a positive integer"),
])
def test_bad_fields_exit_2_naming_the_field(tmp_path, capsys, change, message):
    raw = json.loads((hf_config.CONFIG_DIR / "meta-llama-3-70b.json").read_text()) | change
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert cli.main(["estimate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_bad_paths_exit_2(tmp_path, capsys):
    (tmp_path / "notjson.json").write_text("{hidden_size: 1")
    for path, message in ((tmp_path / "none.json", "no such file"), (tmp_path / "notjson.json", "not JSON")):
        assert cli.main(["estimate", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_estimate_config_is_fast_and_imports_neither_torch_nor_transformers():
    # CPU seconds of the answering process (import included): wall time on a loaded 2-core CI
    # machine measures the other processes too
    code = ("import sys, time; t = time.process_time(); from gpumem import cli\n"
            "rc = cli.main(['estimate', '--model', 'qwen2.5-72b', '--gpus', '8', '--zero', '3', '--json'])\n"
            "print(rc, time.process_time() - t, 'torch' in sys.modules, 'transformers' in sys.modules,"
            " file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    rc, seconds, torch_loaded, tf_loaded = proc.stderr.split()
    assert (rc, torch_loaded, tf_loaded) == ("0", "False", "False") and float(seconds) < 0.5
    out = json.loads(proc.stdout)
    assert out["n_params"] == hf_config.load("qwen2.5-72b").n_params() and out["activations_counted"]
