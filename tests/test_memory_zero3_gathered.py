"""ZeRO-3's working set (``accounting.zero3_gathered``) and its place in ``estimate``.

Expected values: the largest module counted by hand from Meta's config (128,256 x h), the steady
step's fullest moment counted by hand from the modules whole then, the prefetch and reduce buckets
from DeepSpeed 0.19.8's own config defaults, and DeepSpeed's estimator, run for real, for its
4 x largest-layer term. The per-GPU timeline that places these parts is in test_memory_timeline.py.
"""

import math
import pickle

import pytest

from gpumem.errors import UsageError
from gpumem.memory import accounting, models
from gpumem.memory.estimate import estimate


def test_parts_by_hand():
    """70B: in a steady step the fullest moment is backward in layer 1's attention (wv), with the
    embedding, all of layer 0 and layer 1's wq, wk, wv whole (prefetched for what comes next)."""
    cfg = models.get("llama-3-70b")
    d, kv, f = 8_192, 1_024, 28_672
    embedding = 128_256 * d
    layer = 2 * d * d + 2 * d * kv + 3 * d * f
    whole = embedding + layer + (d * d + 2 * d * kv)
    g = accounting.zero3_gathered(cfg, "mixed")
    assert (g.params, g.grad, g.reduce, g.prefetch) == (2 * whole, 2 * embedding, 2 * 500_000_000, 0)
    assert g.steady and g == 2 * whole + 2 * embedding + 10**9 and isinstance(g, int)
    assert sum(g.parts.values()) == g and len(g.parts) == 3
    assert round(g / 1e9, 1) == 7.1   # issue 17: 4.3 (on demand, no bucket) and 6.1 (no bucket) before


def test_reduce_bucket_is_deepspeeds_and_capped_at_the_model():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    bucket = DeepSpeedZeroConfig(stage=3).reduce_bucket_size
    assert accounting.zero3_gathered(models.get("llama-3-8b"), "fp32").reduce == 4 * bucket
    tiny = models.get("tiny")
    assert accounting.zero3_gathered(tiny, "mixed").reduce == 2 * tiny.n_params()


def test_tensor_parallel_slice_and_stage():
    cfg = models.get("llama-3-70b")
    full, tp8 = accounting.zero3_gathered(cfg, "mixed"), accounting.zero3_gathered(cfg, "mixed", tp=8)
    assert tp8.grad == full.grad // 8 and tp8.params < full.params
    stage = accounting.zero3_gathered(cfg, "mixed", layers=10)
    assert stage.grad == full.grad and stage.params <= full.params


def test_signature_the_gather_trace_uses():
    """Chapter 02 compares a measured DeepSpeed gather trace with exactly this call."""
    g = accounting.zero3_gathered(1_000, "fp32", prefetch_bucket=300, reduce_bucket=0)
    assert g == 4 * 1_000 + 4 * 1_000 + 4 * 300 and not g.steady
    assert accounting.zero3_gathered(1_000, "pure-bf16", prefetch_bucket=0, reduce_bucket=0) == 4_000
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
    g = accounting.zero3_gathered(cfg.largest_layer_params(), "mixed", prefetch_bucket=0, reduce_bucket=0)
    assert g == largest_layer_memory == 4 * cfg.vocab * cfg.d_model
    assert g.params + g.grad == largest_layer_memory   # the on-demand moment of step 0


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
    assert d["gathered"] == int(accounting.zero3_gathered(cfg, "mixed"))
    assert d["total"] == d["params"] + d["grads"] + d["optimizer"] + d["activations"] + d["gathered"]


def test_at_8b_on_64_gpus_it_outweighs_the_sharded_states():
    """8B's embedding is 525 M elements (1.05 GB in bf16, gathered, and as much again for its
    gradient), the reduce bucket 1 GB; 16 B x 8.03 B / 64 is 2.0 GB of sharded states."""
    d = estimate(model="llama-3-8b", gpus=64, zero=3).as_dict()["per_gpu"]
    sharded = 16 * math.ceil(models.get("llama-3-8b").n_params() / 64)
    assert d["gathered"] > 2 * sharded > 0


def test_params_only_needs_the_largest_layer():
    est = estimate(params=70_000_000_000, gpus=8, zero=3)
    assert est.as_dict()["per_gpu"]["gathered"] == 0 and "--largest-layer" in est.as_dict()["notes"][0]
    est = estimate(params=70_000_000_000, gpus=8, zero=3, largest_layer=1_000_000_000)
    assert est.as_dict()["per_gpu"]["gathered"] == 4 * 10**9 + 10**8 + 10**9   # + reduce bucket
