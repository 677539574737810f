"""Lab 06: the guard's sampler stays armed while the learner's function runs (review r16 #2).

The sampler (``lab06_guard._Sampler``: ``SIGPROF`` every 10 ms of CPU time) is what refuses the
planner's own functions rebuilt on their genuine code. Switched off inside the call
(``setitimer(ITIMER_PROF, 0)``, or ``signal(SIGPROF, SIG_IGN)``, through any public module that
re-exports ``signal``, e.g. ``unittest.signals.signal``) and put back before returning, those
functions passed 13/13. :class:`Watch` compares what the grader set with what is in force:

* when the call starts, once the sampler is armed: the ``SIGPROF`` handler must be the sampler's and
  the profiling timer must run at the sampler's interval; it notes ``SIGALRM``'s handler and the
  real-time timer (the case's time limit) and the interpreter's switch interval as they are;
* while the call runs, a thread compares them every :data:`EVERY` s of wall time (a timer switched
  off for the call and back on after is seen while it is off), and so does every sample;
* after the call, before the sampler is taken down, once more, with the main thread's signal mask.

Any difference is the case's error row (:data:`STOPPED`), caught or not. The timers and handlers
are read with the C module's functions, bound when this module is imported, so a later patch of
``signal``'s attributes changes nothing here. Known gap: code that keeps this thread from running
(the switch interval raised, with the timer off, for a whole stretch) and puts every setting back
before the thread next runs; a process apart from the learner's code is the full answer (r16 #1).
"""

import sys
import threading

try:
    import _signal
    _getitimer, _getsignal = _signal.getitimer, _signal.getsignal
    _PROF, _REAL, _SIGPROF, _SIGALRM = _signal.ITIMER_PROF, _signal.ITIMER_REAL, _signal.SIGPROF, _signal.SIGALRM
    _mask, _BLOCK = getattr(_signal, "pthread_sigmask", None), getattr(_signal, "SIG_BLOCK", 0)
except (ImportError, AttributeError):          # no interval timers here: the sampler does nothing either
    _getitimer = None

_switch, _ident, _MAIN = sys.getswitchinterval, threading.get_ident, threading.main_thread().ident
EVERY = 0.02
STOPPED = ("your code stopped the grader's sampler ({}) while {} was graded: lab 06 samples the running "
           "code -- leave signals and timers alone")


class Watch:
    """Started right after ``sampler.__enter__()`` (main thread), :meth:`stop` before its ``__exit__``;
    what differs goes to ``stopped`` (its first finding only). Elsewhere it does nothing."""

    def __init__(self, sampler, stopped: list):
        self.stopped, self.on, self.thread = stopped, _getitimer is not None and _ident() == _MAIN, None
        if not self.on:
            return
        self.handler, self.interval = _getsignal(_SIGPROF), sampler.interval
        self.alarm, self.real = _getsignal(_SIGALRM), _getitimer(_REAL)
        self.switch, self.masked = _switch(), self._masked()
        self.note(self.check() or (["the SIGPROF handler"] if self.handler != sampler._tick else []))
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="gpumem-lab06-timer")
        self.thread.start()

    def check(self) -> list[str]:
        """What differs now from what the grader set ([] when nothing)."""
        out = []
        if _getsignal(_SIGPROF) is not self.handler:
            out.append("the SIGPROF handler")
        value, every = _getitimer(_PROF)
        if not value > 0 or abs(every - self.interval) > 1e-4 or value > 2 * every + 0.005:
            out.append(f"the profiling timer ({value:g} s, every {every:g} s)")
        if _getsignal(_SIGALRM) is not self.alarm:
            out.append("the SIGALRM handler")
        value, every = _getitimer(_REAL)
        if every != self.real[1] or (self.real[0] > 0) != (value > 0) or value > max(self.real[0], every) + 0.5:
            out.append(f"the real-time timer ({value:g} s, every {every:g} s)")
        if _switch() != self.switch:
            out.append(f"the switch interval ({_switch():g} s)")
        return out

    def note(self, found: list[str]) -> None:
        if found and not self.stopped:
            self.stopped.append(", ".join(found))

    def tick(self) -> None:
        """A sample's look (the sampler calls it first; it only notes, it never raises)."""
        if self.on and not self.stopped:
            self.note(self.check())

    def _run(self) -> None:
        while not self.done.wait(EVERY):
            self.note(self.check())

    def _masked(self) -> bool:
        return _mask is not None and _SIGPROF in _mask(_BLOCK, [])

    def stop(self) -> None:
        """The last look, after the call (SIGPROF blocked in the main thread counts too); the thread ends."""
        if not self.on:
            return
        self.done.set()
        self.thread.join()
        self.note(self.check() + (["SIGPROF blocked"] if self._masked() and not self.masked else []))
        self.on = False
