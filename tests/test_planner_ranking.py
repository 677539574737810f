"""The planner's ranking (ties relative to the fastest, then headroom, recipe, offloaded bytes),
pure bf16 planned only when asked with its rounding risk in numbers, and the question object."""

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpumem import planner
from gpumem.memory import bf16_rounding
from gpumem.planner import ranking
from gpumem.planner.memory import Layout

ROOT = Path(__file__).resolve().parents[1]


def fake(seconds: float, total_gb: float = 40, usable_gb: float = 79, recipe: str = "mixed", host: float = 0,
         tp: int = 1):
    """A stand-in plan with the fields the ranking reads (a real Plan is built by the search)."""
    lay = Layout(recipe, 3, "none", "flash", "none", "cpu", 1, tp, 1, 8, 1)
    room = int((usable_gb - total_gb) * 1e9)
    mem = {"total": int(total_gb * 1e9), "host": int(host * 1e9), "nvme": 0, "headroom": room,
           "tight": ranking.tight(room, int(usable_gb * 1e9))}
    return SimpleNamespace(layout=lay, memory=mem, time={"total": seconds})


def test_tight_is_under_five_gb_or_six_percent():
    assert ranking.tight_limit(79_000_000_000) == 5_000_000_000          # 6 % of 79 GB is 4.74 GB
    assert ranking.tight_limit(130_000_000_000) == 7_800_000_000         # 6 % of 130 GB
    assert ranking.tight(4_999_999_999, 79 * 10**9) and not ranking.tight(5 * 10**9, 79 * 10**9)


def test_ties_are_relative_to_the_fastest_not_fixed_buckets():
    # the case: 88.339 s (pure bf16) and 88.592 s (mixed) are 0.29 % apart: one tie, mixed first
    bf16, mixed = fake(88.339, recipe="pure-bf16"), fake(88.592)
    assert [p.layout.recipe for p in ranking.rank([bf16, mixed])] == ["mixed", "pure-bf16"]
    # a chain: 100 and 100.4 tie; 100.8 is 0.8 % above the fastest, so it opens the next group
    a, b, c = fake(100.0, 50), fake(100.4, 30), fake(100.8, 10)
    assert ranking.rank([c, b, a]) == [b, a, c]


def test_roomy_before_tight_within_a_tie_and_time_across_ties():
    tight_fast, roomy = fake(50.0, 76.0), fake(50.2, 40.0)
    assert tight_fast.memory["tight"] and not roomy.memory["tight"]
    assert ranking.rank([tight_fast, roomy]) == [roomy, tight_fast]
    clearly_faster_tight = fake(45.0, 76.0)
    assert ranking.rank([roomy, clearly_faster_tight])[0] is clearly_faster_tight   # 10 % faster wins
    on_host = fake(50.1, 30.0, host=500)
    assert ranking.rank([on_host, roomy]) == [roomy, on_host]            # fewer offloaded bytes first


def test_rank_of_places_a_plan_as_the_ranking_would():
    plans = [fake(10.0), fake(12.0), fake(14.0, tp=2)]
    newcomer = fake(12.01, 20.0, tp=4)                                   # ties with 12.0, fewer bytes
    assert ranking.rank_of(plans, newcomer) == 2
    assert ranking.rank_of(plans, fake(9.0, tp=8)) == 1


def test_bf16_drops_updates_below_half_an_ulp_as_torch_rounds():
    for lr in (bf16_rounding.PRETRAIN_LR, bf16_rounding.FINETUNE_LR, 1e-3, 3e-6):
        t = bf16_rounding.threshold(lr)
        at = torch.tensor(t, dtype=torch.bfloat16)
        below = torch.tensor(t * (1 - 2**-8), dtype=torch.bfloat16)   # the largest bf16 value under t
        step = torch.tensor(lr, dtype=torch.bfloat16).float()
        # torch adds in fp32 and rounds to bf16, as a bf16 optimizer's update does
        assert (at.float() + step).to(torch.bfloat16) == at                      # lost at the threshold
        assert (below.float() + step).to(torch.bfloat16) != below                # kept just below it
    # the shares by hand: 8e-5 -> |w| >= 2^-5; 2e-5 -> |w| >= 2^-7; weights ~ N(0, 0.02)
    assert bf16_rounding.threshold(8e-5) == 2**-5 and bf16_rounding.threshold(2e-5) == 2**-7
    assert bf16_rounding.lost_share(8e-5) == pytest.approx(math.erfc(2**-5 / 0.02 / math.sqrt(2)))
    assert bf16_rounding.lost_share(2e-5) > 0.5 > bf16_rounding.lost_share(8e-5)   # fine-tuning: most updates


def test_pure_bf16_is_planned_only_when_asked():
    plain = planner.plan("llama-3-8b", 8, global_batch=64, advise=False)
    assert {p.layout.recipe for p in plain.plans} == {"mixed"} and not plain.notes
    both = planner.plan("llama-3-8b", 8, global_batch=64, advise=False, recipes=("mixed", "pure-bf16"))
    assert {p.layout.recipe for p in both.plans} == {"mixed", "pure-bf16"}
    assert "half a bf16 ULP" in both.notes[0] and "%" in both.notes[0]
    with pytest.raises(planner.UsageError if hasattr(planner, "UsageError") else Exception, match="recipe"):
        planner.plan("llama-3-8b", 8, recipes=("fp32",))


def test_question_object_and_keywords_ask_the_same():
    q = planner.Question("llama-3-8b", 8, seq=2048, global_batch=32,
                         cluster=planner.Cluster(gpu="a100-80gb", inter_node=25e9),
                         levers=planner.Levers(zero=(1, 3), tp=(1, 2)))
    a = planner.plan(q)
    b = planner.plan("llama-3-8b", 8, "a100-80gb", seq=2048, global_batch=32, inter_node=25e9, zero=(1, 3), tp=(1, 2))
    assert a.as_dict() == b.as_dict() and a.asked == q
    assert {p.layout.zero for p in a.plans} <= {1, 3} and {p.layout.tp for p in a.plans} <= {1, 2}
    assert planner.plan(replace(q, seq=4096)).question["seq"] == 4096
    with pytest.raises(TypeError, match="bogus"):
        planner.plan("llama-3-8b", 8, bogus=1)


def test_cli_recipe_tight_and_json_keys():
    cmd = [sys.executable, "-m", "gpumem", "plan", "--model", "llama-3-70b", "--gpus", "8", "--json", "--top", "50"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout)
    assert {p["layout"]["recipe"] for p in out["plans"]} == {"mixed"}
    limit = out["question"]["tight_below"]
    for p in out["plans"]:
        assert p["tight"] == p["memory"]["tight"] == (p["memory"]["headroom"] < limit)
    cmd += ["--recipe", "both"]
    both = json.loads(subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout)
    assert "pure-bf16" in {p["layout"]["recipe"] for p in both["plans"]} and both["notes"]
    bad = subprocess.run(cmd[:-2] + ["--cpu-adam-rate", "fast"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--cpu-adam-rate" in bad.stderr
