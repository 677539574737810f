"""The grading machinery's fingerprint, so that a lab cannot be "solved" by changing the grader.

A lab runs in the learner's own kernel, so any cell can reach the grader: one line such as
``grading.Report.solved = property(lambda s: True)`` made every lab report "solved". At import,
this module records what grading rests on (the members of :class:`~gpumem.course.grading.Report`
and :class:`~gpumem.course.grading.Row`, the grading functions and the time limits, by identity
and code object); :func:`changed` lists what differs now. ``gpumem.chapters.check_lab`` refuses to
grade in a changed kernel, before the check and after it (a learner's function may change the
grader while it runs). It also compares every function of every loaded gpumem module, and each
wrapper around it, with the code compiled afresh from its file (:mod:`.genuine`): replacing
``labcheck._grade_states``, ``copy_watch.Prints.match`` (review r7) or a ``__code__``, or wrapping
``offload_time.step_time`` in a ``functools.wraps`` recorder (review r8), is refused. The chapters'
lab modules' tables are compared with a fresh run of their file (review r8: ``BLOCKED.clear()``
switched a guard off), and no trace or profile hook may be set when grading starts or ends
(:func:`hooks`: r8's ``sys.settrace`` rewrote the grader's variables). This closes the cheap
patches; code determined to defeat a grader that runs in its own process can also change this
module, which is why instructors grade from a fresh kernel.
"""

import ast
import inspect
import sys
import threading
import types
from functools import lru_cache
from pathlib import Path

from . import case_limits, genuine, grading, seeds
from .flop_seal import _counter_marks, counter_problem  # noqa: F401 -- counter_problem: the seal's API

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
    marks.update(_counter_marks())
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
                    "gpumem.course.copy_watch", "gpumem.course.copy_signature", "gpumem.course.lab_audit",
                    "gpumem.course.genuine", "gpumem.course.lab_history", "gpumem.course.lab_reach",
                    "gpumem.course.lab_process", "gpumem.course.flop_seal", "gpumem.course.seeds",
                    "gpumem.course.lab_fresh", "gpumem.course.lab_carry", "gpumem.course.lab_vet",
                    "gpumem.course.lab_patches", "gpumem.course.lab_watch", "gpumem.course.lab_file",
                    "gpumem.course.lab_kernel",
                    __name__)


def _bound(module, qualname: str):
    """The object a qualified name reaches in the module now (through classes, properties and
    static/class methods); None where it reaches none."""
    obj = module
    for part in qualname.split("."):
        obj = vars(obj).get(part) if isinstance(obj, type) else getattr(obj, part, None)
        if isinstance(obj, property):
            obj = obj.fget
        elif isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
    return obj


def _runs_the_files_code(fn, path: str, codes: tuple) -> bool:
    """``fn`` (through its decorators) is one of ``codes``, or genuine code of another file (a name
    imported from elsewhere), and every wrapper around it is genuine too."""
    if not genuine.wrappers_genuine(fn):
        return False
    live = getattr(inspect.unwrap(fn), "__code__", None)
    if live is None:
        return False
    if live.co_filename != path:
        return genuine.genuine(live)
    return any(genuine.same(live, code) for code in codes)


def _module_changes(module) -> list[str]:
    path = getattr(module, "__file__", None)
    if not path or not Path(path).is_file():
        return []
    out = []
    for qual, codes in genuine.file_codes(path).items():
        if "<" in qual:              # lambdas, comprehensions, nested defs: checked inside their parent
            continue
        fn = _bound(module, qual)
        if fn is None and "." in qual:
            continue                 # a method defined on a class made inside a function
        if isinstance(fn, type):     # a class body: the class must be the module's own
            if (fn.__module__, fn.__qualname__) != (module.__name__, qual):
                out.append(f"{module.__name__}.{qual}")
            continue
        if fn is None or not callable(fn) or not _runs_the_files_code(fn, path, codes):
            out.append(f"{module.__name__}.{qual}")
    return out


# --- the lab modules' data: tables such as a guard's list of refused functions ---
_BY_IDENTITY = (types.FunctionType, types.CodeType, types.ModuleType, types.BuiltinFunctionType, type)


def _plain(value, depth: int = 0) -> bool:
    """Data the file's own run makes alike each time: numbers, strings, containers of them, and
    functions, code, modules and classes (compared by code or identity: :func:`_eq`)."""
    if depth > 6:
        return False
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, *_BY_IDENTITY)):
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, (dict, types.MappingProxyType)):        # a read-only table too (review r18)
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _eq(live, fresh, path: str) -> bool:
    """Same data: functions and code the file defines by their code (a fresh run makes new
    objects), anything else from elsewhere by identity, containers item by item."""
    if not _same_type(type(live), type(fresh)):
        return False
    if isinstance(fresh, types.FunctionType):
        fresh, live = fresh.__code__, live.__code__
    if isinstance(fresh, types.CodeType):
        return genuine.same(live, fresh) if fresh.co_filename == path else live is fresh
    if isinstance(fresh, _BY_IDENTITY):
        return live is fresh or (isinstance(fresh, type) and _same_type(live, fresh))
    if isinstance(fresh, (tuple, list)):
        return len(live) == len(fresh) and all(_eq(x, y, path) for x, y in zip(live, fresh))
    if isinstance(fresh, (dict, types.MappingProxyType)):
        return len(live) == len(fresh) and _covers(live, fresh, path)
    return live == fresh


