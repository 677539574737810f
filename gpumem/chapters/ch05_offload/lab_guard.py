"""Lab 05's guard: while one call of the learner's runs, gpumem's own counts refuse ("count it yourself").

Refused (:data:`.lab_reference.BLOCKED`, and the grader's own answers: :mod:`.lab_reference`'s
functions, and those marked :func:`keep`: :func:`.lab_gpu.reference_seconds`) is their *code*,
wherever it is called from: a profile hook (``sys.setprofile``, and ``threading.setprofile`` for
threads the call starts) refuses every call into a function defined at those places (file, name),
so a reference saved before grading, a ``types.FunctionType`` copy, a ``__code__`` saved at load and
put back inside the call, or a function exec'd under the time engine's module name refuse alike.
Nothing is swapped and no original is parked anywhere. The grader's answers also refuse from their
own body (``sys.audit(AUDIT)``, seen by an audit hook the learner cannot remove).

The time engine's schedules and traffic counts refuse as well (part 3 asks for that mechanism);
its links (``datasheet_links``) stay open. Should an engine function that is not refused reach
``accounting.model_states``, a call whose caller *frame* runs one of :mod:`gpumem.timing.offload_time`'s
or :mod:`gpumem.memory.offload_cost`'s own code objects with that module's own globals goes
through (a module's name proves nothing). While the call runs,
switching the profile hook off (``sys.setprofile``) or assigning any function's ``__code__`` is
refused too (audit events), and every refusal is recorded: a learner who catches the exception is
still reported. After the call, the blocked functions' ``__code__`` must be the one their module
defined. Everything is put back with SIGALRM held (as lab 03's guard does).

A copy of those answers' code run under another name (``exec(compile(inspect.getsource(...),
"<mine>", "exec"))``, its guard lines taken out) is refused too: the profile hook matches each new
code object's content against the answers compiled afresh (:mod:`gpumem.course.copy_watch`), and
against the time engine's ``step_time`` and traffic counts (:data:`_LIBRARY`). And
the answers refuse before grading as well, from any caller but the grader (``graders_only``), so
no table can be made from them at definition time.

Reaching the grader's frames (``sys._getframe``, ``inspect``, a traceback's or a generator's frame),
the collector's object lists, or starting another process, from the learner's call, are refused
too (:mod:`gpumem.course.lab_audit`, shared with labs 06 and 08); the expected answers are computed
after the call returns besides (``labcheck``).

While the call runs, only a notebook cell's code and installed code may run (the course's origin
rule, :func:`gpumem.course.lab_origin.allowed_here`, shared with lab 06; without a kernel, as in the
course's tests, a file on disk counts too, a string compiled under a made-up name does not):
review r13's generic AST
rewrite of ``accounting``, ``offload_cost``, ``offload_time`` and :mod:`.lab_reference`, exec'd
under another name at definition time, matched no content print and passed 13/13; its code is
refused where it runs.

What it cannot stop: a rewritten copy *pasted* into a cell (a cell's code), and a table made
before grading, at definition time, from the library's public counts (``accounting.model_states``,
``offload_time.step_time``) or a copy of :mod:`.lab_reference` run then, fitted to the drawn cases
(the counts are linear in the shard and the model size; the seconds are not, but follow from a few
such terms). During the call neither can answer: the reference's counts are the library's, which
refuse there.
"""

import contextlib
import importlib
import sys
import threading
from types import MappingProxyType

from gpumem.course import copy_watch, lab_audit, lab_intact, lab_origin
from gpumem.course.case_limits import alarm_held
from gpumem.course.plain import plain
from gpumem.memory import offload_cost
from gpumem.timing import offload_time

from . import lab_reference as ref

AUDIT = ref.AUDIT
_ACTIVE: list[list[str]] = []          # the refusals of the guards now running (innermost last)


