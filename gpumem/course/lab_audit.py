"""The labs' audit hook: while a learner's call is graded, reaching the grader's frames or starting
another process is refused.

While a grader calls the learner's function, the answers it drew sit in its own frames (a case's
locals, a closure's defaults). :func:`refusing` wraps that call: an audit hook (installed once; a
learner cannot remove it) raises ``RuntimeError(f"{refusal} ({what})")`` on

* :data:`FRAME_EVENTS`: ``sys._getframe`` (and so ``inspect.currentframe``), ``sys._current_frames``,
  the collector's object lists (``gc.get_objects`` / ``get_referrers`` / ``get_referents``), and
  reading a traceback's, generator's or coroutine's frame (``object.__getattr__`` of
  :data:`FRAME_ATTRS`);
* :data:`NET_EVENTS`: a network socket made, bound or connected (review r16 of lab 01: a helper
  started from a terminal answered over a socket);
* :data:`SPAWN_EVENTS`: ``subprocess``, ``os.system``, ``os.posix_spawn``, ``os.spawn*``,
  ``os.fork``, ``os.exec*``: another interpreter, where no guard of this kernel watches.

Exempt: the course's own code (gpumem's files), the standard library's modules that read their
caller's frame for a name only (:data:`BENIGN`: namedtuple, enum, dataclasses, ...), ``logging``'s
own caller lookup (``Logger.findCaller`` through ``logging.currentframe``, the code objects as they
were when this module was imported), and installed library code on threads other than the grading
one (the kernel's own threads). A learner's thread is watched like the grading thread. Each refusal
is appended to the ``hits`` list the grader passed, so a learner who catches the exception is still
reported. (Reading ``frame.f_back`` raises no audit event in Python 3.11: the frame must first be
had through one of the events above.) The hook reads its own copies of these rules and its own
list of watched calls, so rebinding this module's names does nothing, and a watch emptied during
the call is reported (:data:`EMPTIED`); a learner's code determined enough to dig the hook's
closure out before grading is beyond an in-kernel guard (instructors grade from a fresh kernel).

Threads: a call is refused while a thread the learner's cells started runs, and starting one inside it is
refused (:func:`foreign_threads`, :data:`THREAD`); likewise while a child process runs (:func:`foreign_children`),
or a process the kernel's cells started that was re-parented away from it (a double fork: :mod:`.lab_orphans`,
review r11; on Linux, :func:`install` makes the kernel adopt its descendants' orphans, and zombies it
adopted are reaped before each check). Exemptions hold only for genuine code (:mod:`.genuine`:
code compiled under a gpumem file name is not). Used by labs 01, 03, 05, 06 and 08; sealed by
:mod:`.grader_seal`.
"""

import contextlib
import logging
import os
import pathlib
import sys
import threading

from . import genuine
from .case_limits import TIMED_OUT, alarm_held
from .lab_orphans import adopt, orphans, reap

FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
                          "gc.get_referents", "sys.settrace", "sys.setprofile"})
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
# a network socket: a process outside the grader (started from a terminal) could answer (review r16, lab 01)
NET_EVENTS = frozenset({"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo"})
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                          "os.exec"})
# Standard-library modules that look at their caller's frame for a name only (namedtuple, enum, ...).
BENIGN = ("collections/__init__.py", "typing.py", "enum.py", "dataclasses.py", "abc.py", "functools.py")
OWN = str(pathlib.Path(__file__).parents[1])                   # gpumem's own code
INSTALLED = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})         # the standard library, site-packages
# logging.Logger.findCaller -> logging.currentframe (a lambda calling sys._getframe(1)): a log line
_LOGGING = (logging.currentframe.__code__, logging.Logger.findCaller.__code__)

_HOOKED: list = []          # the hook installed (its ``active`` list: (hits, refusal, grading thread))
EMPTIED = "it emptied the grader's watch (gpumem.course.lab_audit)"


