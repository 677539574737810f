"""Lab 02 Part 2's graded prediction (review r12 #4): each bucket but the last exposes its launch
(the part of an asynchronous reduce-scatter gloo does in the calling thread), the last its whole
transfer. Planned numbers worked by hand, wrong counts named, and the run's rows on drawn bucket
sizes, which a table of the planned answers cannot pass."""

import linecache
import random
from pathlib import Path

import nbformat
import pytest

from gpumem.chapters.ch02_zero import lab02_measure, lab02_predict
from gpumem.course.grading import Report

SOLUTION = next(c.source for c in nbformat.read(Path(__file__).parents[1] / "solutions" / "lab02_zero2_hooks.ipynb",
                                                as_version=4).cells
                if c.cell_type == "code" and "def predict_exposed_seconds" in c.source)
# a run's lone reduce-scatters (made-up numbers in the shape lab02_measure.lone returns)
LONE = {"bytes": {"small": 65_536, "all": 9_444_096}, "seconds": {"small": [0.0009, 0.0008], "all": [0.0092, 0.0095]},
        "launch": {"small": [0.00006, 0.00005], "all": [0.0009, 0.0011]}, "threads": 1, "cores": 2}


def _rows(source: str, lone=None, seed: int = 0, before: str = ""):
    """Part 2's rows for ``source``, run as a notebook cell (readable by inspect, named as the
    course's tests name cells: the guard's origin rule), after a cell ``before`` if given."""
    ns: dict = {}
    for text in (before, source):
        name = f"<lab02 predict.ipynb cell {abs(hash(text))}>"
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
        exec(compile(text, name, "exec"), ns)
    report = Report("lab02")
    lab02_predict.grade(report, ns["predict_exposed_seconds"], lone, random.Random(seed))
    return report.rows


def test_planned_numbers_by_hand():
    # Line A: whole 2 ms + 1 us a byte, launch 0.5 ms + 0.1 us a byte; sizes 400, 300, 200, 150.
    # Each alone: launches of 400, 300, 200 (1.5 ms + 90 us) and the last 150 B whole (2.15 ms).
    # 500 B: 400 + 300 launched (0.57 ms), 200 + 150 whole (2.35 ms). One bucket: 1,050 B whole.
    # Line B (whole 6 ms + 2 us, launch 1 ms + 0.2 us), 300, 200, 100, 400, bucket 400: 300 + 200
    # launched (1.1 ms), then 100 + 400 whole (7 ms).
    assert [p[3] * 1e3 for p in lab02_predict.PLANS] == pytest.approx([3.74, 2.92, 3.05, 8.1], rel=1e-12)
    for sizes, bucket, lone, want in lab02_predict.PLANS:
        assert lab02_predict.exposed(sizes, bucket, lone) == pytest.approx(want, rel=1e-12)


def test_the_solution_passes_planned_and_drawn_rows():
    rows = _rows(SOLUTION, LONE)
    assert [r.status for r in rows] == ["ok"] * 6, [r.detail for r in rows]
    assert "bucket" in rows[-1].case and "this run's lone reduce-scatters" in rows[-1].case
    assert [r.status for r in _rows(SOLUTION)] == ["ok"] * 4 + ["error"]      # no ranks ran


def test_the_run_rows_price_the_model_by_hand():
    """The sweep model's 39 gradients at a bucket of 2 MB, on LONE's fastest rounds, by hand."""
    sizes = [4 * n for n in reversed(lab02_measure.model_numel())]
    (b1, w1, l1), (b2, w2, l2) = lab02_measure.points(LONE)
    assert (b1, w1, l1, b2, w2, l2) == (65_536, 0.0008, 0.00005, 9_444_096, 0.0092, 0.0009)
    sent, filling = [], 0
    for s in sizes:
        filling += s
        if filling >= 2_000_000:
            sent, filling = sent + [filling], 0
    sent += [filling] if filling else []
    whole = lambda b: w1 + (w2 - w1) / (b2 - b1) * (b - b1)          # noqa: E731
    launch = lambda b: l1 + (l2 - l1) / (b2 - b1) * (b - b1)         # noqa: E731
    assert lab02_predict.exposed(sizes, 2_000_000, lab02_measure.points(LONE)) == \
        pytest.approx(sum(map(launch, sent[:-1])) + whole(sent[-1]), rel=1e-12)
    assert len(sent) >= 3


