"""Lab 02 Part 2's graded prediction: ``predict_exposed_seconds(sizes, bucket_bytes, lone)``.

The learner's function gets the gradients' bytes in the order they arrive, the bucket size and two
lone reduce-scatters ``[(bytes, seconds, launch_seconds), ...]`` (each timed whole, and its launch
alone: the part gloo does in the calling thread before ``async_op=True`` returns). It returns the
seconds of communication that cannot hide behind backward when a core is free for the transfers:

* each bucket but the last: its **launch**, which runs in the hook and so holds backward up (on
  the line through the two launch times);
* the last bucket: its **whole** reduce-scatter, which starts only when the last gradient exists
  (on the line through the two whole times).

Each line is a fixed cost plus bytes over a bandwidth. Graded twice (:func:`exposed` is the
grader's own count; it, and every other function of this module, refuses while the learner's
function runs, :mod:`.lab02_guard`):

* on planned numbers (:data:`PLANS`, worked by hand), so a constant, the whole gradients' transfer,
  a bucket rule other than the lab's (a bucket goes out from the hook whose gradient makes it reach
  ``bucket_bytes``), a line without its fixed cost or launches left out are each named;
* on this run: the ranks of ``check()`` time the lone reduce-scatters (:mod:`.lab02_measure`), and
  the learner's function prices the sweep model's gradients at two bucket sizes drawn per check,
  from those measurements: numbers no table can hold.

Whether the model fits a measurement is the sweep's to show (:mod:`.lab02_sweep`, not graded: a
step time on shared CPU cores is too noisy to grade).
"""

import math
import random

from gpumem.course import seeds
from gpumem.course.grading import Report, Row, call, kind, returned, run_case
from gpumem.course import lab_bare
from gpumem.course.lab_reach import first_reach

from . import lab02_measure

PREDICT = "predict_exposed_seconds"
# (sizes in arrival order, bucket_bytes, lone, the answer by hand). Line A: whole 2 ms + 1 us a
# byte, launch 0.5 ms + 0.1 us a byte; line B: whole 6 ms + 2 us a byte, launch 1 ms + 0.2 us a byte
_A = ((1000, 0.003, 0.0006), (5000, 0.007, 0.0010))
_B = ((2000, 0.010, 0.0014), (6000, 0.018, 0.0022))
PLANS = (((400, 300, 200, 150), 0, _A, 3 * 0.0005 + 900e-7 + 0.002 + 150e-6),   # each alone: 3 launches + 150 B
         ((400, 300, 200, 150), 500, _A, 0.0005 + 700e-7 + 0.002 + 350e-6),     # 400+300 launched; 200+150 whole
         ((400, 300, 200, 150), 10**9, _A, 0.002 + 1050e-6),                    # one bucket: no launch before it
         ((300, 200, 100, 400), 400, _B, 0.001 + 500 * 2e-7 + 0.006 + 500 * 2e-6))   # 300+200, then 100+400
REL = 1e-6
DRAWN = ((50_000, 500_000), (1_000_000, 4_000_000))   # this run's two bucket sizes: one from each range


def _line(lone, k: int) -> tuple[float, float]:
    """(fixed, per byte) through the two measurements' ``k``-th seconds (1 whole, 2 launch)."""
    (b1, *t1), (b2, *t2) = lone
    slope = (t2[k - 1] - t1[k - 1]) / (b2 - b1)
    return t1[k - 1] - slope * b1, slope


def buckets(sizes, bucket: int) -> list[int]:
    """The buckets' bytes in the order they go out: a bucket goes from the hook whose gradient makes
    it reach ``bucket`` bytes; what is left goes when backward ends."""
    out, filling = [], 0
    for size in sizes:
        filling += size
        if filling >= bucket:
            out.append(filling)
            filling = 0
    return out + [filling] if filling else out


def exposed(sizes, bucket: int, lone) -> float:
    """The grader's count: every bucket's launch but the last one's, and the last one whole."""
    (fw, sw), (fl, sl) = _line(lone, 1), _line(lone, 2)
    *early, last = buckets(sizes, bucket)
    return sum(fl + sl * b for b in early) + fw + sw * last


