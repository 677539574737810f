"""Time limits for a lab's cases: a learner's ``while True: pass`` is stopped, not waited on.

:func:`time_limit` raises :class:`TookTooLong` in the running thread once a case's seconds have
passed: by SIGALRM in the main thread on POSIX (a Jupyter kernel runs cells there), else by a
watchdog thread. :func:`case_seconds` reads the limit (``GPUMEM_CASE_SECONDS``, default 120 s).
"""

import contextlib
import os
import signal
import threading

from .genuine import genuine

CASE_SECONDS = 120.0       # per case; generous for a slow laptop; GPUMEM_CASE_SECONDS overrides
_active = threading.local()  # whether a time limit runs in this thread


# what a profile hook that a time limit struck says it refused: Python unsets a hook that raised (an
# audit event, sys.setprofile), which the labs' audit hook then does not take for the learner's (lab 04)
TIMED_OUT = "the case's time limit"


class TookTooLong(BaseException):
    """A case ran past its time limit: a BaseException, so a learner's ``except Exception`` keeps none."""

    def __init__(self, seconds: float):
        super().__init__(f"took longer than {seconds:g} s (stopped)")


def case_seconds(seconds: float | None = None, cases: int = 1) -> float:
    """The time limit for ``cases`` cases run as one: ``seconds`` if given, else the environment's
    ``GPUMEM_CASE_SECONDS``, else :data:`CASE_SECONDS`, per case."""
    env = os.environ.get("GPUMEM_CASE_SECONDS", "")
    if seconds is None:
        seconds = float(env) if env.replace(".", "", 1).isdigit() else CASE_SECONDS
    return seconds * cases


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`TookTooLong` in this thread once ``seconds`` have passed (a limit already
    running in this thread governs a nested one). In the main thread on POSIX (a Jupyter kernel
    runs cells there) a real-time timer's SIGALRM raises it, again every second after the limit,
    so a learner's bare ``except:`` cannot keep a loop alive; elsewhere a watchdog thread does
    the same (:func:`_watchdog`). A C-level operation (one long torch kernel, a blocking
    collective) is not interrupted: the limit strikes when control returns to Python."""
    if getattr(_active, "on", False) or not seconds or seconds <= 0:
        yield
        return
    _active.on, armed = True, [True]

    def stop(frame=None):
        if not armed[0]:
            return
        if frame is not None and frame.f_code.co_name == "hook" and genuine(frame.f_code):
            signal.setitimer(signal.ITIMER_REAL, 0.001, 1.0)   # a grader's profile hook: strike just after it
            return                                             # (Python unsets a hook that raises: lab 04, r34 #2)
        raise TookTooLong(seconds)
    try:
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
            previous = signal.signal(signal.SIGALRM, lambda signum, frame: stop(frame))
            outer = signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
            try:
                yield
            finally:
                while armed[0]:                   # a strike landing here is dropped: the case ended
                    with contextlib.suppress(TookTooLong):
                        armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
                if outer[0]:                      # someone else's timer goes on
                    signal.setitimer(signal.ITIMER_REAL, *outer)
        else:
            with _watchdog(seconds, armed):
                yield
    finally:
        _active.on = False


@contextlib.contextmanager
def _watchdog(seconds: float, armed: list):
    """Off the main thread: a watchdog thread raises TookTooLong in this one (CPython's
    ``PyThreadState_SetAsyncExc``, delivered between bytecodes), again every second until the
    case ends; a strike still pending when it ends is raised in a short loop here and dropped.
    It is never withdrawn with ``SetAsyncExc(tid, NULL)``: on CPython 3.11 that sets the
    interpreter's eval breaker and no thread ever clears it, and the next function a profile hook
    watches (lab 01's copy watch) then spins at its first instruction for good, in any thread."""
    import ctypes
    tid, lock, stopped = threading.get_ident(), threading.Lock(), threading.Event()
    strike = type("TookTooLong", (TookTooLong,), {"__init__": lambda self: TookTooLong.__init__(self, seconds)})
    send = ctypes.pythonapi.PyThreadState_SetAsyncExc

    def watch():
        waits = iter([seconds])
        while not stopped.wait(next(waits, 1.0)):
            with lock:
                if armed[0]:
                    send(ctypes.c_ulong(tid), ctypes.py_object(strike))
    threading.Thread(target=watch, daemon=True, name="gpumem-case-limit").start()
    try:
        yield
    finally:
        stopped.set()
        while armed[0]:
            with contextlib.suppress(TookTooLong), lock:
                armed[0] = False                  # under the lock: no strike is sent after this
        settled = False
        while not settled:                        # one still pending is raised at a backward jump
            try:
                for _ in range(8):
                    pass
                settled = True
            except TookTooLong:
                pass


@contextlib.contextmanager
def alarm_held():
    """Hold SIGALRM back for the block (main thread, POSIX), so a case limit's
    :class:`TookTooLong` arrives after it: a guard putting functions back is never cut short."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
