"""Libraries as graded code found them: the fresh grading process's last check (:mod:`.lab_fresh`).

:mod:`.lab_patches` reads the carried source for assignments to a library's objects, but a name can
reach a library's object in ways no reading sees (review r18 of lab 02: ``math.isclose`` replaced
through an object a call returned, and the grader's comparison then said yes to anything). So the
process also looks at the result: :func:`take` records, before any learner code runs, what every
loaded module's namespace binds (and the namespaces of ``torch.Tensor``, ``torch.nn.Module`` and
gpumem's classes), and the contents of gpumem's own lists, dicts and sets (a guard's table of
blocked functions, review r18 of lab 05); :func:`changed` names the first difference once the check
has graded. A difference voids the grade: the grader ran against a library the learner's code
changed. What counts: in gpumem's modules and in ``builtins``, ``math``, ``operator`` and
``statistics`` every name (an added one too, in gpumem's: it could shadow a builtin the grader
calls); elsewhere the functions, classes and modules a name binds (a library's own data changes as
it runs), less a library's own wrapper of what was there. New modules and caches that grow are not
changes; replacing or removing what was there is.
"""

import dataclasses
import sys
import types

from . import genuine

_OWN = "gpumem."
_STRICT = ("builtins", "math", "cmath", "operator", "statistics")    # every name counts, data too
_CLASSES = ("torch.Tensor", "torch.nn.Module")
_SKIP = frozenset({"__warningregistry__", "__loader__", "__spec__", "__builtins__"})
_CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, types.ModuleType,
         staticmethod, classmethod, property)


def _strict(module: str) -> bool:
    return module.startswith(_OWN) or module in _STRICT


def _watched(module: str, value) -> bool:
    """Elsewhere only code counts (functions, classes, modules): a library's own data changes as it
    runs (torch's counters, flags set on first use, ``tempfile``'s name sequence)."""
    return _strict(module) or issubclass(type(value), _CODE)    # type(): no object's __class__ is asked


def _wraps(new, old) -> bool:
    """A library's own wrapper of what was there, made as it runs (importing ``torch._dynamo`` wraps
    ``torch.manual_seed``; the first optimizer wraps its class's ``step``): its ``__wrapped__`` is the
    old value and its code is its file's (:func:`.genuine.genuine`), not a cell's."""
    code = getattr(new, "__code__", None)
    return getattr(new, "__wrapped__", None) is old and code is not None and genuine.genuine(code)


def _classes() -> list[tuple[str, type]]:
    found = []
    for dotted in _CLASSES:
        module, _, name = dotted.rpartition(".")
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            found.append((dotted, cls))
    for mname, module in list(sys.modules.items()):
        if mname.startswith(_OWN):
            found += [(f"{mname}.{k}", v) for k, v in list(vars(module).items())
                      if issubclass(type(v), type) and getattr(v, "__module__", None) == mname]
    return found


class _Fields(tuple):
    """A dataclass entry as recorded: the instance, then its field values."""


