"""ZeRO-3's working set (``accounting.zero3_gathered``) and its place in ``estimate``.

Expected values: the largest module counted by hand from Meta's config (128,256 x h), the
prefetch bucket from DeepSpeed 0.19.8's own config default, and DeepSpeed's estimator, run for
real, for its 4 x largest-layer term.
"""

import math
import pickle

import pytest

from gpumem.errors import UsageError
from gpumem.memory import accounting, models
from gpumem.memory.estimate import estimate


def test_parts_by_hand():
    cfg = models.get("llama-3-70b")
    embedding = 128_256 * 8_192
    g = accounting.zero3_gathered(cfg, "mixed")
    assert (g.params, g.grad, g.prefetch) == (2 * embedding, 2 * embedding, 2 * 50_000_000)
    assert g == 4 * embedding + 100_000_000 and isinstance(g, int)
    assert sum(g.parts.values()) == g and len(g.parts) == 3


def test_signature_the_gather_trace_uses():
    """Chapter 02 compares a measured DeepSpeed gather trace with exactly this call."""
    g = accounting.zero3_gathered(1_000, "fp32", prefetch_bucket=300)
    assert g == 4 * 1_000 + 4 * 1_000 + 4 * 300
    assert accounting.zero3_gathered(1_000, "pure-bf16", prefetch_bucket=0) == 4_000
    assert pickle.loads(pickle.dumps(g)).parts == g.parts


def test_default_bucket_is_deepspeeds():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    bucket = DeepSpeedZeroConfig(stage=3).prefetch_bucket_size
    assert bucket == 50_000_000
    assert accounting.zero3_gathered(10, "mixed").prefetch == 2 * bucket


@pytest.mark.parametrize("model", ["llama-3-8b", "llama-3-70b", "llama-3.1-405b"])
def test_first_two_parts_are_deepspeeds_four_bytes_per_largest_layer(model):
    """DeepSpeed's estimator budgets 4 B x the largest layer (16-bit parameters and gradients)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    cfg = models.get(model)
    _, _, largest_layer_memory = estimate_zero3_model_states_mem_needs(
        cfg.n_params(), cfg.largest_layer_params(), num_gpus_per_node=8, cpu_offload=False)
    g = accounting.zero3_gathered(cfg, "mixed", prefetch_bucket=0)
    assert g == largest_layer_memory == 4 * cfg.vocab * cfg.d_model


def test_bad_arguments():
    with pytest.raises(UsageError, match="largest module"):
        accounting.zero3_gathered(0, "mixed")
    with pytest.raises(UsageError, match="prefetch bucket"):
        accounting.zero3_gathered(10, "mixed", prefetch_bucket=-1)
    with pytest.raises(UsageError, match="unknown recipe"):
        accounting.zero3_gathered(10, "fp8")


def test_estimate_counts_it_at_stage_3_only():
    cfg = models.get("llama-3-70b")
    for zero in (0, 1, 2):
        est = estimate(model="llama-3-70b", gpus=8, zero=zero)
        assert est.as_dict()["per_gpu"]["gathered"] == 0
    d = estimate(model="llama-3-70b", gpus=8, zero=3).as_dict()["per_gpu"]
    assert d["gathered"] == 4 * cfg.vocab * cfg.d_model + 2 * 50_000_000
    assert d["total"] == d["params"] + d["grads"] + d["optimizer"] + d["activations"] + d["gathered"]


def test_at_8b_on_64_gpus_it_is_as_large_as_the_sharded_states():
    """The issue's observation: 8B's embedding is 525 M elements; 16 B x 8.03 B / 64 is 2.0 GB."""
    d = estimate(model="llama-3-8b", gpus=64, zero=3).as_dict()["per_gpu"]
    sharded = 16 * math.ceil(models.get("llama-3-8b").n_params() / 64)
    assert d["gathered"] >= sharded > 0.9 * d["gathered"]


def test_params_only_needs_the_largest_layer():
    est = estimate(params=70_000_000_000, gpus=8, zero=3)
    assert est.as_dict()["per_gpu"]["gathered"] == 0 and "--largest-layer" in est.as_dict()["notes"][0]
    est = estimate(params=70_000_000_000, gpus=8, zero=3, largest_layer=1_000_000_000)
    assert est.as_dict()["per_gpu"]["gathered"] == 4 * 10**9 + 10**8
