"""``plan --layout``: one given layout priced, checked for fit and ranked among the search's plans
(issue 19 item 3), and the placement the planner prices its collectives on.

The oracle for ranks is the search itself (a layout the search found must land where the search
put it); bytes and tokens per second are re-derived by hand; group placements are derived from
the rank order Megatron and DeepSpeed use (tensor fastest, then data, then pipeline)."""

import json

import pytest

from gpumem import cli, planner
from gpumem.errors import UsageError
from gpumem.memory import models
from gpumem.planner import placement
from gpumem.timing.hardware import NODES

CFG70 = models.get("llama-3-70b")


@pytest.fixture(scope="module")
def search70():
    return planner.plan("llama-3-70b", 64, seq=8192, advise=False)


def fields_of(lay) -> str:
    return (f"tp={lay.tp},pp={lay.pp},dp={lay.dp},zero={lay.zero},ckpt={lay.checkpoint},mb={lay.micro_batch},"
            f"attn={lay.attention},recipe={lay.recipe},offload={lay.offload},device={lay.device},cp={lay.cp},"
            f"vp={lay.vp}" + (f",hybrid={lay.hybrid},group={lay.group}" if lay.hybrid != "none" else ""))


def test_the_top_plan_and_a_later_one_land_where_the_search_put_them(search70):
    picks = {0, 36, len(search70.plans) - 1}
    picks |= {next(i for i, p in enumerate(search70.plans) if p.layout.cp > 1),     # a context-parallel plan
              next(i for i, p in enumerate(search70.plans) if p.layout.vp > 1)}     # and an interleaved one
    for index in sorted(picks):
        p = search70.plans[index]
        r = planner.evaluate("llama-3-70b", 64, fields_of(p.layout), seq=8192, result=search70)
        assert r.fits and r.rank == index + 1 and r.fitting == len(search70.plans)
        assert r.plan.time == p.time and r.plan.memory == p.memory and r.plan.layout == p.layout


def test_a_layout_that_does_not_fit_says_by_how_much(search70):
    """tp 8 x dp 8 with ZeRO-1 and no pipeline: 4 B of weights and gradients per local parameter
    plus 12 B of optimizer state over 8 replicas, before activations: over 50 GB (by hand)."""
    r = planner.evaluate("llama-3-70b", 64, "tp=8,pp=1,dp=8,zero=1", seq=8192, result=search70)
    psi = CFG70.n_params() / 8
    states = r.plan.memory["params"] + r.plan.memory["grads"] + r.plan.memory["optimizer"]
    assert states == pytest.approx(4 * psi + 12 * psi / 8, rel=0.01)
    assert not r.fits and r.rank is None and r.plan.memory["total"] > search70.question["usable"]
    assert r.why_not and "GB per GPU" in r.why_not[0]


