"""The planner's top plan against each published run's own layout (gpumem.planner.practice).

Which layout wins for a run is not asserted: the search is being extended (context parallelism,
virtual stages, hybrid sharding), and the winner will move. What is held: the arithmetic (the
terms' differences add up to the difference of the step times, each the top plan's term minus
the run's), the detection of the same layout, the deciding terms and the sentence on hand-made
plans whose numbers are known, the question asked (the run's own), and that nothing but one
search per run is run.
"""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from gpumem.chapters.ch06_combining_strategies import validation_cells
from gpumem.planner import practice, validate
from gpumem.planner.memory import Layout
from gpumem.timing import published

# The terms of a step as gpumem.planner.cost.step_seconds lists them (read from its source).
STEP_TERMS = {"compute", "attention_scores", "pipeline_bubble", "tensor_parallel", "context_parallel",
              "pipeline_p2p", "data_parallel", "optimizer", "offload"}
GB = 1e9


def fake_plan(lay: Layout, usable: float = 79e9, total: float = 60e9, **seconds) -> SimpleNamespace:
    """A plan with hand-set seconds (every other term 0) and bytes."""
    time = dict.fromkeys(STEP_TERMS, 0.0) | seconds
    time |= {"total": sum(time.values()), "bound": max(time, key=time.get), "data_parallel_moved_s": 9.9}
    return SimpleNamespace(layout=lay, time=time,
                           memory={"total": total, "headroom": usable - total, "usable": usable})


def lay(**kw) -> Layout:
    base = dict(recipe="mixed", zero=1, checkpoint="none", attention="flash", offload="none", device="cpu",
                micro_batch=1, tp=8, pp=8, dp=4, n_micro=32)
    return Layout(**(base | kw))


@pytest.fixture(scope="module")
def pairs():
    return practice.comparisons()        # validate.rows(): computed once per process, then cached


# -- arithmetic, on every published run -------------------------------------------------------------

def test_term_differences_sum_to_the_total_difference(pairs):
    priced = [(r, c) for r, c in pairs if c is not None]
    assert len(priced) == len(published.RUNS) - len(validate.OUT_OF_SCOPE)
    for row, c in priced:
        assert set(c.diffs) == STEP_TERMS, row.run.key
        for k in STEP_TERMS:
            assert c.diffs[k] == pytest.approx(row.top.time[k] - row.plan.time[k], abs=1e-12)
        assert sum(c.diffs.values()) == pytest.approx(row.top.time["total"] - row.plan.time["total"],
                                                      rel=1e-9, abs=1e-9)
        assert c.ratio == pytest.approx(row.plan.time["total"] / row.top.time["total"])


def test_memory_and_fit_follow_the_plans(pairs):
    for row, c in pairs:
        if c is None:
            assert row.predicted is None or row.top is None
            continue
        assert c.run_memory == (row.plan.memory["total"], row.plan.memory["headroom"])
        assert c.top_memory[0] + c.top_memory[1] == pytest.approx(row.top.memory["usable"])
        assert c.top_memory[1] >= 0                                   # the top plan fits
        if row.fits:
            assert c.over == 0 and "does not fit" not in c.sentence
        elif row.plan.memory["headroom"] < 0:
            assert c.over == -row.plan.memory["headroom"]
            assert f"{c.over / GB:.1f} GB over the usable" in c.sentence


def test_sentences_name_the_largest_term_and_every_change(pairs):
    for row, c in pairs:
        if c is None or c.same:
            continue
        biggest = max(c.diffs, key=lambda k: abs(c.diffs[k]))
        if abs(c.diffs[biggest]) >= 0.005:
            assert practice.WORDS[biggest] in c.sentence, row.run.key
            assert c.deciding[0] == biggest
        for name, a, b in c.changes:
            assert f"{name} from {a} to {b}" in c.sentence, (row.run.key, name)
        assert f"{c.top_total:.2f} s against the run's {c.run_total:.2f} s" in c.sentence


def test_the_question_is_the_runs_own_and_mixed_precision(pairs):
    for row, c in pairs:
        if c is None:
            continue
        assert row.top.layout.recipe == "mixed"                     # no published run trains pure bf16
        lay_ = row.top.layout
        assert lay_.tp * lay_.cp * lay_.pp * lay_.dp == row.run.gpus
        assert lay_.dp * lay_.micro_batch * lay_.n_micro == row.run.global_batch


def test_one_search_per_run_and_comparisons_reuse_the_rows(monkeypatch, pairs):
    run = published.get("nemo-llama-3-8b-8")
    calls = []
    real = validate.plan

    def counting(*args, **kwargs):
        calls.append((args, kwargs))
        result = real(*args, **kwargs)
        calls[-1] = (args, kwargs, result)
        return result

    monkeypatch.setattr(validate, "plan", counting)
    row = validate.price(run)
    assert len(calls) == 1                                            # ranking and top from one search
    args, kwargs, result = calls[0]
    assert args[1] == run.gpus and kwargs["recipes"] == ("mixed",)
    assert (kwargs["gpu"], kwargs["seq"], kwargs["global_batch"]) == (run.gpu, run.seq, run.global_batch)
    assert row.top is result.best and row.fitting == len(result.plans)

    def refuse(*a, **k):
        raise AssertionError("a search was run again")
    monkeypatch.setattr(validate, "plan", refuse)
    assert len(practice.comparisons()) == len(published.RUNS)         # the cached rows only


# -- hand-made plans: the numbers are known -------------------------------------------------------

