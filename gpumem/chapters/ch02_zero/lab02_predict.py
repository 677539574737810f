"""Lab 02 Part 2's graded prediction: ``predict_exposed_seconds(sizes, bucket_bytes, lone)``.

The learner's function gets the gradients' bytes in the order they arrive, the bucket size and two
lone reduce-scatters ``[(bytes, seconds), (bytes, seconds)]``, and returns the seconds of transfer
that cannot hide behind backward: the last bucket's reduce-scatter (it starts only when the last
gradient exists), priced on the line through the two measurements (a fixed cost plus bytes over a
bandwidth). Every earlier bucket is taken to hide (an assumption the sweep's table tests).

Graded twice:

* on planned numbers (:data:`PLANS`, worked by hand), so a constant, the whole gradients' transfer,
  a bucket rule other than the lab's (a bucket goes out from the hook whose gradient makes it reach
  ``bucket_bytes``) or the line without its fixed cost are each named;
* on this run: the ranks of ``check()`` time lone reduce-scatters (:mod:`.lab02_measure`); the
  learner's function, given those of half and one and a half times the sweep model's 9.4 MB,
  predicts the one-bucket transfer of all 9.4 MB, which the same run timed alone: the prediction
  must fall in that time's noise band (:func:`.lab02_measure.band`).
"""

import math

from gpumem.course.grading import Report, Row, call, returned, run_case

from . import lab02_measure

PREDICT = "predict_exposed_seconds"
# (sizes in arrival order, bucket_bytes, lone, the answer by hand). Lines: 2 ms + 1 us a byte; 6 ms + 2 us a byte
_A = ((1000, 0.003), (5000, 0.007))
_B = ((2000, 0.010), (6000, 0.018))
PLANS = (((400, 300, 200, 150), 0, _A, 0.002 + 150e-6),          # each alone: the last gradient
         ((400, 300, 200, 150), 500, _A, 0.002 + 350e-6),        # 400+300 goes out; 200+150 is left
         ((400, 300, 200, 150), 10**9, _A, 0.002 + 1050e-6),     # one bucket: everything
         ((300, 200, 100, 400), 400, _B, 0.006 + 500 * 2e-6))    # the last gradient fills a bucket of 100+400
REL = 1e-6


def _line(lone) -> tuple[float, float]:
    (b1, t1), (b2, t2) = lone
    slope = (t2 - t1) / (b2 - b1)
    return t1 - slope * b1, slope


def _hint(got: float, sizes, bucket: int, lone) -> str:
    fixed, slope = _line(lone)
    near = lambda x: math.isclose(got, x, rel_tol=1e-3)    # noqa: E731
    if near(fixed + slope * sum(sizes)) and bucket < sum(sizes):
        return (": that is every gradient's transfer; with this bucket the earlier buckets went out while "
                "backward still ran, only the last one is exposed")
    if near(0.0):
        return ": the last bucket starts only after the last gradient exists, so nothing hides it"
    if near(slope * sum(sizes)) or any(near(slope * s) for s in _lasts(sizes)):
        return ": the line through the two measurements has a fixed cost too (its value at 0 bytes)"
    if near(fixed + slope * (sum(sizes) % bucket if bucket else sizes[-1])):
        return (": a bucket goes out from the hook whose gradient makes it reach bucket_bytes, so buckets "
                "are not all bucket_bytes long; follow the gradients in their order")
    return ""


def _lasts(sizes) -> list[int]:
    return [sum(sizes[k:]) for k in range(len(sizes))]


def grade_plan(fn, plan) -> tuple[str, str]:
    """(status, detail) of the learner's function on one planned case of :data:`PLANS`."""
    sizes, bucket, lone, want = plan
    got = call(fn, list(sizes), bucket, [tuple(x) for x in lone])
    if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isfinite(got):
        return "wrong", returned(got, "seconds (a float)")
    if not math.isclose(got, want, rel_tol=REL):
        return "wrong", f"returned {got * 1e3:.4g} ms, expected {want * 1e3:.4g} ms" + _hint(got, sizes, bucket, lone)
    return "ok", ""


def grade_run(fn, lone: dict) -> tuple[str, str]:
    """The learner's one-bucket prediction from this run's two other lone reduce-scatters, against
    the reduce-scatter of all the sweep model's gradients timed alone in the same run."""
    sizes = [4 * n for n in reversed(lab02_measure.model_numel())]   # for one bucket only the total counts
    pred = call(fn, sizes, 1 << 62, lab02_measure.points(lone))
    full = lone["seconds"][lab02_measure.FRACTIONS[-1]]
    lo, hi = lab02_measure.band(full)
    if not isinstance(pred, (int, float)) or not lo <= pred <= hi:
        shown = f"{pred * 1e3:.1f} ms" if isinstance(pred, (int, float)) else repr(pred)[:40]
        return "wrong", (f"predicted {shown} for one bucket of all {sum(sizes) / 1e6:.1f} MB; this run timed that "
                         f"reduce-scatter alone at {lab02_measure.fastest(full) * 1e3:.1f} ms (fastest of "
                         f"{len(full)}), noise band {lo * 1e3:.1f} .. {hi * 1e3:.1f} ms")
    return "ok", f"predicted {pred * 1e3:.1f} ms, in this run's band {lo * 1e3:.1f} .. {hi * 1e3:.1f} ms"


def grade(report: Report, fn, lone: dict | None) -> None:
    """Rows for the planned numbers, then (when the ranks ran) for this run's measurement."""
    if fn is None:
        report.rows.append(Row(PREDICT, "planned numbers", "todo", f"{PREDICT} is still to write"))
        return
    for k, plan in enumerate(PLANS, 1):
        row = run_case(report, PREDICT, f"planned numbers {k}: bucket {plan[1]:,} B", lambda: grade_plan(fn, plan))
        if row.status != "ok":
            return
    if lone is None:
        report.rows.append(Row(PREDICT, "this run's reduce-scatters", "error",
                               "the ranks did not run (see Part 1's rows), so nothing was timed"))
        return
    run_case(report, PREDICT, f"one bucket vs this run's lone reduce-scatter ({lone['threads']} thread a rank, "
             f"{lone['cores']} cores)", lambda: grade_run(fn, lone))
