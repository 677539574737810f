"""Chapter 05's quiz: every numeric answer redone by hand from the numbers the learner sees."""

import math
import random

import pytest

from gpumem.chapters.ch05_offload.quiz import QUIZ
from gpumem.course.quiz import Numeric

SEEDS = range(30)


def _q(qid):
    return next(q for q in QUIZ.questions if q.id == qid)


def _draws(qid):
    q = _q(qid)
    for seed in SEEDS:
        q.redraw(random.Random(seed))
        yield q, q.numbers


def test_grad_trip_is_what_deepspeed_sends_down_at_each_stage():
    seen = set()
    for q, n in _draws("grad-trip"):
        shard = -(-n["n_params"] // n["gpus"])
        seen.add(n["zero"])
        # stage_1_and_2.py widens to fp32 on the GPU, then copies: 4 B per shard parameter;
        # stage3.py partition_grads copies the bf16 partition down (2 B), back up, and the fp32 widening
        # down (4 B): 6 B down
        down = {2: 4, 3: 2 + 4}[n["zero"]]
        assert q.value() == pytest.approx(1e3 * down * shard / (n["pcie"] * 1e9), rel=1e-9)
        text = q.prompt_text()
        assert f"{n['gpus']} " in text and "as DeepSpeed 0.19.8 runs it" in text and f"ZeRO-{n['zero']}" in text
        # the ZeRO-Offload paper's 2 B answer is named as a trap, never accepted
        paper = 1e3 * 2 * shard / (n["pcie"] * 1e9)
        assert not q.grade(paper) and "paper" in q.hint_for(paper)
    assert seen == {2, 3}


def test_infinity_writes_back_master_moments_and_params():
    for q, n in _draws("infinity-writes"):
        shard = -(-n["n_params"] // n["gpus"])
        # on the drive: fp32 master, m, v, the optimizer's fp32 gradient, the bf16 parameter shard
        assert q.value() == pytest.approx((4 + 4 + 4 + 4 + 2) * shard / (n["write_gbs"] * 1e9), rel=1e-9)


def test_hide_the_transfers_needs_compute_as_long_as_the_slowest_term():
    for q, n in _draws("hide-the-transfers"):
        shard = -(-n["n_params"] // n["gpus"])
        # DeepSpeed's ZeRO-3 gradient copies on one stream: 2 B down, 2 B up, 4 B down; the parameters
        # 2 B up, gradients' return 2 B up; CPU Adam over the shard
        slowest = max((2 + 2 + 4) * shard / (n["pcie"] * 1e9), 4 * shard / (n["pcie"] * 1e9),
                      shard / (n["adam_g"] * 1e9))
        tokens = slowest * n["tflops"] * 1e12 * n["mfu_pct"] / 100 / (6 * n["n_params"])
        assert q.value() == pytest.approx(math.ceil(tokens), abs=1)


def test_infinity_read_is_bound_by_the_slower_link():
    for q, n in _draws("infinity-read"):
        shard = -(-n["n_params"] // n["gpus"])
        assert q.value() == pytest.approx(2 * shard / (min(n["read_gbs"], n["pcie"]) * 1e9), rel=1e-9)


def test_schedule_delayed_update_or_stock_deepspeed():
    seen = set()
    for q, n in _draws("schedule"):
        seen.add(n["dpu"])
        want = (max(n["compute"], n["d2h"], n["adam"], n["h2d"]) if n["dpu"]
                else max(n["compute"], n["d2h"]) + n["adam"] + n["h2d"])
        assert q.value() == pytest.approx(want)
    assert seen == {True, False}


def test_every_question_has_a_hint_and_the_quiz_has_four_reasoning_questions():
    assert len([q for q in QUIZ.questions if isinstance(q, Numeric)]) >= 4
    assert all(q.hint for q in QUIZ.questions)