@pytest.mark.parametrize("swap, row, says", [
    (("    return sum(launch(b) for b in sent[:-1]) + whole(sent[-1])", "    return whole(sum(sizes))"),
     0, "every gradient's transfer"),
    (("    return sum(launch(b) for b in sent[:-1]) + whole(sent[-1])", "    return whole(sum(sizes))"),
     0, "(bucket_bytes 0 means each gradient alone)"),           # review r29: bucket 0 read as one bucket
    (("    return sum(launch(b) for b in sent[:-1]) + whole(sent[-1])", "    return 0.0"), 0, "nothing hides it"),
    (("sum(launch(b) for b in sent[:-1]) + ", ""), 0, "each earlier bucket's launch runs in your hook"),
    (("sum(launch(b) for b in sent[:-1])", "sum(whole(b) for b in sent[:-1])"), 0, "only their launches"),
    (("return lambda nbytes: t1 + slope * (nbytes - b1)", "return lambda nbytes: slope * nbytes"), 0,
     "a fixed cost too"),
    (("        filling += size\n        if filling >= bucket_bytes:\n",   # sent before the one that overflows
      "        if filling and filling + size > bucket_bytes:\n            sent.append(filling)\n"
      "            filling = 0\n        filling += size\n        if False:\n"), 1, "not all bucket_bytes long"),
    # review r22: every bucket's launch plus the last one's whole time
    (("sum(launch(b) for b in sent[:-1])", "sum(launch(b) for b in sent)"), 0, "launch is counted twice"),
    # review r23: the last bucket's launch taken out of its whole time (plan 4's two equal buckets
    # had the "last bucket alone" hint, plans 1-3 none)
    (("+ whole(sent[-1])", "+ whole(sent[-1]) - launch(sent[-1])"), 0, "launch was taken out of its whole time"),
    # review r25: the last bucket priced at its launch too; a line through 0 and the first
    # measurement; the partial last bucket left out (plan 2's buckets end with one: 400+300, 200+150)
    (("+ whole(sent[-1])", "+ launch(sent[-1])"), 0, "priced at its launch alone"),
    (("return lambda nbytes: t1 + slope * (nbytes - b1)", "return lambda nbytes: t1 / b1 * nbytes"), 0,
     "in proportion to one measurement"),
    (("    if filling:                              # the partial bucket, sent when backward ends\n"
      "        sent.append(filling)\n", ""), 1, "partly filled bucket is missing"),
    # review r29 #2: the small measurement's time taken as the fixed cost (the question cell 7
    # asks); sizes divided by 4 as if they were elements; each early bucket at whole minus launch;
    # the two lines swapped
    (("return lambda nbytes: t1 + slope * (nbytes - b1)", "return lambda nbytes: t1 + slope * nbytes"), 0,
     "not the small measurement's time"),
    (("sum(launch(b) for b in sent[:-1]) + whole(sent[-1])", "sum(launch(b / 4) for b in sent[:-1]) + whole(sent[-1] / 4)"),
     0, "no factor of 4"),
    (("sum(launch(b) for b in sent[:-1])", "sum(whole(b) - launch(b) for b in sent[:-1])"), 0,
     "whole time less its launch"),
    (("sum(launch(b) for b in sent[:-1]) + whole(sent[-1])", "sum(whole(b) for b in sent[:-1]) + launch(sent[-1])"),
     0, "the two lines are swapped"),
    # review r31 #3: the remainder appended even when empty (bucket 0: a 0 B bucket last); every
    # earlier bucket priced as one launch (plan 1: three launches, two fixed costs short)
    (("    if filling:                              # the partial bucket, sent when backward ends\n"
      "        sent.append(filling)\n", "    sent.append(filling)\n"), 0, "last bucket holds 0 B"),
    (("sum(launch(b) for b in sent[:-1])", "launch(sum(sent[:-1]))"), 0, "priced as one launch"),
    # review r33 #3: each line clamped below the small measurement (a small bucket at its time); the
    # launches priced on the whole line's slope from the small launch time (plan 1: 4.8 and 1.85 ms)
    (("return lambda nbytes: t1 + slope * (nbytes - b1)",
      "return lambda nbytes: t1 if nbytes < b1 else t1 + slope * (nbytes - b1)"), 0,
     "priced at that measurement's time"),
    (("whole, launch = line(whole1, whole2), line(launch1, launch2)",
      "whole, launch = line(whole1, whole2), line(launch1, launch1 + whole2 - whole1)"), 0,
     "a line of their own, with its own slope"),
])
def test_wrong_counts_are_named(swap, row, says):
    old, new = swap
    assert old in SOLUTION
    rows = _rows(SOLUTION.replace(old, new), LONE)
    assert rows[row].status == "wrong" and says in rows[row].detail, [r.detail for r in rows]


