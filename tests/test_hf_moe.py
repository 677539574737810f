"""Mixture of experts and Gemma 2 (issue 22): the activation formula (``moe_acts``, ``activations``)
against transformers' own Mixtral, Qwen3-MoE and Gemma 2 code at reduced sizes, and by hand.

The references are independent of the formula: the trace (``hf_trace.trace_hf(fake=False)``,
the chapter 01 tracer on transformers' model with its default ``grouped_mm`` experts), with the
tokens each expert got read off the routers, and hand counts written out tensor by tensor from
transformers' ``MixtralTopKRouter`` and ``grouped_mm_experts_forward`` (``integrations/moe.py``).
"""

import pytest

from gpumem import cli
from gpumem.errors import UsageError
from gpumem.memory import hf_config, moe_acts
from gpumem.memory.activations import activations
from gpumem.memory.moe_acts import Routing

pytest.importorskip("transformers")
from gpumem.memory import hf_trace  # noqa: E402

MIX = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "hidden_act": "silu",
       "max_position_embeddings": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
       "tie_word_embeddings": False}
QMOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 160,
        "moe_intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 3,
        "norm_topk_prob": True, "vocab_size": 256, "hidden_act": "silu",
        "max_position_embeddings": 64, "tie_word_embeddings": False}
CASES = [(MIX, "mixed", 32, 1), (MIX, "fp32", 24, 2), (QMOE, "mixed", 32, 1),
         (QMOE | {"norm_topk_prob": False}, "fp32", 24, 2)]
IDS = ["mixtral-bf16", "mixtral-fp32-b2", "qwen3_moe-bf16", "qwen3_moe-no-norm-fp32-b2"]


def formula(raw, seq, batch, recipe, **routing):
    cfg = hf_trace.raw_config(raw)[1]
    r = Routing(norm_topk=raw["model_type"] == "mixtral" or raw["norm_topk_prob"], **routing)
    return hf_trace.formula_activations(cfg, seq, batch, "sdpa", recipe, r)


def test_one_mixtral_layer_by_hand():
    """The small Mixtral, 32 tokens, bf16: every tensor grouped_mm's path saves, written out."""
    cfg = hf_config.from_dict(MIX)
    T, h, F, E, k, S = 32, 64, 96, 4, 2, 64
    hand = (4 * T * E            # softmax of the fp32 logits: its output
            + 8 * T * k          # top-k indices, int64
            + 4 * T + 4 * T * k  # in-place renormalisation: the sum and the fp32 weights
            + 8 * S + 8 * S      # perm (sorted weights' gather) and perm // k (rows' gather)
            + 4 * E              # int32 offsets for grouped_mm
            + 2 * S * h          # the gathered rows, grouped_mm's input
            + 2 * S * 2 * F      # gate|up output (silu and the multiply save views of it)
            + 2 * S * F          # silu(gate)
            + 2 * S * F          # silu(gate) * up, the down projection's input
            + 2 * S * h + 4 * S  # down output and the fp32 routing weights it is scaled by
            + 8 * S)             # inverse permutation (the un-sorting gather)
    assert sum(b for b, _ in moe_acts.moe_terms(cfg, T, 2).values()) == hand == 68_752


@pytest.mark.parametrize("raw,recipe,seq,batch", CASES, ids=IDS)
def test_formula_equals_transformers_on_real_tensors(raw, recipe, seq, batch):
    """Routed by the real router (not balanced: the counts differ), the trace equals the
    balanced formula to the byte: with nothing dropped or padded only S = T*k counts; and the
    formula fed the counted tokens per expert says the same. Model states exact too."""
    counts = []
    tr = hf_trace.trace_hf(raw, seq, batch, recipe=recipe, fake=False, routing_counts=counts)
    cfg = hf_trace.raw_config(raw)[1]
    assert len(counts) == 2 and all(sum(c) == seq * batch * cfg.top_k for c in counts)
    assert any(len(set(c)) > 1 for c in counts)     # the real routing is not balanced
    assert tr.peaks["activations"] == formula(raw, seq, batch, recipe)
    for c in counts:
        assert tr.peaks["activations"] == formula(raw, seq, batch, recipe, tokens_per_expert=c)
    assert tr.peaks["params"] == (4 if recipe == "fp32" else 2) * cfg.n_params()