def test_the_runs_own_layout_as_top_is_the_same_layout(pairs):
    row = next(r for r, c in pairs if c is not None and r.fits)
    c = practice.compare_plans(row.run.key, row.plan, row.plan)
    assert c.same and c.changes == () and c.deciding == () and c.difference == 0
    assert all(v == 0 for v in c.diffs.values()) and c.ratio == 1
    assert "the run's own layout" in c.sentence
    other = replace(row.plan, layout=replace(row.plan.layout, checkpoint="full" if
                                             row.plan.layout.checkpoint != "full" else "none"))
    c2 = practice.compare_plans(row.run.key, row.plan, other)
    assert not c2.same and [x[0] for x in c2.changes] == ["ckpt"]


def test_a_shorter_bubble_decides_and_the_sentence_says_so():
    """pp 8 -> 4 (dp 4 -> 8): bubble 3.1 s -> 0 s, data-parallel 0.2 s -> 0.6 s, compute 20 s both:
    the difference is -3.1 + 0.4 = -2.7 s; the bubble alone covers it."""
    run = fake_plan(lay(pp=8, dp=4), compute=20.0, pipeline_bubble=3.1, data_parallel=0.2)
    top = fake_plan(lay(pp=4, dp=8, n_micro=16), compute=20.0, pipeline_bubble=0.0, data_parallel=0.6)
    c = practice.compare_plans("x", run, top)
    assert c.changes == (("pp", 8, 4), ("dp", 4, 8))
    assert c.diffs["pipeline_bubble"] == pytest.approx(-3.1) and c.diffs["data_parallel"] == pytest.approx(0.4)
    assert c.difference == pytest.approx(-2.7) and sum(c.diffs.values()) == pytest.approx(-2.7)
    assert c.deciding == ("pipeline_bubble",)
    assert c.sentence.startswith("the planner's plan drops pp from 8 to 4 and raises dp from 4 to 8: the "
                                 "bubble is 3.10 s shorter and the data-parallel term is 0.40 s longer")
    assert c.ratio == pytest.approx(23.3 / 20.6)


def test_offsetting_terms_need_more_than_the_largest():
    """tensor-parallel -2.0 s, compute +1.5 s, bubble -1.0 s: the total is -1.5 s, and -2.0 s covers
    it alone. Compute +1.2 s against tensor-parallel -1.0, data-parallel -0.9, bubble -0.8: the
    total is -1.5 s and only all four reach it."""
    assert practice.deciding({"tensor_parallel": -2.0, "compute": 1.5, "pipeline_bubble": -1.0}) == \
        ("tensor_parallel",)
    d = {"compute": 1.2, "tensor_parallel": -1.0, "data_parallel": -0.9, "pipeline_bubble": -0.8}
    # |1.2| first: +1.2 is on the wrong side of -1.5; then -1.0 (0.2), -0.9 (-0.7), -0.8 (-1.5): all four
    assert practice.deciding(d) == ("compute", "tensor_parallel", "data_parallel", "pipeline_bubble")
    assert practice.deciding(dict.fromkeys(STEP_TERMS, 0.0)) == ()


def test_a_layout_that_does_not_fit_says_by_how_much():
    run = fake_plan(lay(checkpoint="none"), usable=79.1e9, total=90.7e9, compute=16.0)
    top = fake_plan(lay(checkpoint="every-other"), usable=79.1e9, total=64.5e9, compute=17.6)
    c = practice.compare_plans("x", run, top, fits=False, why_not=("needs 90.7 GB per GPU",))
    assert c.over == pytest.approx(11.6e9)
    assert c.sentence.startswith("the run's layout does not fit the planner's memory model (11.6 GB over "
                                 "the usable 79.1 GB); the planner's plan switches ckpt from none to every-other")
    assert "the compute is 1.60 s longer" in c.sentence


def test_a_faster_layout_outside_the_search_is_named():
    run = fake_plan(lay(cp=2, vp=5, dp=2), compute=12.0, pipeline_bubble=0.5)
    top = fake_plan(lay(), compute=12.0, pipeline_bubble=2.0)
    c = practice.compare_plans("x", run, top, outside=("cp 2", "vp 5"))
    assert "(no fitting plan of the search has cp 2 and vp 5; the run's layout is faster)" in c.sentence
    tie = practice.compare_plans("x", fake_plan(lay(zero=3), compute=10.0), fake_plan(lay(), compute=10.02))
    assert "a tie within 0.5 %" in tie.sentence


def test_short_forms():
    assert practice.short(lay(tp=4, cp=2, pp=4, dp=2, vp=5)) == "tp4 cp2 pp4 dp2 v5 z1 mb1"
    assert practice.short(lay(tp=1, pp=1, dp=8, zero=3, checkpoint="full", offload="optimizer+params")) == \
        "tp1 pp1 dp8 z3 mb1 full off=all"
    assert practice.short(lay(checkpoint="selective", attention="naive", offload="optimizer", device="nvme")) \
        == "tp8 pp8 dp4 z1 mb1 sel naive off=opt:nvme"


# -- the chapter's table ----------------------------------------------------------------------------

def test_top_vs_published_table(pairs):
    text = validation_cells.top_vs_published()
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100
    for run in published.RUNS:
        assert sum(ln.startswith(run.key + " ") for ln in lines) == 1           # its table row
        assert sum(ln.startswith(run.key + ": ") for ln in lines) == 1          # its sentence
    priced = [c for _, c in pairs if c is not None]
    assert sum(ln.startswith(" " * 25 + "top ") for ln in lines) == len(priced)
    for c in priced:
        assert f"{c.ratio:>7.2f}" in text
