"""ZeRO-3's working set is one fact with one function (``accounting.zero3_gathered``): a registry
model and its Hugging Face config file get the same figure from ``estimate``.

Expected values are counted by hand from the model dimensions (Meta's Llama 3 configs) and from
DeepSpeed 0.19.8's defaults as its source states them (``deepspeed/runtime/zero/config.py``):

* ``stage3_prefetch_bucket_size`` 5e7 (line 222), ``stage3_max_live_parameters`` 1e9 (245),
  ``stage3_max_reuse_distance`` 1e9 (251), ``stage3_param_persistence_threshold`` 1e5 (228),
  ``reduce_bucket_size`` 5e8 (its ``DeepSpeedZeroConfig`` default);

and from the prefetch rule of ``partitioned_param_coordinator.py`` (``fetch_sub_module``,
lines 452-472): at every module fetch (containers and norms too) the coordinator walks the
recorded order and gathers whole parameters while fewer than
``min(max_live - n_available, prefetch_bucket)`` elements are queued. So the prefetch front runs
ahead of use, and the last parameter it starts may be of any size: once fewer than max_live
elements are whole, the next one in the order is gathered whole, however large.
"""

import json

import pytest

from gpumem import cli
from gpumem.memory import accounting, hf_config, models
from gpumem.memory.estimate import estimate

PREFETCH, MAX_LIVE, REDUCE = 50_000_000, 1_000_000_000, 500_000_000   # DeepSpeed's defaults (above)
BF16 = 2

# Meta-Llama-3-8B's config.json on the Hub (meta-llama/Meta-Llama-3-8B): the fields estimate reads
LLAMA3_8B_CONFIG = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                    "vocab_size": 128256, "hidden_act": "silu", "rms_norm_eps": 1e-05,
                    "rope_theta": 500000.0, "tie_word_embeddings": False, "attention_bias": False}


def _dims(d, kv, f, vocab):
    layer = 2 * d * d + 2 * d * kv + 3 * d * f      # wq, wo; wk, wv; gate, up, down
    return layer, vocab * d                          # one layer's matrices; the embedding (= the head)


def _hand_70b() -> tuple[int, int]:
    """70B, backward at layer 1's wv: layer 1's wq, wk, wv (prefetched, used next), all of layer 0
    (the front runs about a layer ahead), and then the embedding: whole before it, layer 0 and
    layer 1's three matrices (940 M) are under max_live (1e9), so the walk starts the next
    parameter in the order, the embedding's backward use, 1.05 B elements at once."""
    d, kv, f, vocab = 8192, 1024, 28672, 128256
    layer, embed = _dims(d, kv, f, vocab)
    before = layer + (d * d + 2 * d * kv)
    assert before < MAX_LIVE and min(MAX_LIVE - before, PREFETCH) > 0   # the walk may start one more
    return BF16 * (before + embed), embed


def _hand_8b() -> tuple[int, int]:
    """8B, forward at layer 27's up: in forward the front runs ahead until max_live holds it back:
    layer 27's up and down and layers 28-31 whole (990 M, under 1e9), so the walk starts the next
    parameter in the order after the final norm (persistent: 4,096 <= 1e5), the head, 525 M."""
    d, kv, f, vocab = 4096, 1024, 14336, 128256
    layer, head = _dims(d, kv, f, vocab)
    before = 2 * d * f + 4 * layer
    assert before < MAX_LIVE and min(MAX_LIVE - before, PREFETCH) > 0
    return BF16 * (before + head), head


@pytest.fixture(scope="module")
def config_8b(tmp_path_factory):
    path = tmp_path_factory.mktemp("Meta-Llama-3-8B") / "config.json"
    path.write_text(json.dumps(LLAMA3_8B_CONFIG))
    return str(path)


def _pair(name: str, config_8b: str):
    return models.get(name), hf_config.load("meta-llama-3-70b" if name == "llama-3-70b" else config_8b)


@pytest.mark.parametrize("name, hand", [("llama-3-70b", _hand_70b), ("llama-3-8b", _hand_8b)])
def test_registry_and_config_give_deepspeeds_figure(name, hand, config_8b):
    registry, config = _pair(name, config_8b)
    params, largest = hand()
    expected = params + BF16 * largest + BF16 * REDUCE     # + the largest module's gradient, reduce bucket
    for cfg in (registry, config):
        g = accounting.zero3_gathered(cfg, "mixed")
        assert g.steady and (g.params, g.grad, g.reduce) == (params, BF16 * largest, BF16 * REDUCE)
        assert g == expected
        assert estimate(model=cfg, gpus=8, zero=3).as_dict()["per_gpu"]["gathered"] == expected
    # DeepSpeed's rule bounds it: under max_live whole, plus the one parameter the walk may start
    assert 2 * (largest + PREFETCH) < params <= BF16 * (MAX_LIVE + largest)


@pytest.mark.parametrize("name", ["llama-3-70b", "llama-3-8b"])
def test_every_part_agrees_between_the_two_paths(name, config_8b):
    """Model states, activations, the working set and its parts: the same bytes for the same model
    (default fused RMSNorm; with ``--norm hf`` the config is counted as transformers' own code)."""
    registry, config = _pair(name, config_8b)
    for kw in ({"zero": 3}, {"zero": 3, "checkpoint": "full", "recipe": "fp32"}, {"zero": 1}):
        a, b = (estimate(model=c, gpus=8, **kw).as_dict() for c in (registry, config))
        assert a["per_gpu"] == b["per_gpu"] and a.get("gathered_parts") == b.get("gathered_parts")
        assert a["roles"] == b["roles"]


def test_the_command_line_agrees(capsys):
    out = []
    for args in (["--model", "llama-3-70b"], ["--config", "meta-llama-3-70b"]):
        assert cli.main(["estimate", *args, "--gpus", "8", "--zero", "3", "--json"]) == 0
        out.append(json.loads(capsys.readouterr().out))
    assert out[0]["per_gpu"] == out[1]["per_gpu"]
    assert out[0]["per_gpu"]["gathered"] == _hand_70b()[0] + BF16 * _hand_70b()[1] + BF16 * REDUCE


def test_a_layout_the_replay_does_not_build_is_the_on_demand_floor_and_says_so():
    """Qwen3's q/k norms are modules of their own in DeepSpeed's fetch order: not replayed; the
    largest module (the 151,936 x 4,096 embedding) and the prefetch bucket, labelled a floor."""
    cfg = hf_config.load("qwen3-8b")
    est = estimate(model=cfg, gpus=8, zero=3)
    g, embed = est.gathered, 151_936 * 4_096
    assert not g.steady and (g.params, g.prefetch, g.grad) == (BF16 * embed, BF16 * PREFETCH, BF16 * embed)
    assert any("on-demand" in n and "floor" in n for n in est.states.notes)


def test_quoted_defaults_are_deepspeeds():
    config = pytest.importorskip("deepspeed.runtime.zero.config")
    z = config.DeepSpeedZeroConfig(stage=3)
    assert (z.prefetch_bucket_size, z.max_live_parameters, z.reduce_bucket_size) == (PREFETCH, MAX_LIVE, REDUCE)
    assert z.max_reuse_distance == 1e9 and z.param_persistence_threshold == 1e5