def _functions(module) -> list:
    return [f for f in vars(module).values() if getattr(f, "__module__", None) == module.__name__
            and hasattr(f, "__code__")]


def _blocked() -> dict[tuple[str, str], str]:
    """(file, function name) -> the name shown, for every refused function (where it is defined,
    so a replaced ``__code__`` does not move it)."""
    out = {}
    for module, attr in ref.BLOCKED:
        out[(module.__file__, attr)] = f"{module.__name__}.{attr}"
    for f in _functions(ref):
        out[(ref.__file__, f.__name__)] = f"the grader's answer {ref.__name__}.{f.__name__}"
    return out


_TABLE = _blocked()                  # keep() adds the lab's own functions as they load
BLOCKED = MappingProxyType(_TABLE)   # read-only to everyone else (review r18: dict.clear(BLOCKED))
# the time engine's own code objects and the globals they must run with (their callers pass)
ENGINE = {f.__code__: vars(m) for m in (offload_time, offload_cost) for f in _functions(m)}
_HOOKED = []


def _audit(event, args):
    """Refusals that do not depend on the profile hook: the answers' own ``sys.audit(AUDIT)``,
    switching the hook off, assigning ``__code__`` while a learner's call runs."""
    if event not in (AUDIT, "sys.setprofile", "object.__setattr__"):
        return
    hits = getattr(sys.getprofile(), "lab05_hits", None)    # the watch in place: _ACTIVE emptied proves nothing
    if hits is None:
        if not _ACTIVE:
            return
        hits = _ACTIVE[-1]
    caller = sys._getframe(1)
    if event == AUDIT:
        name = f"it called the grader's answer {caller.f_code.co_name}"
    elif event == "sys.setprofile":
        if hits or caller.f_code is no_library_counts.__wrapped__.__code__ or caller.f_code.co_filename == threading.__file__:
            return              # the guard itself, a new thread taking the watch, the hook unset after a refusal
        name = "it called sys.setprofile (switching the grader's watch off)"
    elif len(args) > 1 and args[1] == "__code__":
        name = "it assigned a function's __code__ (swapping code objects)"
    else:
        return
    hits.append(name)
    raise RuntimeError(f"{ref.REFUSAL} ({name})")


def _allowed(frame) -> bool:
    """True if ``frame``'s caller is the time engine's own code with its own globals."""
    caller = frame.f_back
    return caller is not None and ENGINE.get(caller.f_code) is caller.f_globals


_PRINTS: list = []
_KEPT: list = [(ref, "the grader's answer lab_reference", ("rung_bytes", "choose"))]   # and keep()'s


# the library's counts and the time engine part 3 asks the learner to write (review r8: an
# unchanged copy of offload_time + offload_cost answered part 3); stock_schedule and
# ideal_schedule are under the 40-instruction floor, _split (which both call) is not
_LIBRARY = [("gpumem.memory.accounting", ("model_states",)),
            ("gpumem.timing.offload_time", ("step_time", "_split")),
            ("gpumem.memory.offload_cost", ("traffic_parts", "gradient_trip", "offload_traffic")),
            ("gpumem.runs.ds_offload", ("swap_files",)),       # part 2's file sizes (review r13 #2)
            ("gpumem.timing.grad_swap", ("exposed_seconds",))]  # part 3's buffers (review r23: pasted)


def prints() -> copy_watch.Prints:
    """The content fingerprints of the grader's answers (:data:`_KEPT`: the reference's, and those
    marked :func:`keep`), of the library's count (``accounting.model_states``) and of the time
    engine's step and traffic (:data:`_LIBRARY`), built once."""
    if not _PRINTS:
        modules = [(m, label) for m, label, _ in _KEPT]
        modules += [(importlib.import_module(name), name) for name, _ in _LIBRARY]
        only = [n for *_, names in _KEPT for n in names] + [n for _, names in _LIBRARY for n in names]
        _PRINTS.append(copy_watch.Prints(modules, only=only))
    return _PRINTS[0]