def _make_hook():
    """The audit hook, with its own copies of the rules and of the calls watched (closure locals:
    rebinding this module's names afterwards changes nothing it reads)."""
    own, installed, benign = OWN, INSTALLED, BENIGN
    frame_events, frame_attrs, spawn_events = frozenset(FRAME_EVENTS), frozenset(FRAME_ATTRS), frozenset(SPAWN_EVENTS)
    net_events = frozenset(NET_EVENTS)
    log_frame, log_finder = _LOGGING
    active: list[tuple[list, str, int]] = []
    busy = threading.local()
    getframe, ident, is_genuine = sys._getframe, threading.get_ident, genuine.genuine
    verdicts: dict = {}     # id(code) -> (code, genuine?): lab 04's watch calls sys.setprofile 4 times an op
    hooks_of, timed_out = {"sys.settrace": sys.gettrace, "sys.setprofile": sys.getprofile}, [TIMED_OUT]

    def real_code(code) -> bool:
        """``genuine`` of ``code``, once per code object (the object itself is kept, so its id is
        not reused; a verdict is kept here, in the hook's closure, not in a module a cell can write)."""
        seen = verdicts.get(id(code))
        if seen is None or seen[0] is not code:
            seen = verdicts[id(code)] = (code, is_genuine(code))
        return seen[1]

    def reach(event: str, args, caller, grading: int) -> str:
        where = caller.f_code.co_filename if caller is not None else ""
        real = caller is not None and real_code(caller.f_code)     # the file's own code, not a look-alike
        if real and (where.startswith(own) or (event not in spawn_events and where.endswith(benign))):
            return ""
        if ident() != grading and real and where.startswith(installed):
            return ""   # another thread's library code (the kernel's own threads); a learner's thread is not
        if event in spawn_events:
            return f"it started another process ({event}): a guard in this kernel cannot watch it"
        if event in net_events:
            return f"it opened a network connection ({event}): graded code computes its answer itself"
        if event in hooks_of and getattr(hooks_of[event](), "graders_refusals", None) == timed_out:
            return ""   # Python unsets a grader's hook that the case's time limit struck (lab 04, review r34 #2)
        if event in ("sys.settrace", "sys.setprofile"):
            return f"it called {event} (a hook that can rewrite the grader's variables or blind its watch)"
        if event == "sys._getframe" and caller.f_code is log_frame and caller.f_back is not None \
                and caller.f_back.f_code is log_finder:
            return ""   # logging's own caller lookup (Logger.findCaller -> logging.currentframe)
        what = event if event != "object.__getattr__" else f".{args[1]}"
        return f"it reached for stack frames or the collector's objects ({what}), where the grader's answers are"

    def hook(event, args):
        watched = event in frame_events or event in spawn_events or event in net_events \
            or (event == "object.__getattr__" and len(args) > 1 and args[1] in frame_attrs)
        if not watched or not active or getattr(busy, "on", False):
            return
        hits, refusal, grading = active[-1]
        busy.on = True        # sys._getframe below raises its own audit event
        try:
            name = reach(event, args, getframe(1), grading)
        finally:
            busy.on = False
        if name:
            hits.append(name)
            raise RuntimeError(f"{refusal} ({name})")
    hook.active = active
    return hook


def install():
    """Add the audit hook (once per interpreter; it does nothing while no call is watched), and make
    this process adopt its descendants' orphans (Linux; each time: a cell may have unset it)."""
    adopt()
    if not _HOOKED:
        hook = _make_hook()
        sys.addaudithook(hook)
        _HOOKED.append(hook)
    return _HOOKED[0]


THREAD = "it started a thread (the grader watches the thread that calls your function)"
# Python threads a kernel runs on its own: a thread with a frame of these packages' files (or gpumem's)
KERNEL = ("ipykernel", "IPython", "jupyter_client", "zmq", "tqdm", "debugpy")
_STARTS = ((threading, "_start_new_thread"), (sys.modules["_thread"], "start_new_thread"))


