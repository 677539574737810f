"""The graders' fresh draws: a seed nobody chose, from the operating system, as Python's C code reads it.

A lab's check draws its cases from a fresh seed, so a table of answers made before the check
cannot match them. Review r13 (lab 03): a cell replaced ``os.urandom`` with a function returning
zeros, every check then drew seed 0, and answers worked out beforehand from the grader's own modules
passed every row. :func:`problem` says, and :func:`rng` refuses (:class:`Tampered`), when

* ``os.urandom`` is not the operating system module's own C function (``posix.urandom`` or
  ``nt.urandom``, a builtin named ``urandom``): a Python function, a lambda or ``bytes`` standing in
  for it is refused;
* ``random.Random`` is not the standard library's class: a method of it, or of a class standing
  in for it, that is not the code ``random.py`` defines (:func:`gpumem.course.genuine.genuine`),
  such as ``random.Random.seed = lambda self, a=None: ...``.

The C type under ``random.Random`` cannot be changed from Python. Without a seed, the seed is 8
bytes of ``os.urandom``. :func:`gpumem.course.grader_seal.refuse_if_changed` asks :func:`problem`
too, before and after every check.
"""

import importlib.util
import os
import random
import sys
import types
from functools import lru_cache

from . import genuine

_OS = sys.modules["nt" if os.name == "nt" else "posix"]


class Tampered(RuntimeError):
    """What a grader draws with was replaced in this kernel."""


def _urandom_problem() -> str:
    f = os.urandom
    if isinstance(f, types.BuiltinFunctionType) and f.__name__ == "urandom" and f.__self__ is _OS \
            and getattr(_OS, "urandom", None) is f:
        return ""
    return "os.urandom was replaced (the checks' fresh seeds come from it)"


def _random_problem() -> str:
    """'' when ``random.Random`` is the class ``random.py`` defines: the same members as a fresh run
    of that file, each of the same kind, each function the file's own code (review r15 of lab 03: a
    descriptor put in place of ``Random.seed`` has no code of its own, and passed a check of codes)."""
    live, fresh = random.Random, _fresh_random()
    import _random
    if live.__bases__ != (_random.Random,) or live.__qualname__ != "Random" or live.__module__ != "random":
        return f"random.Random was replaced ({live.__module__}.{live.__qualname__} in its place)"
    mine, theirs = vars(live), vars(fresh)
    if set(mine) != set(theirs):
        extra = sorted(set(mine) ^ set(theirs))
        return f"random.Random.{extra[0]} was added or removed (the checks draw their cases with it)"
    for name, member in mine.items():
        other = theirs[name]
        code = getattr(member, "__code__", None) or getattr(getattr(member, "__func__", None), "__code__", None)
        if type(member) is not type(other) or (code is not None and not genuine.genuine(code)) or \
                (isinstance(member, (str, int, float, tuple)) and member != other and name != "__module__"):
            return f"random.Random.{name} was replaced (the checks draw their cases with it)"
    return ""


@lru_cache(maxsize=1)
def _fresh_random() -> type:
    """``random.Random`` from a fresh run of the standard library's own ``random.py``."""
    spec = importlib.util.spec_from_file_location("_gpumem_fresh_random", random.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Random


def problem() -> str:
    """'' when the draws' sources are the interpreter's own, else what was replaced."""
    return _urandom_problem() or _random_problem()


def rng(seed: int | None = None) -> random.Random:
    """A generator from ``seed``, or from 8 fresh bytes of ``os.urandom`` when None; refuses a
    replaced ``os.urandom`` or ``random.Random`` (module docstring)."""
    said = problem()
    if said:
        raise Tampered(f"this kernel changed what the grader draws with: {said}; restart the kernel "
                            "and run the lab's cells again")
    return random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
