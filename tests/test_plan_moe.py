"""Issue 22: the planner plans a mixture of experts, with expert parallelism (``ep``) as a lever.

Hand counts from Mixtral-8x7B's published dimensions (Jiang et al. 2024, arXiv 2401.04088, Table 1;
HF config.json: hidden 4096, 32 layers, 32 heads, 8 key/value heads, expert width 14336, 8
experts, top 2, vocabulary 32000, untied head), DeepSpeed's expert-data-parallel sharding
(``runtime/zero/stage_1_and_2.py``, ``_configure_moe_settings``) and the NVLink figure of
``timing.collectives`` (370 GB/s achieved of 450, nccl-tests issue #212)."""

import contextlib
import io
import re
import subprocess
import sys
import pytest

from conftest import ROOT
from gpumem import cli
from gpumem.errors import UsageError
from gpumem.memory import hf_config, models, moe_acts
from gpumem.planner import cost, evaluate, hybrid, moe, plan
from gpumem.planner.layout import Layout
from gpumem.timing import moe_time
from gpumem.timing.hardware import NODES, Group

MIX = hf_config.load("mixtral-8x7b")

# Mixtral-8x7B by hand
H, F, L, E, V = 4096, 14336, 32, 8, 32000
EXPERTS = L * E * 3 * H * F                                   # 45,097,156,608
REST = L * (2 * H * H + 2 * H * 1024 + H * E + 2 * H) + 2 * V * H + H   # attention, router, norms; embeddings