def test_forced_balanced_routing(monkeypatch):
    """Routing forced round-robin (token t to experts t*k .. t*k+k-1 mod E: each gets T*k/E)."""
    import torch
    from transformers.models.mixtral import modeling_mixtral
    original = modeling_mixtral.MixtralTopKRouter.forward

    def balanced(self, hidden_states):
        logits, weights, _ = original(self, hidden_states)
        t = torch.arange(weights.shape[0])[:, None] * self.top_k + torch.arange(self.top_k)
        return logits, weights, t % self.num_experts

    monkeypatch.setattr(modeling_mixtral.MixtralTopKRouter, "forward", balanced)
    counts = []
    tr = hf_trace.trace_hf(MIX, 32, recipe="mixed", fake=False, routing_counts=counts)
    assert counts == [(16, 16, 16, 16)] * 2
    assert tr.peaks["activations"] == formula(MIX, 32, 1, "mixed")


def test_capacity_factor_and_counts():
    cfg = hf_config.load("mixtral-8x7b")
    T = 4096
    assert moe_acts.dispatched_rows(cfg, T) == 8192
    # c = 1.25: every one of the 8 experts' buffers holds ceil(1.25 * 8192 / 8) = 1280 rows
    assert moe_acts.dispatched_rows(cfg, T, Routing(capacity_factor=1.25)) == 8 * 1280
    with pytest.raises(UsageError, match="summing to"):
        moe_acts.dispatched_rows(cfg, T, Routing(tokens_per_expert=(1024,) * 7 + (1000,)))
    base = activations(cfg, T, 1, "flash", "none", "mixed", "hf", "hf").per_layer
    padded = activations(cfg, T, 1, "flash", "none", "mixed", "hf", "hf", Routing(capacity_factor=1.25))
    # the dispatched terms per row: 2h + 16 (gather) + 8F (experts) + 2h + 12 (combine), by hand
    assert padded.per_layer - base == 2048 * (2 * 4096 + 16 + 8 * 14336 + 2 * 4096 + 12)


def test_fake_tensors_save_what_real_tensors_save():
    """grouped_mm computes every token's k rows: no shape follows the routing, so fake tensors
    (no values) trace the same bytes as real ones, category by category."""
    for raw in (MIX, QMOE):
        assert hf_trace.trace_hf(raw, 32).peaks == hf_trace.trace_hf(raw, 32, fake=False).peaks
    with pytest.raises(UsageError, match="real tensors only"):
        hf_trace.trace_hf(MIX, 32, routing_counts=[])


def test_mixtral_sliding_window():
    """A Mixtral config with a window no wider than the sequence: transformers materialises the
    mask and SDPA gets k and v expanded, as for Mistral (MixtralConfig's default window: none)."""
    raw = MIX | {"sliding_window": 16}
    assert hf_trace.raw_config(raw)[1].sliding_window == 16
    assert hf_config.load("mixtral-8x7b").sliding_window == 0
    assert hf_trace.trace_hf(raw, 32, fake=False).peaks["activations"] == formula(raw, 32, 1, "mixed")


