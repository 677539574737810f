"""``plan`` on a learner's own model (issue 22): a shipped config by name or a config.json path,
dense or a mixture of experts (expert parallelism: ``tests/test_plan_moe.py``)."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

CONFIGS = ROOT / "gpumem" / "memory" / "configs"


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpumem", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_a_shipped_config_is_planned_and_its_weights_split_by_tp():
    """Qwen2.5-72B's model card gives 72.7 B parameters; at tp 8 without ZeRO each GPU holds an
    eighth of them in bf16 (the norms and q/k/v biases, replicated, are under 0.01 %)."""
    proc = plan("--model", "qwen2.5-72b", "--gpus", "64", "--top", "3", "--json",
                "--layout", "tp=8,pp=1,dp=8,zero=0,ckpt=full")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["question"]["model"] == "qwen2.5-72b" and out["plans"]
    params = out["layout_result"]["memory"]["params"]
    assert params == pytest.approx(2 * 72.7e9 / 8, rel=2e-3)


def test_a_config_path_plans_like_its_name():
    by_name = plan("--model", "mistral-7b-v0.1", "--gpus", "8", "--top", "2", "--json")
    by_path = plan("--config", str(CONFIGS / "mistral-7b-v0.1.json"), "--gpus", "8", "--top", "2", "--json")
    assert by_name.returncode == by_path.returncode == 0, by_name.stderr + by_path.stderr
    a, b = json.loads(by_name.stdout), json.loads(by_path.stdout)
    assert [p["label"] for p in a["plans"]] == [p["label"] for p in b["plans"]]


@pytest.mark.parametrize("args, says", [
    (("--model", "mixtral-8x7b", "--layout", "tp=1,pp=1,dp=8,zero=1,ep=16"), "must divide the 8 experts"),
    (("--config", str(CONFIGS / "qwen3-30b-a3b.json"), "--layout", "tp=1,pp=1,dp=8,zero=1,ep=3"),
     "must divide the 128 experts"),
    ((), "give one of --model NAME or --config PATH"),
    (("--model", "llama-3-8b", "--config", str(CONFIGS / "gpt2.json")), "give one of --model NAME or --config PATH"),
    (("--config", "/no/such/config.json"), "no such file"),
    (("--model", "qwen9"), "unknown model"),
])
def test_plan_refuses_in_one_line(args, says):
    proc = plan(*args, "--gpus", "8")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr, proc.stderr