def foreign_threads() -> list[str]:
    """Threads other than this one (and the main thread, which a check run in a thread leaves
    waiting) that a learner's cells started and that still run: a frame of
    code that is not its file's (a cell's, an ``exec``), or no frame of the kernel's packages or
    gpumem's (an executor's worker, a ``threading.Timer``, a loop in a thread). Their code could
    answer for the learner's function unwatched (review r8 of lab 08: a worker thread fed by a queue)."""
    here, names = threading.get_ident(), {t.ident: t.name for t in threading.enumerate()}
    caller = threading.main_thread().ident      # a grading thread's caller waits on the main thread
    out = []
    for tid, frame in sys._current_frames().items():
        if tid in (here, caller):
            continue
        owned, stranger = False, None
        while frame is not None and stranger is None:
            code = frame.f_code
            if not genuine.genuine(code):
                stranger = code
            elif code.co_filename.startswith(OWN) or any(f"{p}{os.sep}" in code.co_filename for p in KERNEL):
                owned = True
            frame = frame.f_back
        if stranger is not None or not owned:
            at = f", running {stranger.co_name} from {stranger.co_filename}" if stranger is not None else ""
            out.append(f"{names.get(tid, tid)}{at}")
    return out


# a multiprocessing helper any library may leave running (torch's data loaders, our launcher)
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def foreign_children() -> list[str]:
    """Live child processes of this kernel (Linux: /proc; elsewhere none are seen), zombies and
    multiprocessing's own helpers aside. One a learner's cells started before the check could
    answer for the learner's function through a pipe, with no guard in it (review r9 of labs 05
    and 06: 11 of 13 and 11 of 11 rows)."""
    out = []
    for task in pathlib.Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            pids = task.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError):
                continue
            if state != "Z" and cmd.strip() and not any(h in cmd for h in _HELPERS):   # "": still exec-ing
                out.append(f"pid {pid}: {cmd.strip()[:80]}")
    return out


def _refusing_start(original, refusal: str, hits: list[str]):
    """``original`` (a thread starter) for gpumem's own callers; refused for anyone else."""
    def start(*args, **kwargs):
        caller = sys._getframe(1)
        while caller is not None and caller.f_code.co_filename == threading.__file__:
            caller = caller.f_back
        if caller is not None and caller.f_code.co_filename.startswith(OWN) and genuine.genuine(caller.f_code):
            return original(*args, **kwargs)
        hits.append(THREAD)
        raise RuntimeError(f"{refusal} ({THREAD})")
    return start


@contextlib.contextmanager
def refusing(refusal: str, hits: list[str]):
    """Inside the block, the current thread's call is watched: a refused event appends what it
    reached for to ``hits`` and raises ``RuntimeError(f"{refusal} ({what})")``. Yields ``hits``;
    a watch found emptied at the end is a hit too (:data:`EMPTIED`). A thread the learner's cells
    left running refuses the call before it starts (and one found after it, as it ends); starting
    a thread inside it is refused (:data:`THREAD`)."""
    running = foreign_threads()
    if running:
        hits.append(f"a thread your cells started is running ({running[0]}): restart the kernel")
        raise RuntimeError(f"{refusal} ({hits[-1]})")
    install()
    reap()                      # zombies of orphans adopted earlier (never a pid a Popen object holds)
    children = foreign_children() or orphans()
    if children:
        hits.append(f"a process your cells started is running ({children[0]}): stop it or restart the kernel")
        raise RuntimeError(f"{refusal} ({hits[-1]})")
    active = install().active
    entry = (hits, refusal, threading.get_ident())
    starts = [(owner, name, getattr(owner, name)) for owner, name in _STARTS]
    try:
        with alarm_held():
            active.append(entry)
            for owner, name, original in starts:
                setattr(owner, name, _refusing_start(original, refusal, hits))
        yield hits
    finally:
        with alarm_held():
            for owner, name, original in starts:
                setattr(owner, name, original)
            found = [i for i, e in enumerate(active) if e is entry]
            for i in reversed(found):
                del active[i]
        if not found and not hits:
            hits.append(EMPTIED)
    running = foreign_threads()
    if running and not hits:
        hits.append(f"a thread was left running ({running[0]}): {THREAD}")


def active() -> bool:
    """True while some learner's call is watched."""
    return bool(_HOOKED and _HOOKED[0].active)


# Read now, at import: a graded call's own events check this file's code (genuine.genuine), and a lab
# that refuses opening gpumem's files while graded (lab 01) would take that read for the learner's.
# An assignment, not a bare call: the grader seal re-runs only files whose top level assigns and defines.
_READ_AT_IMPORT = bool(genuine.file_codes(__file__))