def test_trace_config_moe_traces_with_the_formula_beside(capsys):
    assert cli.main(["trace", "--config", "mixtral-8x7b", "--layers", "2", "--seq", "1024"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert any("trace / formula 1.0000" in line for line in lines)
    # seq 1024: S = 2048 rows; the experts' SwiGLU: 8 bytes x 2048 x F = 14336 = 234.9 MB
    assert any("S = T*k = 2,048 rows" in line for line in lines)
    assert any("234.9 MB" in line and "8SF" in line for line in lines)


def test_trace_config_moe_refuses_eager(capsys):
    assert cli.main(["trace", "--config", "qwen3-30b-a3b", "--attention", "eager"]) == 2
    assert "sdpa" in capsys.readouterr().err


# --- Gemma 2 (issue 22): eager attention only, soft-capping, four norms a layer ---------------

GEMMA = {"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 256,
         "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 24, "sliding_window": 16,
         "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
         "max_position_embeddings": 128}


def gemma_formula(raw, seq, batch, recipe="mixed"):
    return hf_trace.formula_activations(hf_trace.raw_config(raw)[1], seq, batch, "eager", recipe)


def test_gemma2_by_hand():
    """The small Gemma 2, 32 tokens, bf16, written out from transformers' modeling_gemma2.py:
    every Gemma2RMSNorm keeps an fp32 copy of its input, the 1/rms, the fp32 normed rows and the
    fp32 (1 + weight); eager attention with tanh soft-capping keeps the tanh output besides the
    fp32 softmax and its bf16 copy; the final soft-cap keeps its tanh output at the loss."""
    T, h, q, F, V, a, s = 32, 64, 4 * 24, 96, 256, 4, 32
    norm = 4 * T * h + 4 * T + 4 * T * h + 4 * h
    attention = 2 * T * h + 3 * 2 * T * q + (2 + 4 + 2) * a * s * s + 2 * T * q
    mlp = 2 * T * h + 4 * 2 * T * F
    layer = 4 * norm + attention + mlp
    outside = 2 * 2 * s * 24 + norm + 2 * T * h           # RoPE cos and sin, final norm, head input
    loss = 2 * T * V + 2 * T * V + 4 * T * V + 4 * T * V + 8 + 8 * (s + 1)   # logits, tanh, fp32
    assert gemma_formula(GEMMA, 32, 1) == 2 * layer + outside + loss          # copy, log-softmax


@pytest.mark.parametrize("vocab,seq,batch,recipe", [(256, 24, 2, "fp32"), (16, 64, 2, "mixed"),
                                                    (16, 96, 1, "fp32")])
def test_gemma2_formula_equals_the_trace(vocab, seq, batch, recipe):
    """Fake tensors (no routing here), equal to real ones; the peak is at the loss with a vocabulary
    of 256 and inside the final norm with one of 16 (masks and fp32 temporaries): both exact."""
    raw = GEMMA | {"vocab_size": vocab}
    fake = hf_trace.trace_hf(raw, seq, batch, "eager", recipe)
    real = hf_trace.trace_hf(raw, seq, batch, "eager", recipe, fake=False)
    assert fake.peaks == real.peaks
    assert fake.peaks["activations"] == gemma_formula(raw, seq, batch, recipe)
    assert fake.peak_moments["activations"].module == ("loss" if vocab == 256 else "model.norm")


def test_gemma2_9b_two_layers_at_4k():
    tr = hf_trace.trace_hf("gemma-2-9b", 4096, attention="eager", layers=2)
    cfg = hf_trace.raw_config("gemma-2-9b", 2)[1]
    assert tr.peaks["activations"] == hf_trace.formula_activations(cfg, 4096, 1, "eager")
    assert tr.peaks["params"] == 2 * cfg.n_params()


def test_gemma2_sdpa_refused():
    with pytest.raises(UsageError, match="eager attention only"):
        hf_trace.trace_hf(GEMMA, 32)


@pytest.mark.parametrize("raw, attention", [(MIX, "flash"), (QMOE, "flash"), (GEMMA, "eager")],
                         ids=["mixtral", "qwen3_moe", "gemma2"])
def test_estimate_config_counts_activations_as_traced(tmp_path, capsys, raw, attention):
    """``estimate --config`` now counts a mixture of experts' and Gemma 2's activations (they were
    "not counted"): with transformers' own norms (``--norm hf``) its figure is the trace of
    transformers' model on real tensors (flash: the sdpa kernel)."""
    import json
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert cli.main(["estimate", "--config", str(path), "--seq", "32", "--norm", "hf",
                     "--attention", attention, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    kernel = "sdpa" if attention == "flash" else "eager"
    traced = hf_trace.trace_hf(raw, 32, 1, kernel, "mixed", fake=False)
    assert est["per_gpu"]["activations"] == traced.peaks["activations"]
    assert est["per_gpu"]["params"] == traced.peaks["params"]
