"""Hybrid sharding in the planner: FSDP2's HSDP (DeepSpeed's MiCS) and ZeRO++'s hpZ.

Oracles: the bytes are counted by hand from Llama-3-70B's shapes; the seconds of one collective
are re-derived with NCCL's alpha-beta written out here (NCCL 2.30.7 tuning.cc constants, the
nccl-tests efficiencies the timing package quotes), not read from the code under test; the rules
are DeepSpeed 0.19.8's own answers (its config parser) where it has one; the emitted stage-3
keys are checked against DeepSpeed's prefetch rule applied by hand."""

import importlib
import math

import pytest

from gpumem import cli
from gpumem.errors import UsageError
from gpumem.memory import gpus as gpu_table, models
from gpumem.planner import config, cost, hybrid, placement
from gpumem.planner.memory import Layout, per_gpu, states_part

CFG = models.get("llama-3-70b")
H100 = gpu_table.get("h100-80gb")
evaluate = importlib.import_module("gpumem.planner.evaluate")   # the module; the package exports the function
SLOW = 12.5e9            # bytes/s per GPU between nodes: one 100 Gb/s NIC a GPU
M = 16                   # 1,024 sequences over dp 64 at micro-batch 1


def lay(h="none", group=0, **kw):
    base = dict(recipe="mixed", zero=3, checkpoint="full", attention="flash", offload="none", device="cpu",
                micro_batch=1, tp=1, pp=1, dp=64, n_micro=M, hybrid=h, group=group)
    return Layout(**(base | kw))


