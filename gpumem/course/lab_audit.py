"""The labs' audit hook: while a learner's call is graded, reaching the grader's frames or starting
another process is refused.

While a grader calls the learner's function, the answers it drew sit in its own frames (a case's
locals, a closure's defaults). :func:`refusing` wraps that call: an audit hook (installed once; a
learner cannot remove it) raises ``RuntimeError(f"{refusal} ({what})")`` on

* :data:`FRAME_EVENTS`: ``sys._getframe`` (and so ``inspect.currentframe``), ``sys._current_frames``,
  the collector's object lists (``gc.get_objects`` / ``get_referrers`` / ``get_referents``), and
  reading a traceback's, generator's or coroutine's frame (``object.__getattr__`` of
  :data:`FRAME_ATTRS`);
* :data:`SPAWN_EVENTS`: ``subprocess``, ``os.system``, ``os.posix_spawn``, ``os.spawn*``,
  ``os.fork``, ``os.exec*``: another interpreter, where no guard of this kernel watches.

Exempt: the course's own code (gpumem's files), the standard library's modules that read their
caller's frame for a name only (:data:`BENIGN`: namedtuple, enum, dataclasses, ...), ``logging``'s
own caller lookup (``Logger.findCaller`` through ``logging.currentframe``, the code objects as they
were when this module was imported), and installed library code on threads other than the grading
one (the kernel's own threads). A learner's thread is watched like the grading thread. Each refusal
is appended to the ``hits`` list the grader passed, so a learner who catches the exception is still
reported. (Reading ``frame.f_back`` raises no audit event in Python 3.11: the frame must first be
had through one of the events above.)

Used by labs 05, 06 and 08 (their ``lab_guard`` modules); sealed by :mod:`.grader_seal`.
"""

import contextlib
import logging
import pathlib
import sys
import threading

from .case_limits import alarm_held

FRAME_EVENTS = {"sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents"}
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"}
SPAWN_EVENTS = {"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.exec"}
# Standard-library modules that look at their caller's frame for a name only (namedtuple, enum, ...).
BENIGN = ("collections/__init__.py", "typing.py", "enum.py", "dataclasses.py", "abc.py", "functools.py")
OWN = str(pathlib.Path(__file__).parents[1])                   # gpumem's own code
INSTALLED = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})         # the standard library, site-packages
# logging.Logger.findCaller -> logging.currentframe (a lambda calling sys._getframe(1)): a log line
_LOGGING = (logging.currentframe.__code__, logging.Logger.findCaller.__code__)

_ACTIVE: list[tuple[list, str, int]] = []     # (hits, refusal, grading thread) of the calls now watched
_HOOKED: list = []
_IN_AUDIT = threading.local()


def _logging_lookup(caller) -> bool:
    """True for ``logging``'s own caller lookup (its currentframe called by its findCaller)."""
    back = caller.f_back if caller.f_code is _LOGGING[0] else None
    return back is not None and back.f_code is _LOGGING[1]


def reach(event: str, args, caller, grading: int) -> str:
    """What the learner's call reached for ('' if nothing refused): frames, the collector, a process.
    ``caller``: the frame that raised ``event``; ``grading``: the thread that runs the learner's call."""
    where = caller.f_code.co_filename if caller is not None else ""
    if where.startswith(OWN) or (event not in SPAWN_EVENTS and where.endswith(BENIGN)):
        return ""
    if threading.get_ident() != grading and where.startswith(INSTALLED):
        return ""       # another thread's library code (the kernel's own threads); a learner's thread is not
    if event in SPAWN_EVENTS:
        return f"it started another process ({event}): a guard in this kernel cannot watch it"
    if event in FRAME_EVENTS or (event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRS):
        if event == "sys._getframe" and _logging_lookup(caller):
            return ""
        what = event if event != "object.__getattr__" else f".{args[1]}"
        return f"it reached for stack frames or the collector's objects ({what}), where the grader's answers are"
    return ""


def _audit(event, args):
    watched = event in FRAME_EVENTS or event in SPAWN_EVENTS \
        or (event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRS)
    if not watched or not _ACTIVE or getattr(_IN_AUDIT, "on", False):
        return
    hits, refusal, grading = _ACTIVE[-1]
    _IN_AUDIT.on = True        # sys._getframe below raises its own audit event
    try:
        caller = sys._getframe(1)
        name = reach(event, args, caller, grading)
    finally:
        _IN_AUDIT.on = False
    if name:
        hits.append(name)
        raise RuntimeError(f"{refusal} ({name})")


def install() -> None:
    """Add the audit hook (once per interpreter; it does nothing while no call is watched)."""
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(True)


@contextlib.contextmanager
def refusing(refusal: str, hits: list[str]):
    """Inside the block, the current thread's call is watched: a refused event appends what it
    reached for to ``hits`` and raises ``RuntimeError(f"{refusal} ({what})")``. Yields ``hits``."""
    install()
    entry = (hits, refusal, threading.get_ident())
    try:
        with alarm_held():
            _ACTIVE.append(entry)
        yield hits
    finally:
        with alarm_held():
            for i in range(len(_ACTIVE) - 1, -1, -1):
                if _ACTIVE[i] is entry:
                    del _ACTIVE[i]
                    break


def active() -> bool:
    """True while some learner's call is watched."""
    return bool(_ACTIVE)
