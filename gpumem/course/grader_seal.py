"""The grading machinery's fingerprint, so that a lab cannot be "solved" by changing the grader.

A lab runs in the learner's own kernel, so any cell can reach the grader: one line such as
``grading.Report.solved = property(lambda s: True)`` made every lab report "solved". At import,
this module records what grading rests on (the members of :class:`~gpumem.course.grading.Report`
and :class:`~gpumem.course.grading.Row`, the grading functions and the time limits, by identity
and code object); :func:`changed` lists what differs now. ``gpumem.chapters.check_lab`` refuses to
grade in a changed kernel, before the check and after it (a learner's function may change the
grader while it runs). This closes the cheap patches; code determined to defeat a grader that runs
in its own process can also change this module, which is why instructors grade from a fresh kernel.
"""

from . import case_limits, grading

_FUNCTIONS = (grading, ("run_case", "grade", "call", "returned", "failure_line", "kind", "one_line",
                        "error_line", "capped_output", "Report", "Row"))
_LIMITS = (case_limits, ("time_limit", "case_seconds", "alarm_held"))


class GraderChanged(RuntimeError):
    """The grading machinery in this kernel is not the one the course ships."""


def _marks() -> dict[str, object]:
    marks: dict[str, object] = {}
    for cls in (grading.Report, grading.Row):
        for key, value in vars(cls).items():
            marks[f"{cls.__name__}.{key}"] = value
            for part in ("fget", "fset", "__func__"):
                inner = getattr(value, part, None)
                if inner is not None:
                    marks[f"{cls.__name__}.{key}.{part}"] = getattr(inner, "__code__", inner)
            if hasattr(value, "__code__"):
                marks[f"{cls.__name__}.{key}.code"] = value.__code__
    for module, names in (_FUNCTIONS, _LIMITS):
        for name in names:
            value = getattr(module, name, None)
            marks[name] = value
            if hasattr(value, "__code__"):
                marks[f"{name}.code"] = value.__code__
    return marks


_SEALED = _marks()


def changed() -> list[str]:
    """Names in the grading machinery that are not what was imported (empty: untouched)."""
    now = _marks()
    return sorted(k for k in _SEALED.keys() | now.keys() if _SEALED.get(k) is not now.get(k))


def refuse_if_changed(lab: str) -> None:
    """Raise :class:`GraderChanged` naming what changed; restarting the kernel restores it."""
    names = changed()
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise GraderChanged(f"{lab}: not graded: the grader was changed in this kernel ({shown}); "
                            "restart the kernel (Kernel > Restart), run your cells, then check again")
