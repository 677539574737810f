"""Chapter 08: Answer.AI's fsdp_qlora measurement beside the prediction, checked by hand.

Figures from github.com/AnswerDotAI/fsdp_qlora benchmarks_03_2024.md (commit e877dda): Llama-2-70B
QLoRA, CPU offload, 2 x RTX 3090, batch 2 per GPU, 2,048 tokens, 1,024 samples: 11,795 s.
"""

import pytest

from gpumem.chapters.ch08_finetuning import published, scale


def _llama2_70b_params() -> int:
    h, kv, f, v, L = 8192, 1024, 28672, 32000, 80
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h     # q, o; k, v; gate, up, down; 2 norms
    return 2 * v * h + L * block + h                         # embedding, head (untied), final norm


def _adapters_r64() -> int:
    h, kv, f = 8192, 1024, 28672
    per_layer = 64 * ((h + h) * 2 + (h + kv) * 2 + (h + f) * 3)   # q, o; k, v; gate, up, down
    return 80 * per_layer


def test_llama2_70b_config_matches_the_hand_count():
    assert published.LLAMA2_70B.n_params() == _llama2_70b_params()   # 68,976,648,192


def test_step_and_implied_utilisation_by_hand():
    s = published.implied_utilisation()
    assert s["steps"] == 1024 // (2 * 2) == 256
    assert s["seconds"] == pytest.approx(11_795 / 256)
    assert s["tokens"] == 2 * 2048
    # frozen base: forward 2NT + input gradients 2NT + checkpointed re-run 2NT; adapters 6 n_a T
    flops = 6 * _llama2_70b_params() * 4096 + 6 * _adapters_r64() * 4096
    assert s["flops"] == flops
    assert s["utilisation"] == pytest.approx(flops / (11_795 / 256 * 71e12))
    assert 0.50 < s["utilisation"] < 0.55                       # the reviewer's "about 52 %"
    assert s["predicted_compute"] == pytest.approx(flops / (0.4 * 71e12))


def test_3090_step_is_given_overlapped_and_serial():
    r = scale.rtx3090("llama-3-70b")
    busy = r["compute_s"] + r["dequant_s"]
    assert r["step_serial"] == pytest.approx(r["fsdp_pcie_s"] + busy)
    assert r["step_overlapped"] == pytest.approx(max(r["fsdp_pcie_s"], busy))
    assert r["step_overlapped"] < r["step_serial"]
    a = published.scenario_at_measured()
    assert a["overlapped"] < r["step_overlapped"]                  # a higher share, a shorter step
