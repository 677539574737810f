"""Chapter 06's "why the top plan wins" cells (ranking_cells) and its prediction question
(quiz_ranking), against walks over the planner's ranked plans and hand arithmetic."""

import pytest

from gpumem import planner
from gpumem.chapters.ch06_combining_strategies import quiz as ch_quiz, quiz_ranking as qr, ranking_cells as rc

PSI_8B = 8_030_261_248         # Llama-3-8B, Meta's config
NIC_EFF = 0.94                 # NCCL's share of a NIC's line rate (gpumem.timing.collectives)


def family_by_hand(lay) -> int:
    """The option a data-parallel layout belongs to, read from its fields: hybrid sharding (1),
    offload (2), plain ZeRO-3 (0), ZeRO-1/2 (3)."""
    if lay.hybrid in ("hsdp", "hpz"):
        return 1
    if lay.offload in ("optimizer", "optimizer+params"):
        return 2
    return 0 if lay.zero == 3 else 3


@pytest.fixture(scope="module")
def answers():
    return {case: qr.asked(case) for case in qr.CASES}


def test_the_right_option_is_the_planners_top_family(answers):
    q = ch_quiz.QUIZ
    seen = set()
    for seed in range(30):
        question = q.seed(seed)._get("predict-sharding")
        case = question.numbers["case"]
        seen.add(case)
        top = answers[case].best.layout
        assert (top.tp, top.pp, top.cp) == (1, 1, 1)          # data parallelism only, as the prompt says
        assert question.answer == family_by_hand(top)
        assert question.grade(question.answer) and not question.grade((question.answer + 1) % 4)
        text = question.explanation_text()
        assert top.label() in text and f"{answers[case].best.time['total']:.2f} s" in text
    assert seen == set(qr.CASES)


def test_every_case_is_decided_by_a_margin_and_answers_differ(answers):
    """Each case's winning family is at least MARGIN faster than the best plan of every other
    family (walked here over the ranked plans), so a prediction is not a tie-break; and the cases
    have at least three different right options, so no one option is always right."""
    winners = set()
    for case, r in answers.items():
        best = {}
        for p in r.plans:
            best.setdefault(family_by_hand(p.layout), p)
        win = family_by_hand(r.best.layout)
        winners.add(win)
        for f, p in best.items():
            if f != win:
                assert p.time["total"] >= (1 + qr.MARGIN) * r.best.time["total"], (case, f)
    assert len(winners) >= 3, winners


def test_each_explanations_why_holds_for_its_case(answers):
    """The sentence after 'Why:' is a claim about the numbers: check it on each case."""
    for case, r in answers.items():
        top = r.best
        win = family_by_hand(top.layout)
        plain = next((p for p in r.plans if family_by_hand(p.layout) == 0), None)
        if win == 0:      # ZeRO-3's traffic hides
            assert top.time["data_parallel"] <= 0.01 * top.time["total"]
        elif win == 1:    # plain ZeRO-3 pays for its NIC traffic, the hybrid plan less
            assert plain is None or plain.time["data_parallel"] > top.time["data_parallel"]
        elif win == 2:    # offload buys fewer re-runs or fewer micro-batches than plain ZeRO-3
            kept = next(p for p in r.plans if p.layout.offload == "none")
            assert (top.time["compute"] < kept.time["compute"] or top.layout.n_micro < kept.layout.n_micro)
        else:
            assert plain is None or plain.time["data_parallel"] > top.time["data_parallel"]


def test_hundred_gb_ethernet_case_by_hand(answers):
    """Llama-3-8B on 128 H100s, one 100 Gb/s port per node (16 nodes): plain ZeRO-3's ring crosses
    each node's one port once per collective, 127/128 x 2 psi = 15.9 GB over 0.94 x 12.5 GB/s =
    1.36 s; three collectives per micro-batch, at least one micro-batch: >= 4.07 s a step, and a
    step is never shorter than its traffic. hpZ keeps backward's gather on NVLink: two collectives
    cross, 2.72 s."""
    case = ("llama-3-8b", "h100-80gb", 128, "eth100")
    if case not in answers:
        pytest.skip("case not drawn")
    one = 127 / 128 * 2 * PSI_8B / (NIC_EFF * 12.5e9)
    assert one == pytest.approx(1.357, abs=0.002)
    r = answers[case]
    plain = [p for p in r.plans if p.layout.zero == 3 and p.layout.hybrid == "none"]
    assert plain and min(p.time["total"] for p in plain) >= 3 * one
    assert r.best.layout.hybrid != "none" and r.best.time["total"] < 3 * one


def test_ranking_cells_fit_100_columns_and_name_the_runner_up():
    for name in rc.ABOUT:
        text = rc.why_top(name) + "\n" + rc.sensitivity_text(name)
        assert max(map(len, text.splitlines())) <= 100, name
        r = rc.answer(name)
        assert r.best.layout.label() in text.replace("\n  ", " ")
        kept, n = rc.robust(name)
        assert n == 6 and 0 <= kept <= n
    for text in (rc.rules_table(), rc.slow_versus()):
        assert max(map(len, text.splitlines())) <= 100


def test_rules_table_families_match_the_planner():
    """The 8B rows say what timing_cells.slow_plan's top is; a hybrid row's plan is hybrid."""
    from gpumem.chapters.ch06_combining_strategies import timing_cells
    lines = rc.rules_table().splitlines()
    rows = [ln for ln in lines if ln.startswith("  ")]
    for (label, node), row in zip(timing_cells.networks(), rows[:4]):
        top = timing_cells.slow_plan(node).best
        assert rc.family(top.layout) in row and f"{top.time['total']:.2f}" in row
    assert rc.family(planner.plan("llama-3-70b", 64, tp=(8,), pp=(8,), zero=(0,), vp=(1,), cp=(1,)).best.layout) \
        .startswith("3-D")


def test_rules_table_rates_right_aligned_and_ib_note_by_hand():
    """Every row's GB/s per GPU ends in the header's column; the note's rates are the NICs' line
    rates over 8 GPUs: DGX A100 8 x 200 Gb/s -> 25 GB/s, DGX H100 8 x 400 Gb/s -> 50 GB/s per GPU
    (NVIDIA's DGX A100 / DGX H100 datasheets)."""
    text = rc.rules_table()
    lines = text.splitlines()
    end = lines[0].index("GB/s/GPU") + len("GB/s/GPU")
    rows = [ln for ln in lines if ln.startswith("  ")]
    assert len(rows) == 8
    assert all(ln[end - 1] != " " and ln[end] == " " for ln in rows)
    assert all("tp8" in ln for ln in rows[4:] if "3-D" in ln)
    flat = " ".join(text.split())
    assert f"{8 * 200 / 8 / 8:.3g} GB/s per GPU" in flat and f"{8 * 400 / 8 / 8:.3g} GB/s per GPU" in flat


def test_slow_versus_says_how_much_longer_zero3_takes():
    """The last line states plain ZeRO-3's extra time over the top plan as the two step times'
    ratio, read off the table's own 'step' row."""
    text = rc.slow_versus()
    step = next(ln for ln in text.splitlines() if ln.startswith("step"))
    top, plain = map(float, step.split()[1:3])
    assert f"ZeRO-3 takes {plain / top - 1:.0%} longer" in text
    assert f"{1 - top / plain:.0%} faster" in text