def _watch(hits: list):
    copies, origins = prints(), {}          # codes decided, this call's own (lab_origin.allowed)

    def watch(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        name = BLOCKED.get((code.co_filename, code.co_name))
        if name and not (code.co_name == "model_states" and _allowed(frame)):
            hits.append(f"it called {name}")
            raise RuntimeError(f"{ref.REFUSAL} (it called {name})")
        copied = copies.copied(frame)
        if copied:
            hits.append(f"it ran a copy of {copied} (the same code under another name)")
            raise RuntimeError(f"{ref.REFUSAL} ({hits[-1]})")
        if not lab_origin.allowed_here(code, origins):
            hits.append(lab_origin.where(code))
            raise RuntimeError(f"{ref.REFUSAL} ({hits[-1]})")
    watch.lab05_hits = watch.graders_refusals = hits     # lab_watch: its refusal unsets it
    return watch


ORIGINALS = [(getattr(m, a), m, a) for m, a in [*ref.BLOCKED, *((ref, f.__name__) for f in _functions(ref))]]


def keep(what: str):
    """Decorator: the grader's own function refused too (``what`` names it in the row); for the
    lab's modules that import this one (:func:`.lab_gpu.reference_seconds`)."""
    def register(fn):
        module = sys.modules[fn.__module__]
        _TABLE[(module.__file__, fn.__name__)] = f"{what} {fn.__module__}.{fn.__name__}"
        _KEPT.append((module, f"{what} {fn.__module__.rsplit('.', 1)[-1]}", (fn.__name__,)))
        _PRINTS.clear()
        ORIGINALS.append((fn, module, fn.__name__))
        return fn
    return register


def changed_code() -> str:
    """The first blocked function whose ``__code__`` is no longer the one defined where its module
    is ('' if none): the function objects as this module found them on import."""
    for fn, module, attr in ORIGINALS:
        code = fn.__code__
        if (code.co_filename, code.co_name) != (module.__file__, attr):
            return f"{module.__name__}.{attr}"
    return ""


@contextlib.contextmanager
def no_library_counts():
    """Inside the block every function of :data:`BLOCKED` refuses; yields the list of refusals."""
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(True)
    hits: list[str] = []
    lab_origin.note_kernel()          # IPython's run_code on this stack: cells are known by its records
    swapped = changed_code()
    if swapped:
        raise RuntimeError(f"{ref.REFUSAL} (the code of {swapped} was replaced before grading)")
    previous, previous_threads = sys.getprofile(), threading.getprofile()
    watch = _watch(hits)
    try:
        with alarm_held():
            sys.setprofile(watch)
            threading.setprofile(watch)
            _ACTIVE.append(hits)
        with lab_audit.refusing(ref.REFUSAL, hits):
            yield hits
        if sys.getprofile() is not watch and not hits:
            hits.append("it switched the grader's watch off")
    finally:
        with alarm_held():
            if _ACTIVE and _ACTIVE[-1] is hits:
                _ACTIVE.pop()
            sys.setprofile(previous)
            threading.setprofile(previous_threads)
    swapped = changed_code()
    if swapped and not hits:
        hits.append(f"it replaced the code of {swapped}")


def guarded(fn):
    """``fn`` wrapped so that each call runs under :func:`no_library_counts`; a refusal, even one
    the learner caught, becomes an error naming what was called."""
    def run(*args, **kwargs):
        with no_library_counts() as hits:
            try:
                result = plain(fn(*args, **kwargs))     # read now, under the guard (gpumem.course.plain)
            except Exception:
                if hits:
                    raise RuntimeError(f"{ref.REFUSAL} ({hits[0]})") from None
                raise
        if hits or (hits := [w for w in (lab_intact.now(),) if w]):   # a library changed in the call
            raise RuntimeError(f"{ref.REFUSAL} ({hits[0]})")
        return result
    return run