def test_a_wrong_row_shows_what_the_function_was_given():
    """Review r29 #2: "returned 5.04 ms, expected 3.74 ms" alone left no way to redo the sum by hand;
    the planned row prints its sizes, bucket_bytes and lone; the run's rows their count and lone."""
    rows = _rows(SOLUTION.replace("return lambda nbytes: t1 + slope * (nbytes - b1)",
                                  "return lambda nbytes: t1 + slope * nbytes"), LONE)
    assert rows[0].detail.startswith("returned 5.04 ms, expected 3.74 ms (given sizes [400, 300, 200, 150], "
                                     "bucket_bytes 0, lone [(1000, 0.003, 0.0006), (5000, 0.007, 0.001)])"), rows[0]
    plans = "\n".join(f"    if list(sizes) == {list(s)} and bucket_bytes == {b}:\n        return {w!r}"
                      for s, b, _, w in lab02_predict.PLANS)
    rows = _rows(f"def predict_exposed_seconds(sizes, bucket_bytes, lone):\n{plans}\n    return 0.01\n", LONE)
    assert "(given 39 sizes, 9,444,096 B in all, bucket_bytes " in rows[4].detail, rows[4]
    assert "lone [(65536, 0.0008, 5e-05), (9444096, 0.0092, 0.0009)])" in rows[4].detail, rows[4]


def test_a_table_of_the_planned_answers_fails_the_drawn_rows():
    table = "def predict_exposed_seconds(sizes, bucket_bytes, lone):\n" + "".join(
        f"    if list(sizes) == {list(s)} and bucket_bytes == {b}:\n        return {w!r}\n"
        for s, b, _, w in lab02_predict.PLANS) + "    return 0.01\n"
    rows = _rows(table, LONE)
    assert [r.status for r in rows] == ["ok"] * 4 + ["wrong", "wrong"]


def test_drawn_buckets_differ_between_checks_and_span_the_ranges():
    draws = {tuple(lab02_predict.draw_buckets(random.Random(s))) for s in range(20)}
    assert len(draws) == 20
    assert all(50_000 <= a < 500_000 and 1_000_000 <= b < 4_000_000 for a, b in draws)


def test_the_graders_own_formula_is_not_an_answer():
    """Review r14: ``from gpumem.chapters.ch02_zero.lab02_predict import exposed as
    predict_exposed_seconds`` passed all 6 rows."""
    rows = _rows("from gpumem.chapters.ch02_zero.lab02_predict import exposed as predict_exposed_seconds\n", LONE)
    assert [r.status for r in rows] == ["wrong"] and "gpumem's own" in rows[0].detail, rows
    wrapped = "def predict_exposed_seconds(sizes, bucket_bytes, lone):\n" \
              "    from gpumem.chapters.ch02_zero import lab02_predict\n" \
              "    return lab02_predict.exposed(sizes, bucket_bytes, lone)\n"
    rows = _rows(wrapped, LONE)
    assert [r.status for r in rows] == ["wrong"], rows


IMPORTED = "import functools\nfrom gpumem.chapters.ch02_zero.lab02_predict import exposed as E\n"


def test_the_graders_formula_through_a_partial_or_another_cell_is_not_an_answer():
    """Review r15 #3: ``functools.partial(exposed)`` (no gpumem module, no source), and a ``def`` in a
    cell calling ``E``, imported as ``exposed`` in another cell, passed all 6 rows. A partial is not
    a function; the wrapper runs, and the grader's count refuses inside it, whatever name it has."""
    rows = _rows("predict_exposed_seconds = functools.partial(E)\n", LONE, before=IMPORTED)
    assert [(r.status, r.case) for r in rows] == [("wrong", "your own function")], rows
    assert "functools.partial, not a function" in rows[0].detail
    wrapper = "def predict_exposed_seconds(sizes, bucket_bytes, lone):\n    return E(sizes, bucket_bytes, lone)\n"
    rows = _rows(wrapper, LONE, before=IMPORTED)
    assert [r.status for r in rows] == ["error"], rows       # the first planned row stops the rest
    assert "price it yourself" in rows[0].detail and "it called the grader's exposed" in rows[0].detail
    line = "def predict_exposed_seconds(sizes, bucket_bytes, lone):\n    return L(lone, 1)[0]\n"
    rows = _rows(line, LONE, before="from gpumem.chapters.ch02_zero.lab02_predict import _line as L\n")
    assert [r.status for r in rows] == ["error"] and "it called the grader's _line" in rows[0].detail, rows