def lay(zero: int, ep: int, dp: int = 8, offload: str = "none") -> Layout:
    return Layout("mixed", zero, "none", "flash", offload, "cpu", 1, 1, 1, dp, 1024 // dp, ep=ep)


def test_hand_counts_match_the_config():
    assert EXPERTS == 45_097_156_608 and REST == 1_605_636_096
    assert moe.expert_params(MIX) == EXPERTS and MIX.n_params() == EXPERTS + REST


def test_expert_states_per_gpu_by_hand():
    """ZeRO-2, dp 8, ep 4: each GPU holds 2 of the 8 experts (X / 4) in bf16; gradients and fp32
    optimizer states are sharded over the 2 ranks holding the same experts (X / 8), the rest over 8."""
    s = moe.model_states(MIX, MIX.n_params(), lay(2, 4))
    assert s.params == 2 * (REST + EXPERTS // 4) == 25_759_850_496
    assert s.grads == 2 * (REST // 8 + EXPERTS // 8) == 11_675_698_176
    assert s.optimizer == 12 * (REST // 8 + EXPERTS // 8) == 70_054_189_056


def test_ep_shrinks_only_the_replicated_states():
    """What ZeRO shards (optimizer states) ends at N / dp per GPU whatever ep; ep = 1 is the
    dense formula on the whole model (the split into two parts changes no byte here)."""
    one = moe.model_states(MIX, MIX.n_params(), lay(1, 1))
    dense = hybrid.model_states(MIX.n_params(), lay(1, 1))
    assert (one.params, one.grads, one.optimizer) == (dense.params, dense.grads, dense.optimizer)
    eight = moe.model_states(MIX, MIX.n_params(), lay(1, 8))
    assert eight.optimizer == one.optimizer
    assert one.params - eight.params == 2 * EXPERTS * 7 // 8


def test_all_to_all_of_one_layer_by_hand():
    """4,096 tokens x top-2 x 4,096 x 2 bytes = 64 MiB sent buffer; 7/8 of it leaves the rank over
    NVLink at 370 GB/s, plus NCCL's p2p latency (8.4 + 3.4 us); 4 calls a layer (dispatch, combine,
    forward and backward)."""
    group = Group(NODES["dgx-h100"], 8, 1)
    a = moe_time.step(group, moe.a2a_rows(MIX, 4096), H, 2, moe_layers=1, micro_batches=1)
    assert a.nbytes == 4096 * 2 * 4096 * 2 == 67_108_864
    assert a.moved == 67_108_864 * 7 / 8
    assert a.calls == 4
    assert a.one_s == pytest.approx(67_108_864 * 7 / 8 / 370e9 + 11.8e-6, rel=1e-9)
    assert moe_time.step(Group(NODES["dgx-h100"], 1, 1), 8192, H, 2, 1, 1).seconds == 0.0


def test_all_to_all_crosses_the_network_when_ep_spans_nodes():
    one_node = moe_time.step(Group(NODES["dgx-h100"], 8, 1), 8192, H, 2, 1, 1)
    two_nodes = moe_time.step(Group(NODES["dgx-h100"], 8, 2), 8192, H, 2, 1, 1)
    assert one_node.binding == "NVLink" and two_nodes.binding == "network"
    assert two_nodes.one_s > 3 * one_node.one_s


def test_local_experts_get_the_same_rows_whatever_ep():
    """Balanced: 4,096 tokens x top-2 = 8,192 rows a GPU at every ep; at capacity factor 1.25 each
    of the 8 experts' slots holds ceil(1.25 x 8,192 / 8) = 1,280 rows from each sender: 10,240."""
    assert {moe_acts.local_rows(MIX, 4096, ep) for ep in (1, 2, 4, 8)} == {8192}
    assert moe_acts.local_rows(MIX, 4096, 8, moe_acts.Routing(capacity_factor=1.25)) == 10_240
    assert moe.a2a_rows(MIX, 4096) == 8192 and moe.CAPACITY_FACTOR == 1.0


def test_compute_counts_active_parameters():
    """The stand-in's MLP FLOPs are top-2 experts' (6 x active x tokens for the matmuls)."""
    f = moe.flops_model(MIX)
    assert f.ffn == 2 * F and not f.moe
    active_matmuls = L * (2 * H * H + 2 * H * 1024 + 2 * 3 * H * F)   # what a token multiplies, layers only
    assert f.n_layers * (f.layer_params() - 2 * H) == active_matmuls
    assert moe.flops_model(models.get("llama-3-8b")) is models.get("llama-3-8b")


def test_plan_picks_expert_parallelism_for_mixtral_on_8_h100():
    r = plan(MIX, 8, "h100-80gb", seq=4096)
    best = r.best
    assert best.layout.ep > 1, best.layout.label()
    assert best.time["expert_parallel"] > 0 and best.deepspeed["expert_parallel"]["autoep_size"] == best.layout.ep
    no_ep = plan(MIX, 8, "h100-80gb", seq=4096, ep=(1,))
    assert no_ep.best.time["total"] > best.time["total"]
    assert any("mixture of experts" in a for a in r.assumptions)


def _run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    return out.getvalue()


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "llama-3-8b", "--gpus", "8", "--json"],
    ["plan", "--model", "qwen2.5-72b", "--gpus", "16", "--top", "4"],
    ["plan", "--model", "mistral-7b-v0.1", "--gpus", "8", "--layout", "tp=2,pp=1,dp=4,zero=1", "--json"],
])
def test_dense_plans_unchanged_byte_for_byte(argv, monkeypatch):
    """A dense model's output with the MoE hooks as shipped equals the output with every hook
    replaced by what the planner did before ep existed (no ep degree, the model's own FLOPs, one
    data-parallel part, no extra keys or lines). Checked once by hand as well against the commit
    before this change (aff9bb1): 14 outputs of 7 dense models identical."""
    shipped = _run(argv)
    monkeypatch.setattr(moe, "degrees", lambda *a, **k: [1])
    monkeypatch.setattr(moe, "flops_model", lambda cfg: cfg)
    monkeypatch.setattr(moe, "split_params", lambda cfg, psi, lay: [(psi, lay.shards)])
    monkeypatch.setattr(moe, "assumptions", lambda cfg: [])
    monkeypatch.setattr(moe, "deepspeed_keys", lambda cfg, lay: {})
    monkeypatch.setattr(moe, "fsdp_keys", lambda lay: {})
    cost._flops.cache_clear()
    assert _run(argv) == shipped
    assert '"ep"' not in shipped and "expert_parallel" not in shipped


def plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpumem", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_mixtral_plan_prints_ep_and_its_all_to_all():
    proc = plan_cli("--model", "mixtral-8x7b", "--gpus", "8", "--top", "3")
    assert proc.returncode == 0, proc.stderr
    assert " ep8 " in proc.stdout.splitlines()[2] or " ep4 " in proc.stdout.splitlines()[2]
    assert "time expert_parallel" in proc.stdout and '"autoep_size"' in proc.stdout


@pytest.mark.parametrize("layout, says", [
    ("tp=1,pp=1,dp=8,zero=1,ep=3", "must divide the 8 experts"),
    ("tp=1,pp=1,dp=8,zero=3,ep=8", "ZeRO 0-2"),
    ("tp=2,pp=1,dp=4,zero=1,ep=2", "tp=1, pp=1, cp=1"),
])
def test_bad_ep_exits_2_in_one_line(layout, says):
    proc = plan_cli("--model", "mixtral-8x7b", "--gpus", "8", "--top", "1", "--layout", layout)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr, proc.stderr


def test_ep_on_a_dense_model_is_refused():
    with pytest.raises(UsageError, match="llama-3-8b is dense"):
        evaluate("llama-3-8b", 8, "tp=1,pp=1,dp=8,zero=1,ep=2", zero=(1,), checkpoints=("full",),
                 micro_batches=(1,))


def test_qwen3_moe_is_planned_with_ep_searched():
    """Qwen3-30B-A3B (128 experts, top-8) at ZeRO 1-2 without offload on 80 GB: the optimizer
    states alone are 12 x 30.5 B / 8 = 45.7 GB a GPU; the bf16 weights add 61 GB at ep 1 and
    2 x (1.5 + 29.0 / 2) = 32 GB at ep 2 (with ZeRO-2's 7.6 GB of gradients: 85 GB), so only
    ep 4 and 8 fit."""
    cfg = hf_config.load("qwen3-30b-a3b")
    r = plan(cfg, 8, "h100-80gb", seq=4096, tp=(1,), pp=(1,), zero=(1, 2), offloads=(("none", "cpu"),))
    assert {p.layout.ep for p in r.plans} == {4, 8}


def test_chapter_cells_fit_100_columns():
    from gpumem.chapters.ch06_combining_strategies import moe_cells
    a, b = moe_cells.compare()
    text = moe_cells.table(a, b) + "\n" + moe_cells.all_to_all_lines()
    assert max(len(line) for line in text.splitlines()) <= 100
    lines = text.splitlines()
    assert re.search(r" ep[248] ", lines[1]) and not re.search(r" ep\d", lines[2])
