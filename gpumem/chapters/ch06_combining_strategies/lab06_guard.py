"""Lab 06's guard: while the learner's ``choose_plan`` runs, the planner's own search refuses.

The lab hands out the time engine's pieces -- ``Layout``, ``planner.memory.per_gpu`` (bytes of one
layout), ``planner.cost.step_seconds`` (seconds of one layout), ``planner.rules`` (which framework
runs what), ``planner.hybrid``, ``gpumem.timing`` -- and asks for the search. The search's entry
points (:data:`BLOCKED`) are switched off by swapping each function's code object for one that
raises ``RuntimeError("write the search yourself: <name> is off while lab 06 is graded")``.
Swapping the code (not rebinding a module attribute) also catches a reference the learner saved
before grading (``my_plan = planner.plan``), ``from gpumem.planner.search import plan`` bindings
in other modules, and the library's own helpers that search through them (``planner.evaluate``,
the chapter's widget, ``advice``, ``explain``: they search through ``plan``). The pieces above call none of them, so they keep working.

The grader's own answers are never computed before or during the learner's call (``labcheck``
prices the reference after it), and :func:`active` lets the grader's helpers refuse while it runs;
the GPU part's own timing (``lab06_gpu.reference_flops``) is switched off too.

What it cannot stop: a learner who starts another Python process (``python -m gpumem plan``);
the lab is for self-study, and the prompt says the search is the exercise.
"""

import importlib
from contextlib import contextmanager

from gpumem.planner import ranking, search

from . import lab06_gpu

evaluate = importlib.import_module("gpumem.planner.evaluate")   # the package exports the function

MESSAGE = "write the search yourself: {} is off while lab 06 is graded"

# (name the learner reads in the message, function): the planner's search entry points
BLOCKED = (("planner.plan", search.plan), ("planner.search.answer", search.answer),
           ("planner.search.candidates", search.candidates), ("planner.search.layouts_of", search.layouts_of),
           ("planner.search.fits_any", search.fits_any), ("planner.search._inner", search._inner),
           ("planner.ranking.rank", ranking.rank),
           ("planner.ranking.rank_of", ranking.rank_of), ("planner.evaluate", evaluate.evaluate),
           ("lab06_gpu.reference_flops", lab06_gpu.reference_flops))
_ACTIVE = [0]          # > 0 while the learner's function runs


def _functions():
    """(name, function) of every blocked function."""
    yield from BLOCKED


def _refusing_code(name: str, fn):
    """A code object with ``fn``'s free variables that raises the lab's message (a generator's too)."""
    if fn.__code__.co_freevars:          # never for the listed module-level functions; kept safe
        return None
    scope: dict = {}
    exec(f"def refuse(*args, **kwargs):\n    raise RuntimeError({MESSAGE.format(name)!r})\n", scope)
    return scope["refuse"].__code__


@contextmanager
def no_search():
    """Inside the block every function of :data:`BLOCKED` raises the lab's message; restored after,
    also when the learner's call raises or runs out of time."""
    saved, entered = [], False
    try:
        for name, fn in _functions():
            code = _refusing_code(name, fn)
            if code is not None:
                saved.append((fn, fn.__code__))
                fn.__code__ = code
        _ACTIVE[0], entered = _ACTIVE[0] + 1, True
        yield
    finally:
        _ACTIVE[0] -= entered
        for fn, code in saved:
            fn.__code__ = code


def active() -> bool:
    """True while :func:`no_search` is in force (the grader's helpers refuse then)."""
    return _ACTIVE[0] > 0


def refuse_if_active(name: str) -> None:
    """Raise the lab's message when called from inside the learner's function."""
    if active():
        raise RuntimeError(MESSAGE.format(name))


def blocked_names() -> list[str]:
    """The names :func:`no_search` switches off (for the lab's text and the tests)."""
    return [name for name, _ in _functions()]
