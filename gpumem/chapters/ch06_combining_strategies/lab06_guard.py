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
  code, saved before grading (or rebuilt into a function on the module's globals) and put back
  during the call, still refuses;
* while the guard is in force no frame may run a blocked function's *genuine* code: the sampler
  (below) refuses one, so functions rebuilt on the saved code and bound into the modules for the
  call (no mark popped, everything put back before the guard is compared) are refused too; the
  sampler's timer and handler switched off during the call are seen (:mod:`.lab06_timer`, r16 #2).
* a *copy* of ``planner.search`` or ``planner.ranking`` (their source exec'd in a new module, or
  pasted) is known by its code's content, compiled afresh from the files, names and lines aside
  (:mod:`gpumem.course.copy_watch`): ``labcheck`` looks through the learner's namespace before the
  call (``held_copies``); during it, code exec'd is matched as it runs (an audit hook), and the
  running stacks are sampled every 10 ms of CPU time (``Sampler``, ``SIGPROF``: a copied search
  runs far longer). A refusal the learner catches is still reported. No profile hook: it would
  slow every call of the learner's own search about threefold.
* code that is neither a notebook cell's nor an installed file's (the course's origin rule,
  :mod:`gpumem.course.lab_origin`, shared with lab 08) is refused when it is exec'd during the call
  (the audit hook) or seen by a sample between the learner's call and the grader (review r11: a
  generic AST rewrite of the grader's former limit search, exec'd as ``"<mylim>"``, passed 13/13). In a
  kernel a cell is one IPython ran (its compiler's and history's records); without one (the tests)
  a file on disk counts too. Known gap: a rewritten copy pasted into a cell is a cell's code.

After the call :func:`changed` compares the guard with what it set (the code objects, the
messages, the module attributes, the active count); a change is an error row naming it.

The grader's own answers are never computed before or during the learner's call (``labcheck``
prices the reference after it), and :func:`active` lets the grader's helpers refuse while it runs;
the GPU part's own timing (``lab06_gpu.reference_flops``) is switched off too; the truth under the
team's limits is the planner's search (``lab06_limit_cases.truth``), which refuses while the call runs.

Reaching the grader's frames (``sys._getframe``, ``inspect``, a traceback's or a generator's frame),
the collector's object lists, or starting another process (``python -m gpumem plan``, a ``subprocess``
that imports the planner) from the learner's call are refused by an audit hook (:mod:`gpumem.course.lab_audit`,
shared with labs 05 and 08), with :data:`REACHED`'s words.