def _pure(tree: ast.Module) -> bool:
    """Top-level statements that only import, define and assign (no call run for its effect, such
    as installing an audit hook): executing the file again changes nothing outside it."""
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
               ast.Assign, ast.AnnAssign)
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) \
        and isinstance(tree.body[0].value, ast.Constant) else tree.body
    return all(isinstance(node, allowed) and all(_plain_decorator(d) for d in getattr(node, "decorator_list", ()))
               for node in body)


def _plain_decorator(node: ast.expr) -> bool:
    """A decorator that only wraps (a registering one, e.g. lab 05's ``keep``, would register
    the fresh run's functions in the live tables)."""
    node = node.func if isinstance(node, ast.Call) else node
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in _WRAPPING


_WRAPPING = frozenset({"lru_cache", "cache", "dataclass", "contextmanager", "total_ordering", "wraps",
                       "cached_property", "property", "staticmethod", "classmethod"})


@lru_cache(maxsize=128)
def _fresh_data(path: str, mtime: float, name: str, package: str) -> tuple:
    """(name, value) of the plain, non-empty module-level data the file makes when run afresh
    (empty containers are caches and state, filled while the kernel runs)."""
    source = Path(path).read_text()
    tree = ast.parse(source)
    if not _pure(tree):
        return ()
    ns = {"__name__": name, "__package__": package, "__file__": path, "__builtins__": __builtins__}
    try:
        exec(compile(tree, path, "exec"), ns)
    except Exception:                    # noqa: BLE001 - a file that cannot run afresh is not compared
        return ()
    skip = set(ns.get("_UNSEALED", ()))      # the file's own list of names that depend on the kernel
    return tuple((k, v) for k, v in ns.items() if not k.startswith("__") and k not in skip and _plain(v)
                 and not (isinstance(v, (list, dict, set)) and not v))


def _data_changes(module) -> list[str]:
    path = getattr(module, "__file__", None)
    if not path or not Path(path).is_file():
        return []
    fresh = _fresh_data(path, Path(path).stat().st_mtime, module.__name__, module.__package__ or "")
    missing = object()
    return [f"{module.__name__}.{k}" for k, v in fresh if not _covers(getattr(module, k, missing), v, path)]


def _same_type(a: type, b: type) -> bool:
    """The same class, or the class of the same name the file's fresh run made (a NamedTuple)."""
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def _covers(live, fresh, path: str) -> bool:
    """``live`` still holds what the file made: equal, or for a table the kernel extends (a dict,
    list or set that modules add to when they load), every original entry unchanged."""
    if not _same_type(type(live), type(fresh)):
        return False
    if isinstance(fresh, (dict, types.MappingProxyType)):
        return all(k in live and _eq(live[k], v, path) for k, v in fresh.items())
    if isinstance(fresh, list):
        return _eq(live[:len(fresh)], fresh, path)
    if isinstance(fresh, set):
        return fresh <= live
    return _eq(live, fresh, path)


def changed() -> list[str]:
    """Names in the grading machinery that are not what was imported (empty: untouched): the
    Report and Row classes and grading functions by identity; every function of gpumem's loaded
    modules by its code (and its wrappers') against the file's, so a wrapper recording what the
    grader computes is seen too; and the chapters' lab modules' tables against the file's."""
    now = _marks()
    names = [k for k in _SEALED.keys() | now.keys() if _SEALED.get(k) is not now.get(k)
             and (k in _SEALED or not k.startswith("flop_registry["))]   # a formula torch registers later
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "gpumem" or name.startswith("gpumem.")):
            continue
        names += _module_changes(module)
        if _is_lab_module(name):
            names += _data_changes(module)
    return sorted(set(names))


def hooks() -> list[str]:
    """Trace and profile hooks set in this kernel (none is set while no lab is graded; the guards
    set their own only around a learner's call): a hook can rewrite the grader's variables."""
    found = [("sys.settrace", sys.gettrace()), ("threading.settrace", threading.gettrace()),
             ("sys.setprofile", sys.getprofile()), ("threading.setprofile", threading.getprofile())]
    return [name for name, hook in found if hook is not None]


def refuse_if_changed(lab: str) -> None:
    """Raise :class:`GraderChanged` naming what changed, or the hook that is set; restarting the
    kernel restores it."""
    names = changed() + [said for said in (seeds.problem(), counter_problem()) if said]   # review r13
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise GraderChanged(f"{lab}: not graded: the grader was changed in this kernel ({shown}); "
                            "restart the kernel (Kernel > Restart), run your cells, then check again")
    set_hooks = hooks()
    if set_hooks:
        raise GraderChanged(f"{lab}: not graded: a trace or profile hook is set ({', '.join(set_hooks)}: "
                            "a debugger, or code in a cell); switch it off or restart the kernel, "
                            "then check again")
