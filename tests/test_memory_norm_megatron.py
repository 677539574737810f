"""The norm assumption and Megatron's formula.

* ``norm="hf"``: Hugging Face's ``LlamaRMSNorm`` written out; the formula is checked against
  fake-tensor traces, the layer against a hand count (48.5 vs 40.5 s*b*h for 70B), the module
  against ``torch.nn.RMSNorm``.
* Megatron: Korthikanti et al.'s 34*sbh + 5*a*s^2*b by hand, and the reconciliation table's
  Llama column (written independently) against ``activations.layer_parts``.
"""

import itertools

import pytest
import torch

from gpumem.memory import activations, megatron, models, tracing
from gpumem.memory.llama import HFRMSNorm, RMSNorm
from gpumem.memory.policies import KERNELS, POLICIES


def test_hf_norm_computes_what_torch_rmsnorm_computes():
    torch.manual_seed(0)   # fp32: HF's norm computes in fp32 whatever its input
    x = torch.randn(2, 3, 16, requires_grad=True)
    hf, ref, fused = HFRMSNorm(16, 1e-5), torch.nn.RMSNorm(16, eps=1e-5), RMSNorm(16, 1e-5)
    with torch.no_grad():
        hf.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(hf.weight)
        fused.weight.copy_(hf.weight)
    g = torch.randn_like(x)
    outs = [torch.autograd.grad(m(x), (x, m.weight), g) for m in (hf, ref, fused)]
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_hf_norm_layer_by_hand():
    """Per norm in bf16: fused keeps x (2 B) and 1/rms; HF keeps an fp32 x (4 B), the bf16
    normalised x (2 B) and 1/rms. Two norms a layer: +8 s*b*h bytes."""
    for name, fused_sbh in [("llama-3-70b", 40.5), ("llama-3-8b", 41.0)]:
        cfg = models.get(name)
        sbh = 4096 * cfg.d_model
        fused = sum(activations.layer_parts(cfg, 4096, 1, "flash", 2).values())
        hf = sum(activations.layer_parts(cfg, 4096, 1, "flash", 2, norm="hf").values())
        assert hf - fused == 2 * 4 * sbh
        assert round(fused / sbh, 1) == fused_sbh and round(hf / sbh, 1) == fused_sbh + 8
    cfg = models.get("llama-3-70b")
    ratio = (sum(activations.layer_parts(cfg, 4096, 1, "flash", 2, norm="hf").values())
             / sum(activations.layer_parts(cfg, 4096, 1, "flash", 2).values()))
    assert 1.19 < ratio < 1.20                                           # "+20 %"


@pytest.mark.parametrize("recipe", ["mixed", "fp32"])
def test_hf_norm_formula_matches_trace(recipe):
    """Every kernel x policy on a 4-layer 8B-width model (bf16) and the tiny model (fp32): exact."""
    cfg = models.with_layers(models.get("llama-3-8b"), 4) if recipe == "mixed" else models.get("tiny")
    seq = 128 if recipe == "mixed" else 64
    for kernel, policy in itertools.product(KERNELS, POLICIES):
        traced = tracing.trace_step(cfg, recipe, kernel, policy, seq, 2, norm="hf").peaks["activations"]
        formula = activations.activations(cfg, seq, 2, kernel, policy, recipe, norm="hf").peak
        assert formula == traced, (kernel, policy, formula - traced)


def test_hf_norm_fast_trace_composes():
    cfg = models.with_layers(models.get("llama-3-8b"), 10)
    full = tracing.trace_step(cfg, "mixed", "flash", "every-2", 256, norm="hf")
    fast = tracing.trace_fast(cfg, "mixed", "flash", "every-2", 256, norm="hf")
    assert fast.method == "composed" and fast.peaks == full.peaks and fast.total_peak == full.total_peak


def test_softmax_docstring_states_the_aten_rule():
    doc = activations.softmax_moment.__doc__
    assert "fp16 input on CUDA" in doc and "CPU and on CUDA alike" in doc


def test_korthikanti_by_hand():
    cfg = models.get("llama-3-70b")
    s, b, h, a = 4096, 1, 8192, 64
    assert megatron.korthikanti_layer(cfg, s, b) == 34 * s * b * h + 5 * a * s * s * b
    rows = megatron.reconcile(cfg, s, b)
    assert sum(r.megatron for r in rows) == 34 * s * b * h + 5 * a * s * s * b
    # its three s^2 rows: softmax output 2, dropout mask 1, dropout output 2 bytes per score
    assert sum(r.megatron for r in rows if "softmax" in r.tensor) == 5 * a * s * s * b


@pytest.mark.parametrize("model, seq, batch", [("llama-3-70b", 4096, 1), ("llama-3-8b", 2048, 2),
                                               ("llama-3.1-405b", 8192, 1), ("mini", 128, 3)])
def test_reconciliation_table_adds_up_to_layer_parts(model, seq, batch):
    cfg = models.get(model)
    rows = megatron.reconcile(cfg, seq, batch)
    assert sum(r.llama for r in rows) == sum(activations.layer_parts(cfg, seq, batch, "flash", 2).values())


def test_llama_40_5_sbh_from_its_four_differences():
    """2*(6 + 2k/h + 4F/h) s*b*h: no dropout, flash, GQA (k = h/8), SwiGLU (F = 3.5h)."""
    cfg = models.get("llama-3-70b")
    sbh = 4096 * cfg.d_model
    llama = sum(r.llama for r in megatron.reconcile(cfg, 4096))
    by_hand = 2 * (6 + 2 * 1 / 8 + 4 * 3.5) * sbh
    assert abs(llama - by_hand) / sbh < 0.04          # + logsumexp and 1/rms: 0.03 s*b*h
    text = megatron.table(cfg, 4096)
    assert "194.00" in text and "40.53" in text and "no dropout" in text and "GQA" in text


def test_cli_trace_and_estimate_take_the_norm():
    import json
    from conftest import run_cli
    est = json.loads(run_cli("estimate", "--model", "llama-3-8b", "--norm", "hf", "--seq", "2k", "--json").stdout)
    cfg = models.get("llama-3-8b")
    assert est["norm"] == "hf"
    assert est["per_gpu"]["activations"] == activations.activations(cfg, 2048, norm="hf").peak
    proc = run_cli("trace", "--model", "llama-3-8b", "--norm", "hf", "--seq", "2k", "--json")
    assert proc.returncode == 0, proc.stderr
    tr = json.loads(proc.stdout)
    assert tr["norm"] == "hf" and tr["peaks"]["activations"] == est["per_gpu"]["activations"]
