"""The grading machinery's fingerprint, so that a lab cannot be "solved" by changing the grader.

A lab runs in the learner's own kernel, so any cell can reach the grader: one line such as
``grading.Report.solved = property(lambda s: True)`` made every lab report "solved". At import,
this module records what grading rests on (the members of :class:`~gpumem.course.grading.Report`
and :class:`~gpumem.course.grading.Row`, the grading functions and the time limits, by identity
and code object); :func:`changed` lists what differs now. ``gpumem.chapters.check_lab`` refuses to
grade in a changed kernel, before the check and after it (a learner's function may change the
grader while it runs). It also compares every function the chapters' lab modules define (``labcheck``,
``labguard``, ``lab_*``: loaded ones) and the guards' shared copy watch (``copy_watch``, methods of
its classes included) with the code compiled afresh from their files, so replacing
``labcheck._grade_states``, a guard's function or ``copy_watch.Prints.match`` (review r7: one line
that blinded labs 04-06's copy checks), or its ``__code__``, is refused too. This closes
the cheap patches; code determined to defeat a grader that runs in its own process can also change
this module, which is why instructors grade from a fresh kernel.
"""

import inspect
import sys
import types
from functools import lru_cache
from pathlib import Path

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


# --- the chapters' lab modules: every function they define must still run the file's own code ---
def _is_lab_module(name: str) -> bool:
    parts = name.split(".")
    return (len(parts) == 4 and parts[:2] == ["gpumem", "chapters"] and parts[3].startswith("lab")) \
        or name in ("gpumem.chapters", "gpumem.course.grading", "gpumem.course.case_limits",
                    "gpumem.course.copy_watch", "gpumem.course.copy_signature", "gpumem.course.lab_audit", __name__)


@lru_cache(maxsize=64)
def _file_codes(path: str, mtime: float) -> dict[str, types.CodeType]:
    """Qualified name -> code object of every function the file defines (compiled afresh)."""
    codes: dict[str, types.CodeType] = {}

    def walk(code: types.CodeType) -> None:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                codes.setdefault(const.co_qualname, const)
                walk(const)
    walk(compile(Path(path).read_text(), path, "exec"))
    return codes


def _same(a: types.CodeType, b: types.CodeType) -> bool:
    """Same bytecode, names and constants (nested functions compared the same way)."""
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars) != (b.co_code, b.co_names, b.co_varnames, b.co_freevars):
        return False
    ca, cb = a.co_consts, b.co_consts
    return len(ca) == len(cb) and all(
        _same(x, y) if isinstance(x, types.CodeType) and isinstance(y, types.CodeType) else
        (type(x) is type(y) and x == y) for x, y in zip(ca, cb))


def _bound(module, qualname: str):
    """The function a qualified name reaches in the module now (through classes, properties,
    static/class methods and decorators' ``__wrapped__``); None where it reaches none."""
    obj = module
    for part in qualname.split("."):
        holder, obj = obj, (vars(obj).get(part) if isinstance(obj, type) else getattr(obj, part, None))
        if isinstance(obj, property):
            obj = obj.fget
        elif isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
    return inspect.unwrap(obj) if callable(obj) else obj


def _module_changes(module) -> list[str]:
    path = getattr(module, "__file__", None)
    if not path or not Path(path).is_file():
        return []
    out = []
    for qual, code in _file_codes(path, Path(path).stat().st_mtime).items():
        if "<" in qual:              # lambdas, comprehensions, nested defs: checked inside their parent
            continue
        fn = _bound(module, qual)
        if fn is None and "." in qual:
            continue                 # a method defined on a class made inside a function
        if isinstance(fn, type):     # a class body: the class must be the module's own
            if (fn.__module__, fn.__qualname__) != (module.__name__, qual):
                out.append(f"{module.__name__}.{qual}")
            continue
        live = getattr(fn, "__code__", None)
        if live is None or not _same(live, code):
            out.append(f"{module.__name__}.{qual}")
    return out


def changed() -> list[str]:
    """Names in the grading machinery that are not what was imported (empty: untouched): the
    Report and Row classes and grading functions by identity, and every function the chapters'
    lab modules define (``labcheck``, ``labguard``, ``lab_*``) by its code against the file's."""
    now = _marks()
    names = [k for k in _SEALED.keys() | now.keys() if _SEALED.get(k) is not now.get(k)]
    for name, module in list(sys.modules.items()):
        if module is not None and _is_lab_module(name):
            names += _module_changes(module)
    return sorted(set(names))


def refuse_if_changed(lab: str) -> None:
    """Raise :class:`GraderChanged` naming what changed; restarting the kernel restores it."""
    names = changed()
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise GraderChanged(f"{lab}: not graded: the grader was changed in this kernel ({shown}); "
                            "restart the kernel (Kernel > Restart), run your cells, then check again")
