"""A learner's answer as plain values, read while the lab's guard still watches.

Review r9 (labs 05 and 06) passed most rows with no counting at all: an ``int`` subclass whose
``!=`` is always False, a ``float`` whose subtraction returns 0, a ``str`` equal to anything, a
``dict`` that fills itself with the library's answer when the grader first reads it (after the
guard is off). :func:`plain` rebuilds the value from the built-in types' own slots (``int.__add__``,
``dict.items``...), so no method of the learner's classes runs after it, and it runs inside the
guard, so a lazy value computed on reading is computed under the guard's refusals.

Kept: ``None``, ``bool``, exact built-ins (rebuilt), numpy's own scalars (as Python values), and
instances of gpumem's own dataclasses (a ``Finetune``, a planner ``Layout``), rebuilt as that class
from their fields. Anything else is refused with a line saying what was returned and what is
accepted (:class:`NotPlain`).
"""

import dataclasses
import sys

DEPTH = 12


class NotPlain(TypeError):
    """The answer holds a value of a type the graders do not take."""


def _gpumem_dataclass(cls):
    """The first of ``cls``'s classes (itself or a base) that is a dataclass defined by gpumem."""
    return next((c for c in cls.__mro__ if dataclasses.is_dataclass(c) and isinstance(c, type)
                 and c.__module__.startswith("gpumem.") and "__dataclass_fields__" in c.__dict__), None)


def plain(value, depth: int = 0):
    """``value`` rebuilt from exact built-in types (and gpumem dataclasses), read now."""
    if depth > DEPTH:
        raise NotPlain(f"the answer is nested more than {DEPTH} levels deep")
    kind = type(value)
    if value is None or kind is bool:      # bool cannot be subclassed
        return value
    np = sys.modules.get("numpy")
    if np is not None and issubclass(kind, np.generic) and kind.__module__ == "numpy":   # np.int64 from a sum
        return plain(np.generic.item(value), depth + 1)     # numpy's own types only: a subclass is not
    if isinstance(value, int):
        return int.__add__(value, 0)
    if isinstance(value, float):
        return float.__add__(value, 0.0)
    if isinstance(value, str):
        return str.__str__(value)          # an exact copy for a subclass: its methods are not called
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in dict.items(value)}
    if isinstance(value, list):
        return [plain(v, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        items = [plain(v, depth + 1) for v in tuple.__iter__(value)]
        named = next((c for c in kind.__mro__ if "_fields" in c.__dict__ and c.__module__.startswith("gpumem.")), None)
        if named is not None:
            return named._make(items)
        if kind is tuple or "_fields" not in dir(kind):
            return tuple(items)
    base = _gpumem_dataclass(kind)
    if base is not None:
        fields = {f.name: plain(object.__getattribute__(value, f.name), depth + 1)
                  for f in dataclasses.fields(base) if f.init}
        return base(**fields)
    raise NotPlain(f"the answer holds a {kind.__module__}.{kind.__qualname__}: return plain values "
                   "(int, float, str, bool, None, dict, list, tuple) or the course's own objects")


def read_now(value):
    """:func:`plain` of ``value``; where that refuses, ``value`` itself unless it is a subclass of a
    built-in container (whose methods could read the answer later): a NumPy array or a tensor stays
    as it is, for the grader's own type check to name (lab 01, review r20)."""
    try:
        return plain(value)
    except NotPlain:
        if isinstance(value, (dict, list, tuple)) and type(value) not in (dict, list, tuple):
            raise
        return value


def odd_tensor(value, depth: int = 0) -> str:
    """'' or why ``value`` (an answer holding tensors: tuples, lists, dicts of them) holds a tensor
    that is not a plain ``torch.Tensor`` (review r20 of lab 04: a subclass made with ``type(...)``
    whose ``__torch_function__`` answered True to the grader's ``.all()`` passed zero gradients)."""
    torch = sys.modules.get("torch")
    if torch is None or depth > DEPTH:
        return ""
    kind = type(value)
    if isinstance(value, torch.Tensor):
        return "" if kind is torch.Tensor else (
            f"a tensor you gave back is a {kind.__qualname__}, a subclass of torch.Tensor: give back plain "
            "torch.Tensor values (a subclass decides what the grader's comparisons read)")
    items = dict.values(value) if isinstance(value, dict) else \
        list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value) if isinstance(value, tuple) else ()
    return next((why for v in items if (why := odd_tensor(v, depth + 1))), "")

