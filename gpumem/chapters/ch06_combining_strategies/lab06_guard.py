"""Lab 06's guard: while the learner's ``choose_plan`` runs, the planner's own search refuses.

The lab hands out the time engine's pieces -- ``Layout``, ``planner.memory.per_gpu`` (bytes of one
layout), ``planner.cost.step_seconds`` (seconds of one layout), ``planner.rules`` (which framework
runs what), ``planner.hybrid``, ``gpumem.timing`` -- and asks for the search. The search's entry
points (:data:`BLOCKED`) are switched off two ways, so that undoing one does not switch them on:

* each function's code object is swapped for one that raises ``RuntimeError("write the search
  yourself: <name> is off while lab 06 is graded")``: this catches a reference the learner saved
  (``my_plan = planner.plan``), ``from ... import plan`` bindings elsewhere and the library's
  helpers that search through them (``planner.evaluate``, the chapter's widget, ``advice``);
* the real bodies of ``plan``, ``candidates`` and ``_inner`` (gpumem/planner/search.py) begin by
  refusing when the function carries a ``refusing`` message (:data:`IN_BODY`), so the original
  code, saved before grading and put back during the call, still refuses.

* while the call runs, a profile hook refuses any call into a *copy* of ``planner.search`` or
  ``planner.ranking`` (their source exec'd in a new module, or pasted): the functions are known by
  their code's content, compiled afresh from the files, names and lines aside
  (:mod:`gpumem.course.copy_watch`); a refusal the learner catches is still reported.

After the call :func:`changed` compares the guard with what it set (the code objects, the
messages, the module attributes, the active count); a change is an error row naming it.

The grader's own answers are never computed before or during the learner's call (``labcheck``
prices the reference after it), and :func:`active` lets the grader's helpers refuse while it runs;
the GPU part's own timing (``lab06_gpu.reference_flops``) is switched off too.

What it cannot stop: a learner who starts another Python process (``python -m gpumem plan``), a
copy edited inside its functions' bodies (that is the learner's own code then), or code that
undoes every switch and puts every one back before returning; the lab runs in the
learner's own kernel, and the prompt says the search is the exercise.
"""

import importlib
import sys
import threading
from contextlib import contextmanager

from gpumem.course import copy_watch
from gpumem.course.case_limits import alarm_held
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
IN_BODY = (search.plan, search.candidates, search._inner)   # their bodies read ``refusing``
_MODULES = ((search, ("plan", "answer", "candidates", "layouts_of", "fits_any", "_inner")),
            (ranking, ("rank", "rank_of")))
_ACTIVE = [0]          # > 0 while the learner's function runs
COPY = ("write the search yourself: your code ran a copy of {} (the planner's own code under another "
        "name) while lab 06 was graded")
_PRINTS: list = []


def prints() -> copy_watch.Prints:
    """Content fingerprints of every function of ``planner.search`` and ``planner.ranking`` (once)."""
    if not _PRINTS:
        _PRINTS.append(copy_watch.Prints([(search, "planner.search"), (ranking, "planner.ranking")]))
    return _PRINTS[0]


def _watch(hits: list):
    """A profile hook refusing any call into a copy of the planner's search (by content)."""
    copies = prints()

    def watch(frame, event, arg):
        if event == "call":
            copied = copies.copied(frame)
            if copied:
                hits.append(copied)
                raise RuntimeError(COPY.format(copied))
    return watch


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
    also when the learner's call raises or runs out of time. Yields :func:`changed`'s closure."""
    saved, entered, armed, hits = [], False, {}, []
    names = {fn: name for name, fn in _functions()}
    bound = {(m, a): getattr(m, a) for m, attrs in _MODULES for a in attrs}
    previous, previous_threads, watch = sys.getprofile(), threading.getprofile(), _watch(hits)
    try:
        for name, fn in _functions():
            code = _refusing_code(name, fn)
            if code is not None:
                saved.append((fn, fn.__code__))
                fn.__code__ = code
                armed[fn] = code
        for fn in IN_BODY:
            fn.refusing = MESSAGE.format(names[fn])
        _ACTIVE[0], entered = _ACTIVE[0] + 1, True
        level = _ACTIVE[0]

        def changes() -> list[str]:
            off = [] if hits or sys.getprofile() is watch else ["the copy watch (sys.setprofile)"]
            return _changes(armed, bound, names, level) + off
        changes.copies = hits
        with alarm_held():
            sys.setprofile(watch)
            threading.setprofile(watch)
        yield changes
    finally:
        with alarm_held():
            sys.setprofile(previous)
            threading.setprofile(previous_threads)
        _ACTIVE[0] -= entered
        for fn in IN_BODY:
            fn.__dict__.pop("refusing", None)
        for fn, code in saved:
            fn.__code__ = code


def _changes(armed: dict, bound: dict, names: dict, level: int) -> list[str]:
    """What differs from what :func:`no_search` set (empty: the guard is as it was)."""
    out = [f"{names[fn]}'s code" for fn, code in armed.items() if fn.__code__ is not code]
    out += [f"{names[fn]}'s refusal" for fn in IN_BODY if fn.__dict__.get("refusing") != MESSAGE.format(names[fn])]
    out += [f"{m.__name__.removeprefix('gpumem.')}.{a}" for (m, a), fn in bound.items() if getattr(m, a, None) is not fn]
    if _ACTIVE[0] != level:
        out.append("the guard's active count")
    return out


def changed_line(what: list[str]) -> str:
    """The error row of a call that changed the guard."""
    shown = ", ".join(what[:3]) + (f" and {len(what) - 3} more" if len(what) > 3 else "")
    return (f"the lab's guard was changed while choose_plan ran ({shown}): the planner's search stays off "
            "while lab 06 is graded -- write the search yourself")


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
