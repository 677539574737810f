"""Knowing the course's own code by what it is, not by its name: for the labs' guards.

A lab's guard refuses the course's answers while the learner's function runs. Two ways round a
guard that knows functions by file and name:

* **a copy run under another name**: ``exec(compile(inspect.getsource(module), "<mine>", "exec"))``
  makes new code objects in a new "file"; :class:`Prints` knows them by their *content*: each
  protected function (nested ones included) compiled afresh from its module's file and reduced to
  its instructions and constants, with the names it uses (globals, attributes, locals), its file
  and its line numbers left out, and its leading guard statements (``sys.audit(...)``, calls of
  :data:`.copy_signature.GUARD_CALLS`) dropped; a code object that holds most (:data:`COVER`) of
  a protected body's runs of :data:`.copy_signature.SHINGLE` instructions is a copy: renaming,
  deleting or replacing the guard lines, wrapping each ``return`` in a call or adding a few
  statements still matches. Short
  functions (under ``least`` instructions) are left out: a learner's code repeats them by chance.
* **an answer computed before grading** (a table made at definition time): :func:`from_grader`
  lets an answer run only when every frame between it and a grading entry point (a lab's
  ``check``, or a test module under ``tests/``) is the course's *own* code: a frame whose globals
  are a loaded ``gpumem`` module's and whose code object equals one compiled afresh from that
  module's file (:func:`genuine`). A learner's cell, a function of theirs handed to the grader
  (a fake ``rng``) or code exec'd in a course module's namespace is none of those.

Limits: test modules are taken at their word (pytest rewrites their code, so it cannot be
compared with the file); a copy run at definition time, outside any guard, computes what it computes.
"""

import inspect
import os
import signal
import sys
import threading
import types
from collections import Counter
from functools import lru_cache

from .copy_signature import (COVER, KEPT, SOME, _loaded, _shingles, _valued, bound_values, common, consts_met,
                             frame_values, signature)

GPUMEM = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
TESTS = os.path.join(os.path.dirname(os.path.dirname(GPUMEM)), "tests") + os.sep
@lru_cache(maxsize=None)
def fresh(path: str) -> types.CodeType | None:
    """The module code of the file at ``path``, compiled now (None if unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            return compile(f.read(), path, "exec", dont_inherit=True)
    except (OSError, SyntaxError):
        return None


def nested(code: types.CodeType):
    """``code`` and every code object in its constants, depth first."""
    yield code
    yield from (c for const in code.co_consts if isinstance(const, types.CodeType) for c in nested(const))


@lru_cache(maxsize=None)
def _fresh_codes(path: str) -> frozenset:
    return frozenset(nested(top)) if (top := fresh(path)) is not None else frozenset()


_GENUINE: dict[int, tuple] = {}      # id(code) -> (code, globals, verdict): each frame's code checked once


def genuine(frame) -> bool:
    """True if ``frame`` runs a ``gpumem`` module's own code: its globals are the loaded module's
    and its code object equals one compiled afresh from the module's file."""
    code, g = frame.f_code, frame.f_globals
    seen = _GENUINE.get(id(code))
    if seen is not None and seen[0] is code and seen[1] is g:
        return seen[2]
    module = sys.modules.get(g.get("__name__", ""))
    path = getattr(module, "__file__", None) or ""
    ok = (module is not None and vars(module) is g and path.startswith(GPUMEM)
          and code.co_filename == path and code in _fresh_codes(path))
    _GENUINE[id(code)] = (code, g, ok)
    return ok


def genuine_code(code: types.CodeType) -> bool:
    """True if ``code`` equals one compiled afresh from its own (``gpumem``) file."""
    return code.co_filename.startswith(GPUMEM) and code in _fresh_codes(code.co_filename)


def is_test(frame) -> bool:
    """True if ``frame`` runs code of a module loaded from the course's ``tests/`` folder."""
    g = frame.f_globals
    module = sys.modules.get(g.get("__name__", ""))
    path = getattr(module, "__file__", None) or ""
    return module is not None and vars(module) is g and path.startswith(TESTS) and frame.f_code.co_filename == path


