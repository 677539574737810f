"""Chapter 01, section 9 ("Your model"): Qwen2.5-72B and Mixtral-8x7B beside Llama-3-70B.

Every figure the section states is derived here by hand from the models' published dimensions
(their config.json files on the Hugging Face Hub: Qwen/Qwen2.5-72B, mistralai/Mixtral-8x7B-v0.1,
meta-llama/Meta-Llama-3-70B), checked against the published parameter counts (Qwen2.5-72B's model
card: 72.7 B; Mistral's "Mixtral of experts" announcement, 2023-12-11: 46.7 B total, 12.9 B per
token) and set against what the section prints. The activation counts are written out tensor by
tensor (a Llama layer as in tests/test_01_chapter.py; a Mixtral layer from transformers'
``MixtralTopKRouter`` and ``grouped_mm`` path, as in tests/test_hf_moe.py), never read back from
the code that prints them.
"""

import json
import re
from pathlib import Path

import pytest

from conftest import cell_output
from gpumem.chapters.ch01_memory_anatomy import your_model

NB01 = Path(__file__).resolve().parents[1] / "notebooks" / "01_memory_anatomy.ipynb"
S = 4096                  # tokens per GPU (seq 4,096 x micro-batch 1)
GB = 1e9

# published dimensions: hidden h, layers L, query heads a, kv width k (kv heads x 128), MLP F, vocab V
LLAMA = dict(h=8192, L=80, a=64, k=1024, F=28672, V=128256)
QWEN = dict(h=8192, L=80, a=64, k=1024, F=29568, V=152064)
MIX = dict(h=4096, L=32, a=32, k=1024, F=14336, V=32000, E=8, top=2)


def params(m, bias=False, active=False):
    """Embedding + untied head, per layer q/o (h x h), k/v (h x k), biases on q/k/v, the MLP (or
    experts and a router), two RMSNorm weights; the final norm."""
    h, k, F = m["h"], m["k"], m["F"]
    attn = 2 * h * h + 2 * h * k + (h + 2 * k if bias else 0)
    if "E" in m:
        mlp = (m["top"] if active else m["E"]) * 3 * h * F + h * m["E"]
    else:
        mlp = 3 * h * F
    return 2 * m["V"] * h + m["L"] * (attn + mlp + 2 * h) + h


def dense_layer_acts(m):
    """A Llama layer with flash attention, bf16: 6 tensors h wide, k and v, four F-wide SwiGLU
    tensors, the fp32 logsumexp per head and row, two fp32 1/rms per token."""
    h, k, F, a = m["h"], m["k"], m["F"], m["a"]
    return 2 * S * (6 * h + 2 * k + 4 * F) + 4 * a * S + 8 * S


def mixtral_layer_acts(m):
    """The same attention half, then the router and top-2 experts (grouped_mm), T = S tokens,
    R = 2 S dispatched rows."""
    h, k, F, a, E, top = m["h"], m["k"], m["F"], m["a"], m["E"], m["top"]
    R = S * top
    attention = 2 * S * (5 * h + 2 * k) + 4 * a * S + 8 * S     # without the MLP input
    router = 4 * S * E + 8 * S * top + 4 * S + 4 * S * top        # softmax, indices, sum + weights
    dispatch = 2 * S * h + 2 * R * h + 16 * R + 4 * E             # MLP input, rows, sort/index, offsets
    experts = 2 * R * (2 * F) + 2 * R * F + 2 * R * F             # gate|up, silu, product
    combine = 2 * R * h + 4 * R + 8 * R                           # down output, weights, inverse
    return attention + router + dispatch + experts + combine


def logits(m):
    return 10 * S * m["V"]            # bf16 logits, fp32 copy, fp32 log-softmax


def test_parameter_counts_match_the_published_ones():
    llama, qwen = params(LLAMA), params(QWEN, bias=True)
    mix, mix_active = params(MIX), params(MIX, active=True)
    assert round(qwen / 1e9, 1) == 72.7                            # Qwen2.5-72B model card
    assert (round(mix / 1e9, 1), round(mix_active / 1e9, 1)) == (46.7, 12.9)   # Mistral's post
    assert round(llama / 1e9, 2) == 70.55
    table = your_model.counts_table()
    rows = {line.split()[0]: line for line in table.splitlines()[1:4]}
    for name, total, active in (("llama-3-70b", llama, llama), ("qwen2.5-72b", qwen, qwen),
                                ("mixtral-8x7b", mix, mix_active)):
        assert f"{total / 1e9:.2f} B   {active / 1e9:.2f} B" in rows[name], rows[name]
    assert round(mix / mix_active, 1) == 3.6                       # "3.6 times too small"


def test_vocabulary_share():
    """Untied: embedding and head are two V x h matrices."""
    rows = {line.split()[0]: line for line in your_model.counts_table().splitlines()[1:4]}
    for name, m, total in (("llama-3-70b", LLAMA, params(LLAMA)), ("qwen2.5-72b", QWEN, params(QWEN, True)),
                           ("mixtral-8x7b", MIX, params(MIX))):
        emb = 2 * m["V"] * m["h"]
        assert f"{emb / 1e9:.2f} B {emb / total:5.1%}" in rows[name], rows[name]
    assert 2 * 152_064 * 8_192 == 2_491_416_576                     # "2.49 B parameters"


