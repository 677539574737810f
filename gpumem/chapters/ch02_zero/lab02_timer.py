"""Lab 02 Part 2's ``median_step_seconds(step, repeats)``, graded in this process.

The learner's source runs with ``torch``, ``math`` and a stand-in ``dist`` whose ``barrier()`` is
noted (no ranks are needed to check a timer). ``step`` sleeps for planned durations, so the right
answer is known without timing anything: the first call (the warm-up) is long and must not
count; the timed calls include one outlier, so a mean, or a median that takes in the warm-up,
lands far from the median. Each timed call must follow a barrier (both ranks start together).
"""

import math
import time

import torch

TIMER = "median_step_seconds"
# (repeats, seconds of each call, the warm-up first): the timed calls' medians are 0.04 and 0.02 s;
# the first plan's median with the warm-up taken in is 0.06 s, the second's mean 0.046 s
PLANS = ((4, (0.25, 0.02, 0.06, 0.02, 0.06)), (5, (0.30, 0.02, 0.02, 0.16, 0.02, 0.01)))
SLACK_S = 0.015                    # sleep overshoots on a busy machine; the wrong answers are >= 0.02 s away


class _Dist:
    """``dist`` for the timer: ``barrier()`` notes the call number it came before."""

    def __init__(self, calls: list):
        self.calls, self.barriers = calls, []

    def barrier(self, *args, **kwargs):
        self.barriers.append(len(self.calls))

    def get_rank(self):
        return 0

    def get_world_size(self):
        return 2


def grade_one(fn, repeats: int, plan: tuple) -> tuple[str, str]:
    """(status, detail) for the learner's timer ``fn`` (built by :func:`build`) on one plan."""
    calls: list = []
    dist = fn.__globals__["dist"]
    dist.calls, dist.barriers = calls, []

    def step():
        calls.append(time.perf_counter())
        time.sleep(plan[min(len(calls), len(plan)) - 1])
    got = fn(step, repeats)
    want, with_warm_up = _median(plan[1:]), _median(plan)
    if len(calls) != repeats + 1:
        return "wrong", f"step() ran {len(calls)} times for repeats={repeats}: expected one warm-up and {repeats} timed"
    if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isfinite(got):
        return "wrong", f"returned {type(got).__name__} {got!r:.40}: expected the median in seconds (a float)"
    timed = set(range(1, repeats + 1))
    if not timed <= set(dist.barriers):
        return "wrong", ("a timed step() started without dist.barrier() just before it: the ranks must start "
                         "together, or one rank times the other's lateness")
    if abs(got - want) > SLACK_S:
        mean = sum(plan[1:]) / repeats
        hint = (" = the mean: one slow call moves it, the median does not" if abs(got - mean) <= SLACK_S else
                " = the median with the warm-up call in it: leave the warm-up out" if
                abs(got - with_warm_up) <= SLACK_S else " (seconds expected, not milliseconds)" if got > 1 else "")
        return "wrong", f"returned {got:.4f} s, the median of the timed calls is {want:.3f} s{hint}"
    return "ok", f"{got:.3f} s for a median of {want:.3f} s"


def _median(values) -> float:
    v, n = sorted(values), len(values)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def build(source: str):
    """The learner's timer from its source, with ``torch``, ``math`` and the stand-in ``dist``."""
    ns: dict = {"torch": torch, "math": math, "dist": _Dist([])}
    exec(compile(source, f"<your {TIMER}>", "exec"), ns)
    return ns[TIMER]
