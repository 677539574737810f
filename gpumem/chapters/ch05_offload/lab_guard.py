"""Lab 05's guard: while one call of the learner's runs, gpumem's own counts refuse ("count it yourself").

The refused functions (:data:`.lab_reference.BLOCKED`, and the lab's reference answers
:func:`.lab_reference.rung_bytes` and :func:`.lab_reference.choose`) get their ``__code__`` swapped
for one that raises, as lab 06's guard does (``ch06_combining_strategies/lab06_guard.py``): the
function object stays the same, so a reference the learner kept before grading -- a name imported
from the module, an alias in another module, a default argument captured when the cell ran
(``def choose_rung(..., _c=ref.choose)``) -- refuses too. The time engine counts its traffic with
``accounting.model_states``: calls from :data:`.lab_reference.ALLOWED_CALLERS` go through to the
original code. Everything is put back after the call, with SIGALRM held back while it is (as
lab 03's guard does), so the case's time limit cannot interrupt the restore.

What it cannot stop: answers computed before grading and stored as data, or another process.
"""

import contextlib

from . import lab_reference as ref
from gpumem.course.case_limits import alarm_held

PASS = "__lab05_original_{}__"       # the original function, kept in its module's globals meanwhile


def targets() -> list:
    """The functions refused while the learner's code runs."""
    found = [getattr(m, a) for m, a in ref.BLOCKED if hasattr(m, a)] + [ref.rung_bytes, ref.choose]
    return [f for f in found if hasattr(f, "__code__") and not f.__code__.co_freevars]


def _refusing_code(fn):
    """A code object that hands the call to the original when the time engine calls, else raises."""
    key = PASS.format(fn.__name__)
    scope: dict = {}
    exec(f"def refuse(*args, **kwargs):\n"
         f"    import sys\n"
         f"    if sys._getframe(1).f_globals.get('__name__') in {sorted(ref.ALLOWED_CALLERS)!r}:\n"
         f"        return {key}(*args, **kwargs)\n"
         f"    raise RuntimeError({ref.REFUSAL!r})\n", scope)
    return scope["refuse"].__code__, key



@contextlib.contextmanager
def no_library_counts():
    """Inside the block every function of :func:`targets` refuses; restored after, also when the
    learner's call raises or runs out of time."""
    import types
    saved = []
    try:
        with alarm_held():
            for fn in targets():
                code, key = _refusing_code(fn)
                fn.__globals__[key] = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__,
                                                         fn.__defaults__, fn.__closure__)
                fn.__globals__[key].__kwdefaults__ = fn.__kwdefaults__
                saved.append((fn, fn.__code__, key))
                fn.__code__ = code
        yield
    finally:
        with alarm_held():
            for fn, code, key in saved:
                fn.__code__ = code
                fn.__globals__.pop(key, None)


def guarded(fn):
    """``fn`` wrapped so that each call runs under :func:`no_library_counts`."""
    def run(*args, **kwargs):
        with no_library_counts():
            return fn(*args, **kwargs)
    return run