def _other_rules(sizes, bucket: int) -> list[list[int]]:
    """Buckets by two rules other than the lab's: chunks of exactly ``bucket`` bytes (a gradient
    split across them), and a bucket sent before the gradient that would take it past ``bucket``."""
    total, out = sum(sizes), []
    if bucket:
        out.append([bucket] * (total // bucket) + ([total % bucket] if total % bucket else []))
    before, filling = [], 0
    for size in sizes:
        if filling and filling + size > bucket:
            before.append(filling)
            filling = 0
        filling += size
    out.append(before + [filling])
    return [b for b in out if b and b != buckets(sizes, bucket)]


def _hint(got: float, sizes, bucket: int, lone) -> str:
    (fw, sw), (fl, sl) = _line(lone, 1), _line(lone, 2)
    *early, last = buckets(sizes, bucket)
    launches_of = lambda bs: sum(fl + sl * b for b in bs)    # noqa: E731
    launches = launches_of(early)
    near = lambda x: math.isclose(got, x, rel_tol=1e-3)    # noqa: E731
    if near(launches + fl + sl * last + fw + sw * last):      # review r22: the likeliest slip
        return (": the last bucket's launch is counted twice: its whole time, launched and waited at "
                "once, already holds its launch")
    if near(launches + fw + sw * last - fl - sl * last):         # review r23: the launch taken out
        return (": the last bucket's launch was taken out of its whole time: that launch runs in your hook "
                "too, after the last gradient, with nothing left to hide behind")
    if near(fw + sw * sum(sizes)) and early:
        return (": that is every gradient's transfer" + (" (bucket_bytes 0 means each gradient alone)" if not bucket
                else "") + "; with this bucket the earlier buckets went out while backward still ran, only "
                "their launches and the last bucket are exposed")
    if near(0.0):
        return ": the last bucket starts only after the last gradient exists, so nothing hides it"
    if early and near(fw + sw * last):
        return (": that is the last bucket alone; each earlier bucket's launch runs in your hook, before "
                "backward goes on (price it on the line through the launch times)")
    if early and near(sum(fw + sw * b for b in early) + fw + sw * last):
        return ": the earlier buckets' transfers hide when a core is free; only their launches hold backward up"
    if near(launches + sw * last) or near(sw * last) or near(sum(sl * b for b in early) + sw * last):
        return ": each line through two measurements has a fixed cost too (its value at 0 bytes)"
    if near(launches + fl + sl * last + fw):                     # review r31: the remainder sent unconditionally
        return (": your last bucket holds 0 B, priced at a whole reduce-scatter's fixed cost: is anything "
                "left to send when backward ends?")
    if len(early) > 1 and near(fl + sl * sum(early) + fw + sw * last):     # review r31
        return (": the earlier buckets are priced as one launch: each bucket is a reduce-scatter of its "
                "own, with its own fixed cost")
    if near(launches + fl + sl * last):                          # review r25: the likely slips below
        return ": every bucket priced at its launch alone; the last one is launched and waited at once"
    if any(near(sum(t[2] / t[0] * b for b in early) + t[1] / t[0] * last) for t in lone):
        return (": each bucket priced in proportion to one measurement (a line through 0 bytes); a "
                "collective has a fixed cost too: take the line through both measurements")
    (b1, w1, l1), _ = lone                                       # review r29: three slips more
    if any(near(sum(f_l + sl * b for b in early) + f_w + sw * last) for f_w, f_l in ((w1, l1), (w1, fl), (fw, l1))):
        return (f": a line's fixed cost is its value at 0 bytes, not the small measurement's time: that "
                f"reduce-scatter moved {b1:,} B too; follow the line through both points down to 0 bytes")
    if any(near(launches_of(b * k for b in early) + fw + sw * last * k) for k in (0.25, 4)):
        return ": sizes, bucket_bytes and the measurements are all bytes: price a bucket at its bytes, no factor of 4"
    if early and near(sum(fw + sw * b - fl - sl * b for b in early) + fw + sw * last):
        return (": each earlier bucket priced at its whole time less its launch: the other way round; its "
                "launch runs in your hook and holds backward up, the rest of its transfer hides behind backward")
    if early and near(sum(fw + sw * b for b in early) + fl + sl * last):
        return ": the two lines are swapped: each earlier bucket exposes its launch, the last one its whole time"
    full = [b for b in buckets(sizes, bucket) if b >= bucket] if bucket else []
    if full and len(full) < len(early) + 1 and near(launches_of(full[:-1]) + fw + sw * full[-1]):
        return ": the last, partly filled bucket is missing: it goes out when backward ends, and is exposed"
    if any(near(launches_of(alt[:-1]) + fw + sw * alt[-1]) or near(launches + fw + sw * alt[-1])
           for alt in _other_rules(sizes, bucket)):
        return (": a bucket goes out from the hook whose gradient makes it reach bucket_bytes, so buckets "
                "are not all bucket_bytes long; follow the gradients in their order")
    floor = lambda t, f, s, b: t if b < b1 else f + s * b        # noqa: E731 (review r33 #3: clamped at b1)
    if near(sum(floor(l1, fl, sl, b) for b in early) + floor(w1, fw, sw, last)):
        return (": a bucket smaller than the small measurement was priced at that measurement's time: "
                "the line runs through both points and on down to 0 bytes")
    if early and near(sum(l1 + sw * (b - b1) for b in early) + fw + sw * last):
        return (": the launches were priced on the whole reduce-scatter's slope: the launch times make a "
                "line of their own, with its own slope")
    return ""


def _inputs(sizes, bucket: int, lone) -> str:
    """What the function was given, to redo the sum by hand (review r29 #2): the sizes themselves
    when they are few, the lone reduce-scatters as ``(bytes, seconds whole, seconds to launch)``."""
    shown = f"sizes {list(sizes)}" if len(sizes) <= 8 else f"{len(sizes)} sizes, {sum(sizes):,} B in all"
    points = ", ".join(f"({b}, {w:.4g}, {la:.4g})" for b, w, la in lone)
    return f" (given {shown}, bucket_bytes {bucket}, lone [{points}])"


def _grade(fn, sizes, bucket: int, lone, want: float) -> tuple[str, str]:
    from .lab02_guard import guarded           # this module's functions refuse while fn runs (r15 #3)
    got = call(guarded(fn), list(sizes), bucket, [tuple(x) for x in lone])
    if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isfinite(got):
        return "wrong", returned(got, "seconds (a float)")
    if not math.isclose(got, want, rel_tol=REL):
        return "wrong", (f"returned {got * 1e3:.4g} ms, expected {want * 1e3:.4g} ms" + _inputs(sizes, bucket, lone)
                         + _hint(got, sizes, bucket, lone))
    return "ok", ""


def grade_plan(fn, plan) -> tuple[str, str]:
    """(status, detail) of the learner's function on one planned case of :data:`PLANS`."""
    sizes, bucket, lone, want = plan
    return _grade(fn, sizes, bucket, lone, want)


def _borrowed(fn) -> str:
    """'' for a function of the learner's own, else why not (review r14: importing the grader's
    :func:`exposed` as the answer passed every row): not a plain function (r15 #3:
    ``functools.partial(exposed)`` passed every row), a function of gpumem's, or a source that
    imports gpumem or reaches into the grader (:func:`gpumem.course.lab_reach.first_reach`). A
    function that calls the grader's count as it runs is refused there (:mod:`.lab02_guard`)."""
    import inspect
    import textwrap
    import types
    if type(fn) is not types.FunctionType:
        return (f"it is {kind(fn)}, not a function: define predict_exposed_seconds with `def` in a cell "
                "and count the seconds in it")
    if str(getattr(fn, "__module__", "") or "").split(".")[0] == "gpumem":
        return f"it is gpumem's own {fn.__module__}.{getattr(fn, '__name__', '?')}: write the prediction yourself"
    try:
        source = textwrap.dedent(lab_bare.source(fn))
    except (OSError, TypeError):
        return ""
    return first_reach(source) or ("it imports gpumem: write the prediction yourself" if "gpumem" in source else "")


def draw_buckets(rng: random.Random) -> list[int]:
    """This check's two bucket sizes for the run's rows, one from each range of :data:`DRAWN`."""
    return [rng.randrange(lo, hi) for lo, hi in DRAWN]


def grade(report: Report, fn, lone: dict | None, rng: random.Random | None = None) -> None:
    """Rows for the planned numbers, then (when the ranks ran) for this run's measurements."""
    if fn is None:
        report.rows.append(Row(PREDICT, "planned numbers", "todo", f"{PREDICT} is still to write"))
        return
    borrowed = _borrowed(fn)
    if borrowed:
        report.rows.append(Row(PREDICT, "your own function", "wrong", borrowed))
        return
    for k, plan in enumerate(PLANS, 1):
        row = run_case(report, PREDICT, f"planned numbers {k}: bucket {plan[1]:,} B", lambda: grade_plan(fn, plan))
        if row.status != "ok":
            return
    if lone is None:
        report.rows.append(Row(PREDICT, "this run's reduce-scatters", "error",
                               "the ranks did not run (see Part 1's rows), so nothing was timed"))
        return
    sizes = [4 * n for n in reversed(lab02_measure.model_numel())]   # backward's order, roughly
    points = lab02_measure.points(lone)
    for bucket in draw_buckets(rng or seeds.rng()):
        run_case(report, PREDICT, f"the sweep model's {sum(sizes) / 1e6:.1f} MB, bucket {bucket:,} B, on this "
                 f"run's lone reduce-scatters ({lone['threads']} thread a rank, {lone['cores']} cores)",
                 lambda b=bucket: _grade(fn, sizes, b, points, exposed(sizes, b, points)))