What it cannot stop: a copy edited inside its functions' bodies (that is the learner's own code then), a copy built
inside the call without ``exec`` that runs for less than a sample's interval, or code that
undoes every switch and puts every one back before returning; the lab runs in the
learner's own kernel, and the prompt says the search is the exercise.
"""

import importlib
import sys
import threading
from contextlib import contextmanager

from gpumem.course import copy_watch, genuine, lab_audit, lab_origin
from gpumem.course.case_limits import alarm_held
from gpumem.planner import ranking, search

from . import lab06_gpu, lab06_timer

evaluate = importlib.import_module("gpumem.planner.evaluate")   # the package exports the function

MESSAGE = "write the search yourself: {} is off while lab 06 is graded"

# (name the learner reads in the message, function): the planner's search entry points
BLOCKED = (("planner.plan", search.plan), ("planner.search.answer", search.answer),
           ("planner.search.candidates", search.candidates), ("planner.search.layouts_of", search.layouts_of),
           ("planner.search.fits_any", search.fits_any), ("planner.search._inner", search._inner),
           ("planner.ranking.rank", ranking.rank),
           ("planner.ranking.rank_of", ranking.rank_of), ("planner.evaluate", evaluate.evaluate),
           ("lab06_gpu.reference_flops", lab06_gpu.reference_flops),
           # review r15: the search's own helpers (the degree split, hybrid's groups, the engine
           # choice, the host and NVMe fit with the swap buffers) are part of the answer too
           ("planner.search.parallel_degrees", search.parallel_degrees),
           ("planner.search._shard_groups", search._shard_groups), ("planner.search._engines", search._engines),
           ("planner.search._states_ok", search._states_ok))
IN_BODY = (search.plan, search.candidates, search._inner)   # their bodies read ``refusing``
_MODULES = ((search, ("plan", "answer", "candidates", "layouts_of", "fits_any", "_inner", "parallel_degrees",
                      "_shard_groups", "_engines", "_states_ok")),
            (ranking, ("rank", "rank_of")))
_ACTIVE = [0]          # > 0 while the learner's function runs
COPY = ("write the search yourself: your code ran a copy of {} (the planner's own code under another "
        "name) while lab 06 was graded")
HELD = ("write the search yourself: your notebook holds a copy of {} (the planner's own code under "
        "another name); lab 06 grades a search you wrote")
REACHED = "write the search yourself: lab 06 refuses this while choose_plan is graded"
RAN = ("write the search yourself: {}'s own code ran while choose_plan was graded (rebuilt or bound back "
       "for the call; lab 06 keeps the planner's search off)")
FOREIGN = "your code must run from a notebook cell: {} (lab 06)"   # review r13 #4: not "write it yourself"
_PRINTS: list = []


def prints() -> copy_watch.Prints:
    """Content fingerprints of every function of ``planner.search`` and ``planner.ranking`` (once)."""
    if not _PRINTS:
        _PRINTS.append(copy_watch.Prints([(search, "planner.search"), (ranking, "planner.ranking")]))
    return _PRINTS[0]


_HOOKED: list = []
_HITS: list[list] = []        # the copies seen by the guards now running (innermost last)
_FOREIGN: list[list] = []     # the code of no cell's and no installed file's origin they saw


def origin_ok(code, cache: dict | None = None) -> bool:
    """The origin rule (:mod:`gpumem.course.lab_origin`): a notebook cell's code or an installed
    file's. Without a kernel (the course's tests, whose learners live in test files) code loaded
    from a file on disk counts too; code compiled from a string does not."""
    return lab_origin.allowed_here(code, cache)


class _Sampler(copy_watch.Sampler):
    """The copy sampler, which also refuses a sampled frame of no cell's and no installed file's
    origin (:func:`origin_ok`) between the learner's call and the grader's frame that made it, or
    anywhere in another thread (a worker a cell started before grading, fed the cases through a
    queue, runs while the call waits): a rewritten copy of a search runs for many samples (review r11).
    It also refuses a frame running the *genuine* code of a blocked function (``blocked``: original
    code -> name, set when the guard swaps it): while the guard is in force none may run, so such a
    frame is a bypass (functions rebuilt on the saved code and bound in for the call)."""

    def __init__(self, hits: list, foreign: list, entry, ran: list):
        super().__init__(prints(), hits, COPY)
        self.foreign, self.entry, self.busy, self.origins, self.skips = foreign, entry, False, {}, 0
        self.main, self.ran, self.blocked, self.watch = threading.main_thread().ident, ran, {}, None

    def _tick(self, signum, frame):
        if self.watch is not None:
            self.watch.tick()         # the timer and handlers as the guard set them (it only notes)
        if self.busy:                 # a tick inside a tick: never many in a row (review r18: set from outside)
            self.skips += 1
            return self.skips > 5 and not self.hits and self.hits.append("it switched the grader's sampler off")
        self.busy, self.skips = True, 0
        try:
            super()._tick(signum, frame)
            if self.hits or self.foreign or self.ran:
                return
            ran = _genuine(frame, self.entry, self.blocked) or next(
                (w for t, f in sys._current_frames().items()
                 if t != self.main and (w := _genuine(f, None, self.blocked))), "")
            found = "" if ran else _foreign(frame, self.entry, self.origins) or next(
                (w for t, f in sys._current_frames().items()
                 if t != self.main and (w := _foreign(f, None, self.origins))), "")
        finally:
            self.busy = False
        if ran:
            self.ran.append(ran)
            raise RuntimeError(RAN.format(ran))
        if found:
            self.foreign.append(found)
            raise RuntimeError(FOREIGN.format(found))


def _genuine(frame, stop, blocked: dict) -> str:
    """The name of the first blocked function whose original code runs on ``frame``'s stack above ``stop``."""
    while blocked and frame is not None and frame is not stop:
        if frame.f_code in blocked:
            return blocked[frame.f_code]
        frame = frame.f_back
    return ""