LEARNER_CALL = (os.path.join(os.path.dirname(os.path.abspath(__file__)), "grading.py"), "call")


def from_grader(frame, entries: set[tuple[str, str]]) -> bool:
    """True if ``frame`` and every frame above it, up to an entry point (``(file, qualified name)``
    in ``entries``, run as the course's own code) or a test module, are the course's own code, and
    none of them is :func:`gpumem.course.grading.call` (then ``frame`` runs inside a learner's
    function: the learner handed the grader the course's own function, or a copy of it)."""
    while frame is not None:
        if is_test(frame):
            return True
        if not genuine(frame) or (frame.f_code.co_filename, frame.f_code.co_qualname) == LEARNER_CALL:
            return False
        if (frame.f_code.co_filename, frame.f_code.co_qualname) in entries:
            return True
        frame = frame.f_back
    return False


def graders_only(what: str, entries: set[tuple[str, str]], depth: int = 2) -> None:
    """Raise unless the caller of the function calling this one comes from a grading entry point
    (:func:`from_grader`): ``what`` names the answer in the message."""
    if not from_grader(sys._getframe(depth), entries):
        raise RuntimeError(f"{what} is the grader's answer: it runs only inside the lab's check(), "
                           "not from a learner's code (work it out yourself)")


class Prints:
    """Content fingerprints of the functions of some modules (``(module, label)``; ``skip``: names
    left out; ``only``: if given, the names kept) at least ``least`` instructions long; :meth:`match`
    names the one a code object repeats: it holds :data:`COVER` of that body's :func:`_shingles` (a
    learner's code shares a few runs of instructions with it by chance, not most) and enough of the
    constants the body loads (:func:`.copy_signature.consts_met`: all, all but one of 4 or more,
    over half at a close cover; the learner's own code that reads like the answer differs in more). A
    constant counts as loaded from the body, from a global (:func:`_valued`), or from the
    function's defaults and closure, or its frame's parameters (review r8's mut3)."""

    def __init__(self, modules, least: int = 40, skip=(), only=()):
        self.known: dict[tuple, str] = {}
        # per body: the shingles a copy must hold, the constants it loads; shingle -> bodies holding it
        self.needed, self.total, self.consts, self.index, self.sigs = [], [], [], {}, []
        for module, label in modules:
            for code in nested(top) if (top := fresh(module.__file__)) is not None else ():
                if not code.co_flags & inspect.CO_OPTIMIZED or code.co_name.startswith("<") \
                        or code.co_name in skip or (only and code.co_name not in only):
                    continue
                sig = signature(code)
                if len(sig) >= least and sig not in self.known:
                    self.known[sig] = f"{label}.{code.co_qualname}"
                    self.sigs.append(sig)
                    for h in (body := _shingles(sig)):
                        self.index.setdefault(h, []).append(len(self.needed))
                    self.needed.append(max(1, int(COVER * len(body) + 0.999)))
                    self.total.append(len(body))
                    self.consts.append(_loaded(sig))
        self.names = list(self.known.values())
        self._seen: dict[int, tuple] = {}

    def match(self, code: types.CodeType, values: dict | None = None, bound=None) -> str:
        """The protected function ``code`` repeats ('' if none; ``values``: the globals it runs
        with, whose constants count as loaded; ``bound``: a callable giving the constants its
        function carries, defaults and closure, :func:`.copy_signature.bound_values`, read only
        for a body whose shingles it holds); shingles and globals computed once per code object."""
        seen = self._seen.get(id(code))
        if seen is None or seen[0] is not code or seen[1] is not values:
            near: list = []
            loaded = frozenset()
            if not code.co_name.startswith("<"):
                sig = signature(code)
                loaded = _loaded(sig) | _valued(code, values)
                counts = Counter(j for h in _shingles(sig) for j in self.index.get(h, ()))
                near = [(j, n / self.total[j]) for j, n in counts.most_common() if n >= self.needed[j]]
                near += [(j, kept) for j, n in counts.items() if SOME * self.total[j] <= n < self.needed[j]
                         and (kept := common(sig, self.sigs[j]) / len(self.sigs[j])) >= KEPT]   # padded (r26)
            seen = self._seen[id(code)] = (code, values, near, loaded)
        near, loaded = seen[2], seen[3]
        extra = None
        for j, cover in near:
            if consts_met(self.consts[j], loaded, cover):
                return self.names[j]
            if bound is not None:
                extra = bound() if extra is None else extra
                if consts_met(self.consts[j], loaded | extra, cover):
                    return self.names[j]
        return ""

    def copied(self, frame) -> str:
        """What ``frame`` runs a copy of ('' if nothing, or if it is the course's own code). A code
        object already matched with these globals and near no protected body returns at once (the
        hooks call this at every Python call of a graded region)."""
        code = frame.f_code
        seen = self._seen.get(id(code))
        if seen is not None and not seen[2] and seen[0] is code and seen[1] is frame.f_globals:
            return ""
        hit = self.match(frame.f_code, frame.f_globals, lambda: frame_values(frame))
        return hit if hit and not genuine(frame) else ""


