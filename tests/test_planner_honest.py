"""Issue 18, section 1: the planner answers honestly.

Each test reproduces a failure of the old planner and derives the expected figure by hand:
the global batch kept exactly (dp x micro-batch x accumulation = global batch, or the nearest
batches that run), a capacity below the reserve refused, a ``--largest-layer`` larger than the
model refused (and stated as unused below ZeRO-3), uneven pipeline splits stated and the fullest
stage counted, and divisors found in O(sqrt n) (``plan --gpus 1000000`` answers at once).
"""

import json
import subprocess
import sys

import pytest

from gpumem import cli
from gpumem.errors import UsageError
from gpumem.memory import estimate, models
from gpumem import planner
from gpumem.planner import stage_split

CFG70 = models.get("llama-3-70b")
CFG405 = models.get("llama-3.1-405b")


def degrees_by_hand(gpus: int, heads_kv: int, layers: int) -> set[tuple[int, int, int]]:
    """(tp, pp, dp): tp divides a node (8) and the key/value heads, pp <= layers, tp * pp * dp = gpus."""
    out = set()
    for tp in (1, 2, 4, 8):
        if gpus % tp or heads_kv % tp:
            continue
        for pp in range(1, layers + 1):
            if (gpus // tp) % pp == 0:
                out.add((tp, pp, gpus // (tp * pp)))
    return out


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def test_global_batch_of_one_on_1024_gpus_is_not_planned(capsys):
    """Old: "1,549 layouts fit", every one with dp >= 2, the Megatron arguments saying 2. On 1,024
    GPUs tp <= 8 and pp <= 80 (a power of two: 64) leave dp >= 1024 / (8 x 64) = 2, so without
    context parallelism no layout runs 1 sequence; the nearest batch that runs is 2. With it (cp up
    to 8: Megatron-Core splits the one sequence), tp x cp x pp = 1,024 leaves dp = 1: every plan
    then runs that one sequence, split over cp ranks, and nothing else."""
    assert min(dp for _, _, dp in degrees_by_hand(1024, 8, 80)) == 2
    r = planner.plan("llama-3-70b", 1024, global_batch=1, cp=(1,))
    assert r.plans == [] and r.advice["nearest"] == [2]
    r = planner.plan("llama-3-70b", 1024, global_batch=1, advise=False)
    assert r.plans and all(p.layout.dp == p.layout.micro_batch == p.layout.n_micro == 1 for p in r.plans)
    assert all(p.layout.cp > 1 and p.layout.tp * p.layout.cp * p.layout.pp == 1024 for p in r.plans)
    assert all(p.megatron[p.megatron.index("--global-batch-size") + 1] == "1" for p in r.plans)
    code, out, _ = run_cli(capsys, "plan", "--model", "llama-3-70b", "--gpus", "1024", "--global-batch", "1")
    assert code == 0 and f"global batch 1: {len(r.plans):,} layouts fit" in out and " cp" in out


def test_default_batch_on_100000_gpus_is_not_inflated():
    """Old: the top plan ran dp 1,250 x 1 = 1,250 sequences for the 1,024 asked (tokens/s 22 %
    high). 100,000 = 2^5 x 5^5: every dp there is a multiple of 250 (tp x pp <= 640 -> dp >= 157,
    and 2^5 x 5^5 / (tp x pp)), none divides 1,024; the nearest multiples that exist are 1,000
    (tp 2, pp 50) and 1,250 (tp 8, pp 10)."""
    dps = {dp for _, _, dp in degrees_by_hand(100_000, 8, 80)}
    assert not any(1024 % dp == 0 for dp in dps) and {1000, 1250} <= dps
    r = planner.plan("llama-3-70b", 100_000)
    assert r.question["global_batch"] == 1024 and r.plans == []
    assert r.advice["nearest"] == [1000, 1250]
    r = planner.plan("llama-3-70b", 100_000, global_batch=1000, recipes=("mixed",), zero=(0, 1),
                     offloads=(("none", "cpu"),), checkpoints=("none",), attentions=("flash",), advise=False)
    assert r.plans
    for p in r.plans:
        lay = p.layout
        assert lay.micro_batch * lay.n_micro * lay.dp == 1000
        assert p.tokens_per_s == pytest.approx(1000 * 4096 / p.time["total"], rel=1e-12)
        if p.megatron:
            assert p.megatron[p.megatron.index("--global-batch-size") + 1] == "1000"


def test_every_plan_runs_exactly_the_batch_asked():
    """24 GPUs, 36 sequences: only degrees whose dp divides 36 are plans (old: dp 8 ran 40), each
    micro-batch divides its replica's share, and the configs say the same batch: Megatron's
    --global-batch-size, DeepSpeed's micro x accumulation x its data-parallel world (dp; AutoTP
    layouts leave train_batch_size to DeepSpeed, which counts the tensor ranks too)."""
    r = planner.plan("llama-3-8b", 24, global_batch=36, recipes=("mixed",), zero=(0, 1), cp=(1,),
                     offloads=(("none", "cpu"),), checkpoints=("full",), attentions=("flash",), advise=False)
    hand = {d for d in degrees_by_hand(24, 8, 32) if 36 % d[2] == 0}
    with_cp = planner.plan("llama-3-8b", 24, global_batch=36, recipes=("mixed",), zero=(0, 1),
                           offloads=(("none", "cpu"),), checkpoints=("full",), attentions=("flash",), advise=False)
    assert any(p.layout.cp > 1 for p in with_cp.plans)   # dp x cp ranks, but only dp replicas share the batch
    assert all(p.layout.micro_batch * p.layout.n_micro * p.layout.dp == 36 for p in with_cp.plans)
    assert {(p.layout.tp, p.layout.pp, p.layout.dp) for p in r.plans} == hand
    assert any(p.layout.dp == 3 for p in r.plans) and not any(p.layout.dp == 8 for p in r.plans)
    for p in r.plans:
        lay, ds = p.layout, p.deepspeed
        if ds is None:   # Megatron-Core: its own arguments say the batch
            assert lay.framework == "megatron-core" and p.megatron[p.megatron.index("--micro-batch-size") + 1] \
                == str(lay.micro_batch) and p.megatron[p.megatron.index("--global-batch-size") + 1] == "36"
            continue
        assert (36 // lay.dp) % lay.micro_batch == 0
        assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * lay.dp == 36
        assert "train_batch_size" not in ds or ds["train_batch_size"] == 36
        if p.megatron:
            assert p.megatron[p.megatron.index("--global-batch-size") + 1] == "36"
        assert p.tokens_per_s * p.time["total"] == pytest.approx(36 * 4096, rel=1e-12)


def test_capacity_below_the_reserve_is_refused(capsys):
    """Old: ``--gpu-mem 1B`` printed "usable -2.1 GB" and exit 0. The reserve is 1 GiB + 1 GiB +
    5 % of capacity, so a capacity must exceed 2 GiB / 0.95 = 2,260,509,103 bytes."""
    code, out, err = run_cli(capsys, "plan", "--model", "llama-3-70b", "--gpus", "8", "--gpu-mem", "1B")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("gpumem: error: GPU memory 1 B ") and "reserve of 2.147 GB" in err
    assert "accepted: more than 2.261 GB" in err
    with pytest.raises(UsageError):
        planner.plan("llama-3-70b", 8, gpu_mem=2_260_509_000)
    assert planner.plan("llama-3-70b", 8, gpu_mem=2_260_510_000, advise=False).question["usable"] > 0


def test_largest_layer_larger_than_the_model_is_refused_and_unused_below_zero3(capsys):
    """Old: ``--largest-layer 100B`` with ``--params 70B`` was accepted; at ZeRO-0..2 the flag was
    silently ignored. Now the first is refused (exit 2, one line) and the second stated."""
    with pytest.raises(UsageError, match="larger than the model"):
        estimate.estimate(params=70 * 10**9, largest_layer=100 * 10**9, zero=3)
    code, out, err = run_cli(capsys, "estimate", "--params", "70B", "--largest-layer", "100B", "--zero", "3")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "100,000,000,000" in err and "70,000,000,000" in err and "accepted" in err
    notes = estimate.estimate(params=70 * 10**9, largest_layer=10**9, zero=2).states.notes
    assert any("--largest-layer not used at ZeRO-2" in n for n in notes)
    code, out, _ = run_cli(capsys, "estimate", "--params", "70B", "--largest-layer", "1B", "--zero", "1")
    assert code == 0 and "note: --largest-layer not used at ZeRO-1" in out
    assert not estimate.estimate(params=70 * 10**9, largest_layer=10**9, zero=3).states.notes


def test_uneven_pipeline_split_is_llamas_and_shown(capsys):
    """126 layers over 16 stages: Llama 3 takes one layer off the first and the last stage
    (arXiv:2407.21783, 3.3.2): 7 + 14 x 8 + 7. Every split keeps all layers, stages differ by
    at most one, and the end stages are never longer than the middle ones."""
    assert stage_split.stage_layers(CFG405, 16) == (7,) + (8,) * 14 + (7,)
    for cfg in (CFG70, CFG405):
        for pp in range(1, cfg.n_layers + 1):
            split = stage_split.stage_layers(cfg, pp)
            assert len(split) == pp and sum(split) == cfg.n_layers and max(split) - min(split) <= 1
            assert max(split[0], split[-1]) <= max(split) and min(split) >= 1
    llama = "tp=8,pp=16,dp=8,zero=1"                        # Llama 3's tp 8 x pp 16, on 1,024 GPUs
    code, out, _ = run_cli(capsys, "plan", "--model", "llama-3.1-405b", "--gpus", "1024", "--json", "--top", "3",
                           "--layout", llama)
    given = json.loads(out)["layout_result"]
    assert code == 0 and given["layout"]["pp"] == 16 and given["layout"]["stage_layers"] == [7] + [8] * 14 + [7]
    assert (given["memory"]["stage"], given["memory"]["stage_layers"]) == (1, 8)   # 8 layers x 15 in flight
    code, out, _ = run_cli(capsys, "plan", "--model", "llama-3.1-405b", "--gpus", "1024", "--top", "3",
                           "--layout", llama)
    assert "pipeline: 16 stages of 7 + 14 x 8 + 7 layers; memory counted for stage 1 (8 layers)" in out
    assert "pp16: 126 layers split 7 + 14 x 8 + 7" in out       # in the ranked table's top 3


def test_divisors_in_square_root_steps():
    for n in list(range(1, 400)) + [720_720, 1_000_000]:
        assert planner.search._divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert planner.search._divisors(10**9, 80) == [d for d in range(1, 81) if 10**9 % d == 0]


def test_a_billion_gpus_and_a_million_answer_at_once():
    """Old: ``plan --gpus 1000000000`` counted to 10^9 for the divisors (a hang). A hang test: a
    subprocess with a 60 s limit, expected to finish well before it."""
    code = ("from gpumem import planner\n"
            "r = planner.plan('llama-3-70b', 10**9)\n"
            "print(r.advice['nearest'])\n")
    lib = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert lib.returncode == 0, lib.stderr
    assert lib.stdout.strip() == "[1562500]"          # 10^9 / (8 x 80): the smallest dp, above 1,024
    cmd = subprocess.run([sys.executable, "-m", "gpumem", "plan", "--model", "llama-3-70b", "--gpus", "1000000"],
                         capture_output=True, text=True, timeout=60)
    assert cmd.returncode == 0, cmd.stderr
    assert "nearest global batches that run and fit: 2,500 " in cmd.stdout   # 10^6 / (8 x 50), 80 = 16 x 5 > 50


def test_suggested_batches_are_ones_the_command_accepts(capsys):
    """999,983 GPUs (a prime): only dp = 999,983 runs; near 2^24 sequences the batches that run are
    16 x 999,983 = 15,999,728 and 17 x 999,983 = 16,999,711, and the second is above
    --global-batch's bound (2^24 = 16,777,216), so it is not suggested."""
    from gpumem import cli
    assert cli.main(["plan", "--model", "llama-3-70b", "--gpus", "999983", "--global-batch", "16777216",
                     "--json"]) == 0
    import json
    advice = json.loads(capsys.readouterr().out)["advice"]
    assert advice["nearest"] == [16 * 999_983]