def hand_params(tp: int = 1) -> int:
    """Llama-3-70B's parameters on one tensor-parallel rank: 80 x (q, o: d^2; k, v: d x 1,024;
    gate, up, down: d x 28,672) / tp + 2 norms of d per layer, embedding and head V d / tp, final norm."""
    d, kv, f, v = 8192, 1024, 28672, 128256
    return 80 * ((2 * d * d + 2 * d * kv + 3 * d * f) // tp + 2 * d) + 2 * v * d // tp + d


def test_rules_refuse_what_the_frameworks_refuse():
    assert hybrid.allowed_hybrid(lay("hsdp", 8)) is None and hybrid.allowed_hybrid(lay("hpz", 8)) is None
    assert hybrid.allowed_hybrid(lay()) is None
    assert hybrid.allowed_hybrid(lay("hpz", 8, offload="optimizer")) is None       # secondary stays on the GPU
    assert hybrid.allowed_hybrid(lay("hsdp", 4, tp=2, dp=32)) is None                # FSDP2 mesh (rep, shard, tp)
    refused = {"accepted: zero=3": lay("hsdp", 8, zero=2),
               "accepted: 2, 4, 8, 16, 32": lay("hpz", 7),
               "hybrid=hsdp group=64": lay("hsdp", 64),                            # group = dp is plain ZeRO-3
               "without pipeline": lay("hsdp", 2, pp=2, dp=32),
               "accepted: offload=none": lay("hsdp", 8, offload="optimizer"),
               "accepted: offload=none or optimizer": lay("hpz", 8, offload="optimizer+params"),
               "accepted: tp=1": lay("hpz", 4, tp=2, dp=32),
               "accepted: mixed": lay("hsdp", 8, recipe="mixed-ds"),
               "accepted: hybrid=hsdp|hpz": lay(group=8),
               "accepted: none, hsdp, hpz": lay("mics", 8)}
    for says, bad in refused.items():
        why = hybrid.allowed_hybrid(bad)
        assert why and says in why and "\n" not in why, (says, why)


def test_deepspeed_0_19_8_refuses_mics_and_accepts_the_emitted_hpz_config():
    """DeepSpeed's own parser: ``mics_shard_size`` is a removed key (so hsdp emits no DeepSpeed
    config), while the hpz plan's emitted config parses with the partition size and stage-3 keys."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError
    hpz = config.deepspeed_config(CFG, lay("hpz", 8))
    parsed = DeepSpeedConfig(hpz).zero_config
    assert parsed.zero_hpz_partition_size == 8 and parsed.stage == 3
    assert parsed.max_live_parameters == hpz["zero_optimization"]["stage3_max_live_parameters"]
    mics = dict(hpz, zero_optimization={"stage": 3, "mics_shard_size": 8})
    with pytest.raises(DeepSpeedConfigError, match="MiCS"):
        DeepSpeedConfig(mics)
    assert config.deepspeed_config(CFG, lay("hsdp", 8)) is None


def test_configs_name_the_mesh_and_the_partition():
    f = config.fsdp_equivalent(lay("hsdp", 8))
    assert f["mesh_shape"] == [8, 8] and f["reshard_after_forward"] is True
    assert "set_requires_all_reduce" in f["gradient_accumulation"] and "(8, 8)" in f["mesh"]
    assert config.megatron_args(CFG, lay("hsdp", 8)) is None and lay("hsdp", 8).framework == "fsdp2"
    g = config.fsdp_equivalent(lay("hsdp", 4, tp=2, dp=32))
    assert g["mesh_shape"] == [8, 4] and "(8, 4, 2)" in g["mesh"]
    assert config.fsdp_equivalent(lay("hpz", 8))["reshard_after_forward"] == 8     # FSDP2's int reshard
    assert config.deepspeed_config(CFG, lay("hpz", 8))["zero_optimization"]["zero_hpz_partition_size"] == 8
    assert "zero_hpz_partition_size" not in config.deepspeed_config(CFG, lay())["zero_optimization"]


def test_model_states_by_hand():
    """mixed: 2 B weights, 2 B gradients, 12 B fp32 master + moments per parameter, ceil(n / N)
    each. ZeRO-3 and hpZ shard all three over N = 64; HSDP over its group of 8; hpZ adds the
    secondary bf16 partition over 8. The norm weights stay whole (2 B x 161 x 8,192) and the
    working set is the same for all three."""
    n = hand_params()
    assert n == 70_553_706_496
    norms = 2 * (2 * 80 + 1) * 8192
    s64, s8 = math.ceil(n / 64), math.ceil(n / 8)
    z3, hs, hp = (states_part(CFG, x) for x in (lay(), lay("hsdp", 8), lay("hpz", 8)))
    assert (z3["params"], z3["grads"], z3["optimizer"]) == (2 * s64 + norms, 2 * s64, 12 * s64)
    assert (hs["params"], hs["grads"], hs["optimizer"]) == (2 * s8 + norms, 2 * s8, 12 * s8)
    assert (hp["params"], hp["grads"], hp["optimizer"]) == (2 * s64 + 2 * s8 + norms, 2 * s64, 12 * s64)
    assert z3["gathered"] == hs["gathered"] == hp["gathered"] > 0
    # 70B: HSDP over one node's 8 GPUs holds 16 B x 70.6e9 / 8 = 141 GB of states: it cannot fit an
    # 80 GB GPU; hpZ's secondary copy costs 2 B x n / 8 = 17.6 GB over ZeRO-3 and fits
    assert per_gpu(CFG, 4096, lay("hsdp", 8))["total"] > 141e9
    assert per_gpu(CFG, 4096, lay("hpz", 8))["total"] - per_gpu(CFG, 4096, lay())["total"] == 2 * s8
    off = states_part(CFG, lay("hpz", 8, offload="optimizer"))
    assert off["params"] == 2 * s64 + 2 * s8 + norms and off["optimizer"] == 0 and off["host"] > 0


def test_emitted_stage3_keys_are_what_the_working_set_counts():
    """DeepSpeed 0.19.8 ``fetch_sub_module``: the prefetcher gathers whole parameters in recorded
    order while fewer than ``max_live - n_available`` elements are in flight, so it stops at the
    first parameter that crosses ``stage3_max_live_parameters``. Walking the order by hand from
    each counted peak's module: the parameters gathered are exactly those up to the crossing one
    (tp 8: forward layers.70.mlp.down, layers 71-79, then the head crosses; tp 1: backward
    layers.1.attn.wv/wk/wq, all of layer 0, then the embedding crosses). The working set the
    planner counts is those elements in bf16 + the largest module's gradient + the reduce bucket."""
    d, kv, f, v = 8192, 1024, 28672, 128256
    for tp, start, after, crossing in (
            (8, f * d // 8, [(2 * d * d + 2 * d * kv + 3 * d * f) // 8] * 9, v * d // 8),
            (1, d * kv, [d * kv, d * d, 2 * d * d + 2 * d * kv + 3 * d * f], v * d)):
        ds = config.deepspeed_config(CFG, lay(tp=tp, dp=64 // tp))["zero_optimization"]
        cap, bucket = ds["stage3_max_live_parameters"], ds["reduce_bucket_size"]
        held = start + sum(after)
        assert held < cap <= held + crossing                  # the crossing parameter is the last one
        gathered = held + crossing
        largest_grad = v * d // tp                            # the embedding / head, whole in backward
        st = states_part(CFG, lay(tp=tp, dp=64 // tp))
        assert st["gathered"] == 2 * (gathered + largest_grad + bucket), tp
        assert ds["stage3_max_reuse_distance"] == 10**9 and ds["stage3_prefetch_bucket_size"] == 50_000_000
    assert "1e9 emitted" not in cost.assumptions.__doc__ + "".join(
        cost.assumptions(H100, gpu_table.DEFAULT_RESERVE, 0.5, _links(), placement.node_for(H100),
                         {"host_per_node": 2e12, "nvme_per_node": 30e12}))


def _links():
    from gpumem.timing.offload_time import datasheet_links
    return datasheet_links("h100-80gb")


def dp_rows(x, inter_node=SLOW):
    node = placement.node_for(H100, 8, inter_node)
    psi = hand_params(x.tp)
    busy = cost.step_seconds(CFG, 4096, x, H100, inter_node=inter_node)["compute"]
    return hybrid.data_parallel(x, node, psi, 80, math.ceil(psi / 5e7), math.ceil(psi / 5e7), busy, busy / M)


def test_replica_all_reduce_by_alpha_beta():
    """HSDP over groups of 8 on 64 GPUs: once a step each rank all-reduces its 1/8 shard's fp32
    gradient (FSDP2's reduce_dtype) with the 7 ranks holding the same shard, one per node, in 81
    FSDP units. NCCL's ring, Simple protocol: 8.4 us base + 2 (n - 1) = 14 network steps of 14 us
    (one rank a node), and 2 (n - 1) / n of S through one 12.5 GB/s NIC at 47/50 efficiency; the
    tree (2 S per node, x 0.92) and LL (capped at 20.4 GB/s bus bandwidth) are slower here."""
    s = 4 * math.ceil(hand_params() / 8)
    per_call = s / 81
    ring = 81 * ((8.4 + 14 * 14) * 1e-6 + 2 * 7 / 8 * per_call / (SLOW * 47 / 50))
    tree = 81 * ((8.4 + 2 * 3 * 14) * 1e-6 + 2 * per_call / (SLOW * 47 / 50) / 0.92)
    assert ring < tree
    _, _, rows = dp_rows(lay("hsdp", 8))
    assert rows["replica all-reduce"] == pytest.approx(ring, rel=1e-9)
    assert ring == pytest.approx(5.27, abs=0.01)


def test_hpz_backward_gather_stays_on_nvlink_by_alpha_beta():
    """hpZ's backward all-gather runs from the secondary copy over the 8 GPUs of a node: ring
    Simple, 8.4 us + 7 x 3.4 us NVLink steps and 7/8 of each 50M-element bucket over NVLink at
    370 GB/s (450 GB/s x 370/450), for 1,412 buckets a micro-batch and 16 micro-batches."""
    psi = hand_params()
    calls = math.ceil(psi / 50_000_000)
    assert calls == 1412
    per_call = 2 * psi / calls
    hand = M * calls * ((8.4 + 7 * 3.4) * 1e-6 + 7 / 8 * per_call / 370e9)
    _, _, rows = dp_rows(lay("hpz", 8))
    assert rows["backward all-gather (secondary)"] == pytest.approx(hand, rel=1e-9)


def test_a_slow_network_makes_hybrid_sharding_win_and_a_fast_one_ties():
    """64 H100s, Llama-3-70B, 16 micro-batches. At 12.5 GB/s per GPU between nodes ZeRO-3 moves
    3 x 2 psi per micro-batch across nodes and cannot hide it behind the compute; HSDP moves only
    the once-a-step 4 psi / 8 all-reduce there, hpZ 2 of its 3 collectives: both expose less, and
    HSDP moves the fewest seconds. On DGX H100's own network (50 GB/s per GPU) all three hide
    their traffic: the same data-parallel seconds (0)."""
    slow = {h: cost.step_seconds(CFG, 4096, x, H100, inter_node=SLOW)
            for h, x in (("zero3", lay()), ("hsdp", lay("hsdp", 8)), ("hpz", lay("hpz", 8)))}
    moved = {h: t["data_parallel_moved_s"] for h, t in slow.items()}
    exposed = {h: t["data_parallel"] for h, t in slow.items()}
    assert moved["hsdp"] < moved["hpz"] < moved["zero3"]
    assert exposed["zero3"] > 5 * max(exposed["hsdp"], exposed["hpz"]) and exposed["zero3"] > 20
    # HSDP: the shard group's gathers and reduce-scatters (NVLink) hide behind the step's compute;
    # the replicas' all-reduce only behind the last micro-batch's backward (2/3 of its compute)
    _, _, rows = dp_rows(lay("hsdp", 8))
    busy = slow["hsdp"]["compute"]
    assert moved["hsdp"] - rows["replica all-reduce"] < busy
    assert exposed["hsdp"] == pytest.approx(rows["replica all-reduce"] - busy / M * 2 / 3, rel=1e-9)
    assert rows["replica all-reduce"] < moved["zero3"] / 10
    fast = {h: cost.step_seconds(CFG, 4096, x, H100)["data_parallel"] for h, x in
            (("zero3", lay()), ("hsdp", lay("hsdp", 8)), ("hpz", lay("hpz", 8)))}
    assert fast == {"zero3": 0.0, "hsdp": 0.0, "hpz": 0.0}
    # the groups: shard inside a node, replicas one a node, all dp ranks 8 a node
    g = placement.hybrid_groups(placement.node_for(H100), 1, 1, 64, 1, 8)
    assert {k: (v.ranks_per_node, v.nodes) for k, v in g.items()} == {"dp": (8, 8), "shard": (8, 1),
                                                                     "replicate": (1, 8)}
    assert cost.overlap_table(lay("hsdp", 8)) == "fsdp2" and cost.overlap_table(lay("hpz", 8)) == "deepspeed-zero3"


def test_layout_text_accepts_hybrid_and_refuses_in_one_line(capsys):
    f = evaluate.parse_layout("tp=1,pp=1,dp=64,zero=3,hybrid=hpz,group=8")
    assert (f["hybrid"], f["group"]) == ("hpz", 8)
    assert (evaluate.parse_layout("tp=1,pp=1,dp=64,zero=3")["hybrid"],
            evaluate.parse_layout("tp=1,pp=1,dp=64,zero=3")["group"]) == ("none", 0)
    x = evaluate.to_layout(CFG, f, 64, 1024)
    assert (x.hybrid, x.group, x.label().count("hpz8")) == ("hpz", 8, 1)
    for text, says in (("zero=1,hybrid=hsdp,group=8", "accepted: zero=3"),
                       ("zero=3,hybrid=hsdp,group=6", "accepted: 2, 4, 8, 16, 32"),
                       ("zero=3,hybrid=hsdp", "accepted: 2, 4, 8, 16, 32"),
                       ("zero=3,group=8", "accepted: hybrid=hsdp|hpz"),
                       ("zero=3,hybrid=hsdp,group=8,offload=optimizer", "accepted: offload=none")):
        with pytest.raises(UsageError, match=says):
            evaluate.to_layout(CFG, evaluate.parse_layout("tp=1,pp=1,dp=64," + text), 64, 1024)
    code = cli.main(["plan", "--model", "llama-3-70b", "--gpus", "64", "--layout",
                     "tp=1,pp=1,dp=64,zero=3,hybrid=mics,group=8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "accepted: none, hsdp, hpz" in err and len(err.splitlines()) == 1
    code = cli.main(["plan", "--model", "llama-3-70b", "--gpus", "64", "--layout",
                     "tp=1,pp=1,dp=64,zero=3,hybrid=hpz,group=0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "positive integer" in err and len(err.splitlines()) == 1


def test_replicas_on_a_one_port_node_share_it():
    """Google Cloud g2 (8 L4 a node, one 100 Gb/s NIC): HSDP over groups of 8 on 2 nodes runs 8
    replica all-reduces at once, one per local rank, all through the node's one port. Each moves
    2 (2 - 1) / 2 x S; the ring (Simple: 8.4 us + 2 network steps of 14 us) therefore takes
    8 x S / (12.5 GB/s x 47/50) of wire time. On DGX H100 (a NIC per GPU) nothing is shared."""
    l4 = placement.node_for(gpu_table.get("l4"))
    rep = placement.hybrid_groups(l4, 1, 1, 16, 1, 8)["replicate"]
    assert (rep.ranks_per_node, rep.nodes) == (1, 2)
    hand = (8.4 + 2 * 14) * 1e-6 + 8 * 1e9 / (12.5e9 * 47 / 50)
    assert placement.shared_seconds("all_reduce", 1e9, rep) == pytest.approx(hand, rel=1e-9)
    assert placement.seconds("all_reduce", 1e9, rep) < hand / 4           # one group alone: not shared
    dgx = placement.hybrid_groups(placement.node_for(H100), 1, 1, 64, 1, 8)["replicate"]
    assert placement.shared_seconds("all_reduce", 1e9, dgx) == placement.seconds("all_reduce", 1e9, dgx)