def per_gpu(n_params, layer, m):
    """8 GPUs, ZeRO-3, mixed: 2 + 2 + 12 bytes per parameter over 8; one sequence's activations
    (layers and logits; the few tensors outside the layers, under 0.14 GB, left to the caller)."""
    return dict(weights=2 * n_params / 8, grads=2 * n_params / 8, optimizer=12 * n_params / 8,
                layer=layer, loss=logits(m), acts=m["L"] * layer + logits(m))


def test_per_gpu_table_by_hand():
    lines = your_model.counts_table().splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[6:9]}
    for name, n, layer, m in (("llama-3-70b", params(LLAMA), dense_layer_acts(LLAMA), LLAMA),
                              ("qwen2.5-72b", params(QWEN, True), dense_layer_acts(QWEN), QWEN),
                              ("mixtral-8x7b", params(MIX), mixtral_layer_acts(MIX), MIX)):
        g = per_gpu(n, layer, m)
        weights, grads, opt, act_layer, at_loss, acts, total = map(float, rows[name])
        assert (weights, grads, opt) == tuple(round(g[x] / GB, 1) for x in ("weights", "grads", "optimizer"))
        assert (act_layer, at_loss) == (round(layer / GB, 2), round(logits(m) / GB, 2))
        assert 0 < acts - g["acts"] / GB < 0.2                     # + the few tensors outside the layers
    assert round(dense_layer_acts(LLAMA) / 1e6) == 1360            # section 3's 1,360 MB
    # Qwen's layer saves 8 s (F_qwen - F_llama) bytes more: the wider MLP; its biases save nothing
    assert dense_layer_acts(QWEN) - dense_layer_acts(LLAMA) == 8 * S * (29568 - 28672)


def test_the_leads_figures_by_hand():
    """+7.6 GB for Qwen2.5-72B (about three-quarters the wider MLP), -119.1 GB for Mixtral; the
    router's 0.25 MB; 1.29 against 1.36 GB a layer; 10,240 bias parameters a layer (not printed: lab 01 asks for the bias terms)."""
    dN_mlp = 80 * 3 * 8192 * (29568 - 28672)
    dN_vocab = 2 * 8192 * (152064 - 128256)
    dN_bias = 80 * (8192 + 2 * 1024)
    assert params(QWEN, True) - params(LLAMA) == dN_mlp + dN_vocab + dN_bias
    mlp = 2 * dN_mlp + 80 * 8 * S * (29568 - 28672)                # states (16 B / 8) + activations
    vocab = 2 * dN_vocab + 10 * S * (152064 - 128256)
    qwen_more = mlp + vocab + 2 * dN_bias
    assert round(qwen_more / GB, 1) == 7.6 and 0.7 < mlp / qwen_more < 0.8
    llama = per_gpu(params(LLAMA), dense_layer_acts(LLAMA), LLAMA)
    mix = per_gpu(params(MIX), mixtral_layer_acts(MIX), MIX)
    less = sum(llama[x] - mix[x] for x in ("weights", "grads", "optimizer", "acts"))
    assert abs(less / GB - 119.1) < 0.1                            # outside-layer tensors: 0.07 GB apart
    out = your_model.counts_table()
    assert "qwen2.5-72b +7.6 GB" in out and "mixtral-8x7b -119.1 GB" in out
    assert round((4 * S * 8 + 8 * S * 2 + 4 * S + 4 * S * 2) / 1e6, 2) == 0.25
    assert (round(mixtral_layer_acts(MIX) / GB, 2), round(dense_layer_acts(LLAMA) / GB, 2)) == (1.29, 1.36)
    assert 8192 + 2 * 1024 == 10_240


def _section_9():
    cells = json.loads(NB01.read_text())["cells"]
    start = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## 9 · Your model"))
    end = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## Explore"))
    return cells[start:end]


def test_section_9_stored_outputs():
    """The counts table as stored is the function's; the trace table shows formula = trace and the
    traced bf16 weights equal 2 bytes x the 2-layer models counted by hand."""
    code = [c for c in _section_9() if c["cell_type"] == "code"]
    assert len(code) == 2 and all("nbval-check-output" in c["metadata"].get("tags", []) for c in code)
    assert cell_output(code[0]).rstrip("\n") == your_model.counts_table()
    rows = [line for line in cell_output(code[1]).splitlines() if re.match(r"(llama|qwen|mixtral)", line)]
    assert len(rows) == 3
    for line, (m, bias) in zip(rows, ((LLAMA, False), (QWEN, True), (MIX, False))):
        assert line.count("equal") == 2, line
        weights = int(line.split()[-2].replace(",", ""))
        assert weights == 2 * params(m | {"L": 2}, bias=bias), line
    text = "\n".join("".join(c["source"]) for c in _section_9() if c["cell_type"] == "markdown")
    assert "--config path/to/config.json" in text and "--layers 2" in text


@pytest.mark.parametrize("name", your_model.MODELS)
def test_counts_fit_100_columns(name):
    assert max(map(len, your_model.counts_table(names=(name,)).splitlines())) <= 100