def is_own(fn) -> bool:
    """True if ``fn`` is a ``gpumem`` module's function as its file defines it: its globals are the
    loaded module's and its code equals one compiled afresh from the file (a replaced function, or
    a swapped ``__code__``, is not); or a course test module's (a stand-in, as in :func:`is_test`)."""
    code, g = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    module = sys.modules.get((g or {}).get("__name__", ""))
    path = getattr(module, "__file__", None) or ""
    if code is None or module is None or vars(module) is not g:
        return False
    return (path.startswith(GPUMEM) and code in _fresh_codes(path)) or (path.startswith(TESTS) and code.co_filename == path)


class Sampler:
    """``with Sampler(prints, hits, message):`` looks at the running stacks every ``interval`` s of
    CPU time (``SIGPROF``; main thread only, else it does nothing) and refuses a frame that runs a
    copy (:meth:`Prints.copied`): its name goes to ``hits``, and ``RuntimeError(message.format(name))``
    is raised in the main thread. A profile hook would slow every call; a copy of a search runs
    long enough to be seen by a sample."""

    def __init__(self, prints: Prints, hits: list, message: str, interval: float = 0.01):
        self.prints, self.hits, self.message, self.interval = prints, hits, message, interval
        self.previous = None

    def __enter__(self):
        if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
            return self
        self.previous = signal.signal(signal.SIGPROF, self._tick)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, self.previous)
            self.previous = None
        return False

    def seen(self, frame) -> str:
        """The first copy on ``frame``'s stack ('' if none)."""
        while frame is not None:
            hit = self.prints.copied(frame)
            if hit:
                return hit
            frame = frame.f_back
        return ""

    def _tick(self, signum, frame):
        if self.hits:
            return
        hit = self.seen(frame) or next((h for f in sys._current_frames().values() if (h := self.seen(f))), "")
        if hit:
            self.hits.append(hit)
            raise RuntimeError(self.message.format(hit))


def held_copies(prints: Prints, namespace: dict, depth: int = 2) -> str:
    """The first copy among the functions a namespace holds ('' if none): its functions, and those
    of the modules, classes and containers in it that are not loaded from a file (``depth`` levels)."""
    seen: set[int] = set()

    def look(value, level: int) -> str:
        if id(value) in seen or level < 0:
            return ""
        seen.add(id(value))
        code = value if isinstance(value, types.CodeType) else getattr(value, "__code__", None)
        if isinstance(code, types.CodeType):
            g = getattr(value, "__globals__", None)
            carried = (lambda: bound_values(value)) if code is getattr(value, "__code__", None) else None
            return next((hit for c in nested(code) if (hit := prints.match(c, g, carried if c is code else None))
                         and not genuine_code(c)), "")
        if isinstance(value, types.ModuleType):
            if sys.modules.get(value.__name__) is value and getattr(value, "__file__", None):
                return ""                                   # a loaded module: its functions are its file's
            items = list(vars(value).values())
        elif isinstance(value, type):
            items = list(vars(value).values())
        elif isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(value)
        else:
            return ""
        return next((hit for item in items if (hit := look(item, level - 1))), "")
    return next((hit for value in list(namespace.values()) if (hit := look(value, depth))), "")
