"""Lab 02 Part 2's guard: while the learner's ``predict_exposed_seconds`` runs, the grader's own
count refuses ("price it yourself").

Refused is the *code* of every function :mod:`.lab02_predict` defines (``exposed``, its lines
``_line``, its buckets ``buckets``, the hints' counts: the answer and each of its parts), wherever
it is called from. A profile hook (``sys.setprofile``, and ``threading.setprofile`` for threads)
refuses every call into code whose file is that module's, so a reference taken before grading, a
wrapper that calls it, or a copy of its function object refuse alike (review r15 #3: a ``def``
calling ``E``, imported as ``exposed`` in another cell, passed 6/6 rows; ``functools.partial(exposed)``
did too, and is refused before it runs as not a function, :func:`.lab02_predict._borrowed`). While
the call runs only a notebook cell's code and installed code may run (the course's origin rule,
:func:`gpumem.course.lab_origin.allowed_here`: the count's source compiled from a string under
another name is neither), and reaching the grader's frames or the collector's lists, switching
the hook off (``sys.setprofile``) or starting a thread or a process are refused
(:mod:`gpumem.course.lab_audit`, shared with labs 05, 06 and 08, whose guards this one follows).
Every refusal is recorded, so one the learner catches is still reported.

What it cannot stop: the count rewritten or pasted into a cell (that is the learner's own code),
and a table made before grading (the run's bucket sizes are drawn at check time).
"""

import os
import sys
import threading

from gpumem.course import lab_audit, lab_origin
from gpumem.course.case_limits import alarm_held
from gpumem.course.plain import plain

REFUSAL = "price it yourself: the grader's own count is off while predict_exposed_seconds is graded"
BLOCKED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lab02_predict.py")


def _watch(hits: list):
    origins: dict = {}                # codes decided, this call's own (lab_origin.allowed)

    def watch(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename == BLOCKED:
            hits.append(f"it called the grader's {code.co_name} (lab02_predict)")
            raise RuntimeError(f"{REFUSAL} ({hits[-1]})")
        if not lab_origin.allowed_here(code, origins):
            hits.append(lab_origin.where(code))
            raise RuntimeError(f"{REFUSAL} ({hits[-1]})")
    watch.graders_refusals = hits           # lab_watch: its refusal unsets it (review r23)
    return watch


def guarded(fn):
    """``fn`` wrapped so that each call runs with the grader's count refused; a refusal, even one
    the learner caught, becomes an error naming what was called."""
    def run(*args, **kwargs):
        hits: list[str] = []
        lab_origin.note_kernel()          # IPython's run_code on this stack: cells are known by its records
        previous, previous_threads = sys.getprofile(), threading.getprofile()
        watch = _watch(hits)
        try:
            with alarm_held():
                sys.setprofile(watch)
                threading.setprofile(watch)
            with lab_audit.refusing(REFUSAL, hits):
                try:
                    result = plain(fn(*args, **kwargs))     # read now, under the guard
                except Exception:
                    if hits:
                        raise RuntimeError(f"{REFUSAL} ({hits[0]})") from None
                    raise
            if sys.getprofile() is not watch and not hits:
                hits.append("it switched the grader's watch off")
        finally:
            with alarm_held():
                sys.setprofile(previous)
                threading.setprofile(previous_threads)
        if hits:
            raise RuntimeError(f"{REFUSAL} ({hits[0]})")
        return result
    return run