def _foreign(frame, stop, cache: dict) -> str:
    """:func:`lab_origin.where`'s words for the newest frame above ``stop`` failing :func:`origin_ok`."""
    seen = []
    while frame is not None and frame is not stop:
        seen.append(frame.f_code)
        frame = frame.f_back
    if frame is None and stop is not None:
        return ""
    return next((lab_origin.where(c) for c in seen if not origin_ok(c, cache)), "")


_LIBRARY = tuple({sys.prefix, sys.base_prefix})


def _audit(event, args):
    """While a guard runs: code exec'd in the learner's call (a module copied and run then) is
    matched against the planner's search by content."""
    if event != "exec" or not _HITS or not args or not isinstance(args[0], type(_audit.__code__)):
        return
    top = args[0]
    if top.co_filename.startswith(_LIBRARY):               # the interpreter's and site-packages' own modules
        return
    copies = prints()
    for code in copy_watch.nested(top):
        hit = copies.match(code)
        if hit and not copy_watch.genuine_code(code):
            _HITS[-1].append(hit)
            raise RuntimeError(COPY.format(hit))
    caller = sys._getframe(1).f_code             # the stdlib's own exec of "<string>" (a dataclass's methods)
    if not origin_ok(top) and not (top.co_filename == "<string>" and genuine.genuine(caller)) and _FOREIGN:
        _FOREIGN[-1].append(lab_origin.where(top))
        raise RuntimeError(FOREIGN.format(_FOREIGN[-1][-1]))


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
    saved, entered, armed, hits, reached, foreign, ran, stopped = [], False, {}, [], [], [], [], []
    names = {fn: name for name, fn in _functions()}
    bound = {(m, a): getattr(m, a) for m, attrs in _MODULES for a in attrs}
    lab_origin.note_kernel()            # IPython's run_code on this stack: cells known by its records
    sampler = _Sampler(hits, foreign, sys._getframe(2), ran)      # 2: the grader's frame whose `with` calls
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(True)
    try:
        for name, fn in _functions():
            code = _refusing_code(name, fn)
            if code is not None:
                saved.append((fn, fn.__code__))
                fn.__code__ = code
                armed[fn] = code
                sampler.blocked[saved[-1][1]] = name
        for fn in IN_BODY:
            fn.refusing = MESSAGE.format(names[fn])
        _ACTIVE[0], entered = _ACTIVE[0] + 1, True
        level = _ACTIVE[0]

        def changes() -> list[str]:
            return _changes(armed, bound, names, level)
        changes.copies, changes.reached, changes.foreign, changes.ran = hits, reached, foreign, ran
        changes.stopped = stopped
        with alarm_held():
            _HITS.append(hits)
            _FOREIGN.append(foreign)
            sampler.__enter__()
            sampler.watch = lab06_timer.Watch(sampler, stopped)
        with lab_audit.refusing(REACHED, reached):
            yield changes
    finally:
        with alarm_held():
            if sampler.watch is not None:
                sampler.watch.stop()
            sampler.__exit__()
            if _HITS and _HITS[-1] is hits:
                _HITS.pop()
            if _FOREIGN and _FOREIGN[-1] is foreign:
                _FOREIGN.pop()
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


prints()                  # built at import, not inside a case's time limit
for _frame in sys._current_frames().values():      # so are the running threads' files (origin_ok)
    _foreign(_frame, None, {})


def blocked_names() -> list[str]:
    """The names :func:`no_search` switches off (for the lab's text and the tests)."""
    return [name for name, _ in _functions()]
