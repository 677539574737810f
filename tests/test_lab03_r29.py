"""Lab 03 against review r29's findings (/work/notes/reviews21/r29/lab03.md)."""

import pytest

from gpumem.chapters.ch03_activation_checkpointing import labcases, labcheck
from gpumem.course.grading import Report

from test_lab03_adversarial import _exact, _solution_cells

SEEDS = range(1000, 1020)


def _end_without_checkpoints(segments, n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss):
    """r29 #1: the end of the forward as plain layers and the rest of the step only (the segments'
    checkpoints forgotten there), every re-run right: 18/18 estimate rows on 24 of 40 draws."""
    plain = n_layers - sum(map(len, segments))
    reruns = _exact(segments, n_layers, layer_bytes, checkpoint_bytes, -10**12, other_after_loss)
    return max(plain * layer_bytes + other_bytes, reruns)


def _end_dropped(segments, n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss):
    """The known-open route: once a segment exists, only the re-runs (the end of the forward dropped)."""
    if not segments:
        return (n_layers * layer_bytes) + other_bytes
    return _exact(segments, n_layers, layer_bytes, checkpoint_bytes, -10**12, other_after_loss)


@pytest.mark.parametrize("wrong", [_end_without_checkpoints, _end_dropped], ids=["checkpoints-forgotten", "end-dropped"])
def test_r29_an_end_of_the_forward_without_the_checkpoints_fails_every_draw(wrong):
    """Each of 20 draws grades a placement whose peak is the end of the forward with a segment
    (the loss-heavy model's [[0], [1]]), so both wrong estimates fail a row on every draw, where
    the checkpoints-forgotten one passed every estimate row on 24 of 40 before; the hand count
    (``_exact``) passes all. The grader's rows on two draws, the formula on all twenty."""
    for seed in SEEDS:
        cases = labcases.draw(seed)["estimates"]
        bad = [(cfg.name, s) for cfg, s in cases if wrong(s, **labcheck.numbers(cfg)) != _exact(s, **labcheck.numbers(cfg))]
        assert bad, seed
    for seed in SEEDS[:2]:
        cases = labcases.draw(seed)["estimates"]
        report = Report("lab03")
        labcheck._grade_estimates(report, wrong, cases)
        assert report.rows[-1].status == "wrong", report.summary()
        assert "reached at the end of the forward" in report.rows[-1].detail, report.rows[-1].detail
        report = Report("lab03")
        labcheck._grade_estimates(report, _exact, cases)
        assert len(report.rows) == len(cases) and all(r.status == "ok" for r in report.rows), report.summary()


def test_r29_the_loss_heavy_model_is_an_estimate_case_with_the_end_as_its_peak():
    """Every layer alone and [[0], [1]] on the loss-heavy question's model; [[0], [1]]'s peak is the
    end of the forward, checkpoints included (the solution's estimate says so too)."""
    solution = _solution_cells("def estimate_peak")["estimate_peak"]
    for seed in SEEDS:
        drawn = labcases.draw(seed)
        cfg = drawn["questions"][1].cfg
        assert (cfg, [[i] for i in range(cfg.n_layers)]) in drawn["estimates"]
        assert (cfg, [[0], [1]]) in drawn["estimates"]
        want, at, end = labcheck._expected_peak(cfg, [[0], [1]])
        assert at == "the end of the forward" and want == end, seed
        assert solution([[0], [1]], **labcheck.numbers(cfg)) == want