def test_json_layout_result_contract(capsys):
    """``--json`` keeps the plan's keys and adds ``layout_result`` with fits, rank, memory, time
    and tokens_per_s = global batch x seq / step seconds (by hand)."""
    code = cli.main(["plan", "--model", "llama-3-70b", "--gpus", "64", "--seq", "8192", "--json",
                     "--layout", "tp=4,pp=8,dp=2,zero=1,ckpt=none,mb=1"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and {"question", "plans", "considered", "fitting"} <= set(out)
    lr = out["layout_result"]
    assert {"fits", "rank", "memory", "time", "tokens_per_s"} <= set(lr)
    assert lr["fits"] is True and 1 <= lr["rank"] <= out["fitting"]
    assert lr["layout"]["tp"] == 4 and lr["layout"]["pp"] == 8 and lr["layout"]["dp"] == 2
    assert lr["layout"]["n_micro"] == out["question"]["global_batch"] // (2 * 1)    # dp x mb x accumulation
    assert lr["tokens_per_s"] == pytest.approx(out["question"]["global_batch"] * 8192 / lr["time"]["total"])
    assert lr["memory"]["total"] <= out["question"]["usable"]


@pytest.mark.parametrize("layout, says", [
    ("tp=8,pp=16,dp=64,zero=1", "must be equal"),             # 8,192 GPUs asked of 64
    ("tp=8,pp=1,dp=8,zero=1,vp=2", "the interleaved schedule needs pp > 1"),
    ("tp=8,pp=8,dp=1,zero=1,vp=3", "a multiple of pp x vp = 24"),   # 80 layers
    ("tp=8,pp=4,dp=1,zero=3,cp=2", "accepted: zero=0|1, offload=none"),
    ("tp=8,pp=2,dp=1,zero=1,cp=4,attn=naive", "ring attention needs a flash kernel"),
    ("tp=8,pp=2,dp=4,zero=1,engine=megatron-core,offload=optimizer", "do not offload"),
    ("tp=8,pp=8,dp=1,zero=1,cp=2", "must be equal"),             # tp x cp x pp x dp = 128
    ("tp=8,pp=8,dp=1,zero=2", "accepted: zero=0 or 1"),
    ("tp=8,pp=8,dp=1,zero=1,foo=2", "accepted: tp, pp, dp, zero"),
    ("tp=8,pp=8,dp=1,zero=1,ckpt=most", "accepted: none, full"),
    ("tp=8,pp=8,dp=1", "required: tp, pp, dp, zero"),
    ("tp=8,pp=8,dp=1,zero=1,mb=3", "dp x mb x accumulation"),  # 1,024 sequences / 3
    ("tp=8,pp=8,dp=1,zero=1,mb=0", "positive integer"),
    ("tp=8,tp=8,pp=8,dp=1,zero=1", "given twice"),
    ("tp", "not key=value"),
])
def test_bad_layouts_exit_2_with_one_line(capsys, layout, says):
    code = cli.main(["plan", "--model", "llama-3-70b", "--gpus", "64", "--layout", layout])
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1, err


def test_library_refuses_what_the_command_line_refuses():
    with pytest.raises(UsageError, match="the interleaved schedule needs pp > 1"):
        planner.evaluate("llama-3-70b", 32, "tp=8,pp=1,dp=4,zero=1,vp=4")
    assert planner.parse_layout("tp=8,pp=2,dp=4,zero=1,vp=4,cp=2")["vp"] == 4           # parsed, checked later
    assert planner.parse_layout("TP=2, pp=1 ,dp=4,zero=3")["ckpt"] == "none"   # defaults filled in


def test_groups_sit_where_the_rank_order_puts_them():
    """Global rank = tp_rank + tp x (dp_rank + dp x pp_rank), 8 GPUs a node: a DP group of tp 8 is
    one rank on each of 8 nodes (one NIC each); of tp 1 it is 8 ranks on each of 8 nodes; tp 4 x pp 4
    x dp 4 puts DP ranks 0, 4, 8, 12 two to a node on 2 nodes, and its 16-stage-span pipeline
    crosses nodes."""
    node = placement.node_for(NODES["dgx-h100"].gpu)
    shape = {k: (g.ranks_per_node, g.nodes) for k, g in placement.groups(node, 8, 1, 8).items()}
    assert shape == {"tp": (8, 1), "cp": (1, 1), "dp": (1, 8), "pp": (1, 1)}
    # Megatron's tp-cp-dp-pp order: tp 4 x cp 2 fill a node; the gradient group (dp x cp = 4 x 2)
    # strides by tp: ranks 0, 4, 8, ..., 28 are two per node on 4 nodes; cp's pair shares a node
    g = placement.groups(node, 4, 1, 4, cp=2)
    assert (g["cp"].ranks_per_node, g["cp"].nodes) == (2, 1) and (g["dp"].ranks_per_node, g["dp"].nodes) == (2, 4)
    assert (placement.groups(node, 1, 1, 64)["dp"].ranks_per_node, placement.groups(node, 1, 1, 64)["dp"].nodes) == (8, 8)
    g = placement.groups(node, 4, 4, 4)
    assert (g["tp"].ranks_per_node, g["tp"].nodes) == (4, 1) and (g["dp"].ranks_per_node, g["dp"].nodes) == (2, 2)
    assert (g["pp"].ranks_per_node, g["pp"].nodes) == (1, 2)
    assert node.nics_for(1) == 1 and node.nics_for(8) == 8    # DGX H100: one NIC beside each GPU
    slow = placement.node_for(NODES["dgx-h100"].gpu, 8, 1.25e9)
    assert placement.per_gpu_network(slow) == 1.25e9 and slow.nics == 8


def test_a_strided_data_parallel_ring_crosses_one_nic_a_node():
    """The same all-gather over dp 8: strided (tp 8, one rank a node) it is bound by the one NIC
    beside each rank; inside one node (tp 1, dp 8) by NVLink."""
    node = placement.node_for(NODES["dgx-h100"].gpu)
    strided = placement.groups(node, 8, 1, 8)["dp"]
    assert placement.binding("all_gather", 1e9, strided) == "network"
    inside = placement.groups(node, 1, 1, 8)["dp"]
    assert placement.binding("all_gather", 1e9, inside) == "NVLink"
    # 1 GB all-gather over 8 ranks: each sends 7/8 GB; one NIC at 47 of 50 GB/s (nccl-tests #290)
    assert placement.seconds("all_gather", 1e9, strided) == pytest.approx(7 / 8 * 1e9 / 47e9, rel=0.01)


def test_planner_offload_seconds_are_offload_costs_stock_schedule(monkeypatch):
    """With full overlap the planner's offload term is DeepSpeed's stock order from
    offload_time (one function for both): compute + exposed = stock_schedule, at ZeRO-3 with 8
    micro-batches (the gradient trip's per-micro-batch copies counted once each, not 8 x 6 B)."""
    from gpumem.memory import accounting
    from gpumem.memory.gpus import get
    from gpumem.planner import cost
    from gpumem.timing import offload_time
    monkeypatch.setattr(cost, "OFFLOAD_OVERLAP", 1.0)
    cfg = models.get("llama-3-70b")
    psi = cfg.n_params()
    links = offload_time.datasheet_links("h100-80gb")
    for zero, offload, device in ((3, "optimizer", "cpu"), (3, "optimizer+params", "nvme"), (2, "optimizer", "cpu")):
        lay = planner.memory.Layout("mixed", zero, "full", "flash", offload, device, 1, 1, 1, 8, 8)
        compute = 30.0
        exposed, parts = cost._offload(psi, lay, links, compute)
        stock = offload_time.step_time(psi, "mixed", zero, 8, offload, device, compute, links,
                                       micro_batches=8)["stock"]
        assert compute + exposed == pytest.approx(stock), (zero, offload, device)
    # by hand, ZeRO-3 optimizer on the CPU, 8 micro-batches: 8 x 2 + 4 = 20 B down, 8 x 2 = 16 up per shard param
    shard = accounting.shard(psi, 8)
    lay = planner.memory.Layout("mixed", 3, "full", "flash", "optimizer", "cpu", 1, 1, 1, 8, 8)
    _, parts = cost._offload(psi, lay, links, 30.0)
    assert parts["during_compute"] == pytest.approx(shard * (20 / links.d2h + 16 / links.h2d))
    assert get("h100-80gb").pcie == links.d2h


def test_context_parallel_memory_is_the_local_sequence_plus_the_ring_chunks():
    """cp = 2 at 8,192 tokens holds what cp = 1 holds at 4,096 tokens, plus TransformerEngine's
    transient K/V ring: forward keeps all cp K,V chunks and cp partial outputs of Q's size, backward
    4 chunks + one Q + one chunk (timing.context_parallel); for Llama-3-70B at tp 8, b 1, bf16 a
    K,V chunk is 2 x 4,096 x (8/8) x 128 x 2 B = 2 MiB and Q 4,096 x (64/8) x 128 x 2 B = 8 MiB."""
    cfg = models.get("llama-3-70b")
    from gpumem.planner.memory import Layout as L, per_gpu
    one = per_gpu(cfg, 4096, L("mixed", 1, "full", "flash", "none", "cpu", 1, 8, 4, 2, 8))
    two = per_gpu(cfg, 8192, L("mixed", 1, "full", "flash", "none", "cpu", 1, 8, 4, 1, 8, cp=2))
    kv, q = 2 * 4096 * 1 * 128 * 2, 4096 * 8 * 128 * 2
    assert kv == 2 * 2**20 and q == 8 * 2**20
    ring = max(2 * kv + 2 * q, 4 * kv + q + kv)                   # forward 20 MiB, backward 18 MiB
    assert two["activations"] == one["activations"] + ring
    # ZeRO-1 shards over dp x cp = 2 ranks in both layouts: the same optimizer bytes
    assert two["optimizer"] == one["optimizer"]


def test_the_interleaving_refusal_names_only_the_condition_that_fails():
    """Review r19 of lab 06: the reason listed all three conditions, two of them met (8 micro-batches
    are a multiple of pp 4); only 80 layers against pp x vp = 12 failed."""
    from gpumem.memory import models
    from gpumem.planner import rules
    cfg = models.get("llama-3-70b")
    assert rules.megatron_core(cfg, 4096, 1, "none", "flash", 4, 1, 3, 8) == \
        "the interleaved schedule needs the 80 layers a multiple of pp x vp = 12"
    assert rules.megatron_core(cfg, 4096, 1, "none", "flash", 4, 1, 2, 6) == \
        "the interleaved schedule needs micro-batches (6) a multiple of pp (4)"
    assert rules.megatron_core(cfg, 4096, 1, "none", "flash", 4, 1, 5, 8) is None          # 80 = 4 x 5 x 4