def _fields(value):
    """A dataclass instance's field values (compared one by one, review r21 of lab 05: a frozen
    ``Recipe`` in gpumem's table re-initialised in place kept its identity), else the value itself."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _Fields((value, *(object.__getattribute__(value, f.name) for f in dataclasses.fields(value))))
    return value


def _contents(value):
    """A shallow copy of a list, dict or set of gpumem's (compared entry by entry, a dataclass entry
    field by field), else None."""
    kind = type(value)
    if issubclass(kind, list):
        return [_fields(v) for v in value]
    if issubclass(kind, dict):
        return {k: _fields(v) for k, v in dict.items(value)}
    if issubclass(kind, (set, frozenset)):
        return set(value)
    return None


def take(contents: bool = True) -> dict:
    """What each loaded module and watched class binds now (references kept, so nothing is reused);
    ``contents=False`` leaves out gpumem's lists, dicts and sets (lab 02's ranks, whose grader fills
    its own tables while it grades; its seal watches those modules there)."""
    spaces = {name: (vars(module), {k: v for k, v in list(vars(module).items())
                                    if k not in _SKIP and _watched(name, v)})
              for name, module in list(sys.modules.items())
              if isinstance(getattr(module, "__dict__", None), dict)}
    classes = {name: (cls, {k: v for k, v in vars(cls).items() if _watched(name, v)})
               for name, cls in _classes()}
    held = {f"{name}.{k}": (v, _contents(v)) for name, (_, d) in spaces.items() if name.startswith(_OWN)
            for k, v in d.items() if contents and _contents(v) is not None}
    return {"spaces": spaces, "classes": classes, "held": held, "defaults": _defaults(spaces, classes)}


def _defaults(spaces: dict, classes: dict) -> dict:
    """gpumem's functions (module-level and in its classes) with their default arguments as they
    are: review r22 of lab 05 swapped ``grad_swap.exposed_seconds.__defaults__`` through
    ``unittest.mock`` (the function itself unchanged)."""
    found = {}
    for name, (_, d) in list(spaces.items()) + list(classes.items()):
        if name.startswith(_OWN):
            for k, v in d.items():
                if type(v) is types.FunctionType:
                    kw = v.__kwdefaults__
                    found[f"{name}.{k}"] = (v, v.__defaults__, kw, dict(kw) if kw is not None else None)
    return found


def _same(a, b) -> bool:
    if type(a) is _Fields:
        return type(b) is _Fields and len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return a is b


def _entry_changed(old, new) -> bool:
    if isinstance(old, list):
        return len(new) < len(old) or any(not _same(a, b) for a, b in zip(old, new))
    if isinstance(old, dict):
        return any(k not in new or not _same(new[k], v) for k, v in old.items())
    return not old <= new


def changed(taken: dict) -> str | None:
    """The first name graded code replaced or removed since :func:`take`, in words; None if none."""
    return next(differences(taken), None)


_KEPT: list = []          # the fresh process's record, for checks after each graded call (:func:`now`)


def keep(taken: dict) -> None:
    """Make ``taken`` the record :func:`now` compares with (the fresh grading process, once)."""
    _KEPT[:] = [taken]


def now() -> str | None:
    """:func:`changed` against the kept record, right after a graded call (about 6 ms; review r20 of
    lab 05 swapped a library's table during one call and put it back in the next); None when no
    record is kept (a kernel, the course's tests) or nothing changed."""
    return changed(_KEPT[0]) if _KEPT else None


def differences(taken: dict):
    """Every name replaced, removed (or, in gpumem's modules, added) since :func:`take`, in words."""
    for name, (space, before) in taken["spaces"].items():
        for key, value in before.items():
            if key not in space:
                yield f"{name}.{key} was removed"
            elif space[key] is not value and not _wraps(space[key], value):
                yield f"{name}.{key} was replaced"
        if name.startswith(_OWN):
            for key in set(space) - set(before) - _SKIP:
                if not (isinstance(space[key], types.ModuleType) and space[key].__name__ == f"{name}.{key}"):
                    yield f"{name}.{key} was added"
    yield from class_differences(taken)
    for name, (fn, defaults, kw, kw_copy) in taken.get("defaults", {}).items():
        if fn.__defaults__ is not defaults or fn.__kwdefaults__ is not kw or (kw is not None and kw != kw_copy):
            yield f"the default arguments of {name} were changed"
    for name, (value, before) in taken["held"].items():
        if _entry_changed(before, _contents(value)):
            yield f"the contents of {name} were changed"
    if wrong := _aten_wrong():
        yield f"torch's {wrong} no longer computes what it should (a kernel re-registered?)"


def class_differences(taken: dict):
    """The watched classes' part of :func:`differences` alone (``torch.Tensor``, ``nn.Module``,
    gpumem's classes): cheap enough for lab 02's ranks to check at every gradient's arrival."""
    for name, (cls, before) in taken["classes"].items():
        now = vars(cls)
        for key, value in before.items():
            if key not in now or (now[key] is not value and not _wraps(now[key], value)):
                yield f"{name}.{key} was replaced or removed"
        if name in _CLASSES or name.startswith(_OWN):
            for key in set(now) - set(before) - {"__slotnames__"}:     # copyreg's cache, set by a copy
                if _watched(name, now[key]):
                    yield f"{name}.{key} was added"


def _aten_wrong() -> str | None:
    """The first of the ops graders compare with that gives a wrong answer on two small tensors, or
    None: names say nothing about torch's dispatcher, where a kernel can be registered over aten's
    own (review r19 of lab 04: ``Tensor.all`` made to say True to anything)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    a, b = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, 3.0], dtype=torch.float64)
    checks = (("all", lambda: bool((a == b).all()) is False), ("any", lambda: bool((a != a).any()) is False),
              ("eq", lambda: (a == b).tolist() == [True, False]),
              ("isclose", lambda: torch.isclose(a, b).tolist() == [True, False]),
              ("allclose", lambda: torch.allclose(a, b) is False), ("equal", lambda: torch.equal(a, b) is False),
              ("sub, abs and max", lambda: float((a - b).abs().max()) == 1.0),
              ("sum", lambda: float(a.sum()) == 3.0), ("matmul", lambda: float(a @ b) == 7.0))
    for name, ok in checks:
        try:
            if not ok():
                return name
        except Exception:                  # noqa: BLE001 -- an op that raises is wrong too
            return name
    return None
