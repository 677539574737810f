"""Lab 08's guard: while one call of the learner's runs, gpumem's own fine-tuning counts refuse,
and so does chapter 01's activation engine they are built on (review r14 #2).

Refused (:data:`BLOCKED`) is their *code*, wherever it is called from: a profile hook
(``sys.setprofile``, and ``threading.setprofile`` for threads the call starts) refuses every call
into a function defined at those places (file, name), so a reference saved before grading or a
``types.FunctionType`` copy refuses alike. A copy of their source run under another name
(``exec(compile(inspect.getsource(finetune), "<mine>", "exec"))``) is refused by content
(:class:`gpumem.course.copy_watch.Prints`), and so is any code that is neither a notebook cell's
nor an installed file's (:func:`allowed`, the course's origin rule, :mod:`gpumem.course.lab_origin`:
code compiled from a string or a learner's own module, however rewritten; in a kernel a cell is
one IPython ran, by its compiler's and its history's records, so a forged cell name, a file under
``/tmp/ipykernel_N/`` or ``GPUMEM_TEST_CELLS`` set from a cell no longer pass, review r11). Known
gaps: a rewritten copy pasted into a cell (or run through ``get_ipython().run_cell``) is a cell's
code, and so is a source a cell writes into IPython's own records (its history and compiler map).
The hook watches the call's thread and those it starts; for threads started before grading, each
blocked function's code is swapped for a refusing stub while the call runs (:func:`_swap`; review
r12: a worker thread disguised as the course's ran the truth, 14/14 from the blank lab), so only a
``types.FunctionType`` copy made before grading and run in such a thread escapes it (its own calls
into the other blocked functions still refuse).
Switching the hook off or assigning a function's ``__code__`` while the call runs is refused by an
audit hook, and every refusal is recorded, so a learner who catches the exception is still
reported. Lab 05's guard does the same for its lab.

Reaching the grader's frames (``sys._getframe``, ``inspect``, ``traceback``, a traceback's or a
generator's frame), the collector's object lists, or starting another process, all from the
learner's call, are refused by an audit hook (the drawn answers sit in the grader's
frames while the call runs): :mod:`gpumem.course.lab_audit`, shared with labs 05 and 06. What it
cannot stop: answers computed before grading. The cases are drawn at check time, so a table made
then holds none of them, but a closed form fitted then to the course's own counts over many drawn
models covers them all (review r19: ``activation_peak`` fitted exactly, 27 branches of 58 terms,
15/15): an exact fit *is* the count, and no grader can tell it from a derived one.
"""

import contextlib
import gc
import importlib.util
import sys
import threading
import types

from gpumem.course import copy_watch, lab_audit, lab_intact, lab_origin
from gpumem.course.case_limits import alarm_held
from gpumem.course.plain import plain
from gpumem.memory import (accounting, activation_parts, activations, finetune, finetune_acts, finetune_fsdp,
                           finetune_setup, gpus, megatron, models)
from gpumem.timing import finetune_time

from . import lab_acts, lab_draw, scale

REFUSAL = "count it yourself: gpumem's fine-tuning counts are off while lab 08 is graded"


def _own(module) -> list[str]:
    """The names of a module's own functions (not its classes, not what it imports)."""
    return [n for n, f in vars(module).items() if callable(f) and getattr(f, "__module__", "") == module.__name__
            and not isinstance(f, type)]


# chapter 01's activation engine and its building blocks too (review r14 #2: activations.activations
# is full fine-tuning's peak, and finetune_acts builds the others from its *_terms)
_NAMES = {finetune: _own(finetune), activations: _own(activations), activation_parts: _own(activation_parts),
          finetune_acts: ["copy_bytes", "layer_saved", "finetune_activations"],
          finetune_setup: ["validate", "matrices", "adapter_tensors", "lora_params"],
          finetune_fsdp: ["fsdp_states"],
          finetune_time: ["lora_flops", "step_flops", "dequant_bytes", "dequant_seconds"],
          accounting: ["model_states"], gpus: ["usable", "of"], scale: ["usable", "base_offloaded", "need"],
          megatron: ["reconcile"],                     # r21: its Llama column is the per-layer count
          lab_draw: ["truth", "nf4_constants", "prepare_cast"],
          models: ["n_params", "layer_params", "attention_params", "mlp_params", "expert_params",
                   "embedding_params", "norm_params"]}
_METHODS = {(gpus, "of"): "Reserve.of"}     # review r23: "gpumem.memory.gpus.of" named no function there
# gpumem's tracers measure a step (its activation peak, its states) instead of counting it: refused by
# name (review r28 #5: they were refused only because torch's MemTracker walks the stack). Found by
# file, not imported here (they load torch, seconds); tracing.trace_step is tracer.trace_step.
# review r31 #6: hf_trace's and tracer.build_with too (refused before only by the frame rule FakeTensorMode trips)
_TRACERS = {"gpumem.memory.tracer": ("trace_step", "build", "build_with"), "gpumem.memory.trace_compose": ("trace_fast",),
            "gpumem.memory.timeline": ("record", "recorded", "_recorded"),
            "gpumem.memory.lora_trace": ("trace_ft", "saved_by_role"), "gpumem.memory.finetune_build": ("build_ft",),
            "gpumem.memory.hf_trace": ("saved_tensors", "trace_hf", "build_hf")}
BLOCKED = types.MappingProxyType({**{(m.__file__, n): f"{m.__name__}.{_METHODS.get((m, n), n)}" for m, names in
                                     _NAMES.items() for n in names},
                                  **{(importlib.util.find_spec(m).origin, n): f"{m}.{n}" for m, names in
                                     _TRACERS.items() for n in names}})   # read-only (review r18: dict.clear)
_ACTIVE: list[list[str]] = []
_FUNCS: list = []                 # the blocked functions themselves, found once a check (:func:`refresh`)
_LOADED: set = set()              # the gpumem modules loaded when the check began
_HOOKED: list = []
_PRINTS: list = []


def prints() -> copy_watch.Prints:
    """Content fingerprints of the library's fine-tuning counts, built once."""
    if not _PRINTS:
        # r20: activations, activation_parts, finetune_acts and lab_acts pasted word for word: 15/15;
        # finetune_acts' nested saved_before is a generic sum (zero3_schedule's gather matched it)
        _PRINTS.append(copy_watch.Prints([(m, m.__name__) for m in (finetune, finetune_setup, activations,
                                          activation_parts, finetune_acts, finetune_fsdp, lab_acts, scale)],
                                         least=25, skip=("saved_before",)))
    return _PRINTS[0]


def _audit(event, args):
    """Switching the profile hook off, assigning ``__code__`` or importing a second copy of a gpumem
    module loaded when the check began (review r14: a copy escapes the code swap) while the
    learner's call runs (the grader's frames and other processes: :mod:`gpumem.course.lab_audit`)."""
    if event not in ("sys.setprofile", "object.__setattr__", "import") or not _ACTIVE:
        return
    hits = _ACTIVE[-1]
    if event == "import":
        if args and args[0] in _LOADED:
            name = f"it imported a second copy of {args[0]} (the grader's truth runs only as loaded)"
            hits.append(name)
            raise RuntimeError(f"{REFUSAL} ({name})")
        return
    caller = sys._getframe(1)      # its own audit event: lab_audit exempts gpumem's code
    if event == "sys.setprofile":
        if hits or caller.f_code is no_library_counts.__wrapped__.__code__ or caller.f_code.co_filename == threading.__file__:
            return
        name = "it called sys.setprofile (switching the grader's watch off)"
    else:
        if len(args) <= 1 or args[1] != "__code__":
            return
        name = "it assigned a function's __code__ (swapping code objects)"
    hits.append(name)
    raise RuntimeError(f"{REFUSAL} ({name})")


# The origin rule (which code may run while graded) is the course's: gpumem.course.lab_origin,
# shared with lab 06; its names stay importable from here.
_TMP, _CELL = lab_origin._TMP, lab_origin._CELL
_generated, _frozen = lab_origin._generated, lab_origin._frozen


def allowed(code) -> bool:
    """True for code a notebook cell defines or an installed file defines; False for code compiled
    from a string, loaded from a file the learner wrote, or compiled under a cell's name that is
    not a cell IPython ran (:func:`gpumem.course.lab_origin.allowed`, reviews r10 and r11)."""
    return lab_origin.allowed(code)


def _watch(hits: list):
    copies, origins = prints(), {}          # codes decided, this call's own (lab_origin.allowed)

    def watch(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        name = BLOCKED.get((code.co_filename, code.co_name))
        if name:
            hits.append(f"it called {name}")
            raise RuntimeError(f"{REFUSAL} (it called {name})")
        copied = copies.copied(frame)
        if copied:
            hits.append(f"it ran a copy of {copied} (the library's code under another name)")
            raise RuntimeError(f"{REFUSAL} ({hits[-1]})")
        if not lab_origin.allowed(code, origins):
            hits.append(lab_origin.where(code))
            raise RuntimeError(f"{REFUSAL} ({hits[-1]})")
    watch.graders_refusals = hits           # lab_watch: its refusal unsets it (review r23)
    return watch


def _refusing_stub(*args, **kwargs):
    """The body every blocked function takes while a call is graded, in every thread (review r12:
    a thread started before the check ran the grader's truth unwatched): it records the refusal."""
    return __import__("gpumem.chapters.ch08_finetuning.lab_guard", fromlist=["_refused"])._refused("NAME")


def _refused(name: str):
    if _ACTIVE:
        _ACTIVE[-1].append(f"it called {name} (from a thread the grader does not watch)")
        raise RuntimeError(f"{REFUSAL} ({_ACTIVE[-1][-1]})")
    raise RuntimeError(f"{name} ran while its code was swapped out; run it again")


def refresh() -> None:
    """At the start of a check: find the blocked functions again, copies included (:func:`_functions`),
    and note the gpumem modules loaded now (a second import of one while graded is refused)."""
    _FUNCS.clear()
    _LOADED.clear()
    _LOADED.update(k for k in sys.modules if k == "gpumem" or k.startswith("gpumem."))
    _functions()


def _functions() -> list:
    """Every function object whose code :data:`BLOCKED` names, found by the collector: the modules'
    functions and class methods, and any other function object with such code (review r14: a
    second import of gpumem's modules, made before the check and set aside, kept unswapped copies
    that a raw thread ran for 15/15)."""
    if not _FUNCS:
        for f in gc.get_objects():
            code = getattr(f, "__code__", None) if type(f) is types.FunctionType else None
            if code is not None and not code.co_freevars and (code.co_filename, code.co_name) in BLOCKED:
                _FUNCS.append(f)
    return _FUNCS


@contextlib.contextmanager
def _swap():
    """While the block runs every blocked function's code is a stub that refuses, whichever thread
    calls it and through whatever reference (Python 3.11 cannot profile threads already running)."""
    saved, stub = [(f, f.__code__) for f in _functions()], _refusing_stub.__code__
    try:
        for f, code in saved:
            f.__code__ = stub.replace(co_name=code.co_name, co_qualname=code.co_qualname,
                                      co_filename=code.co_filename, co_firstlineno=code.co_firstlineno,
                                      co_consts=tuple(BLOCKED[code.co_filename, code.co_name] if c == "NAME" else c
                                                      for c in stub.co_consts))
        yield
    finally:
        for f, code in saved:
            f.__code__ = code


@contextlib.contextmanager
def no_library_counts():
    """Inside the block every function of :data:`BLOCKED` refuses; yields the list of refusals."""
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(True)
    hits: list[str] = []
    lab_origin.note_kernel()          # IPython's run_code on this stack: cells are known by its records
    previous, previous_threads = sys.getprofile(), threading.getprofile()
    watch = _watch(hits)
    swapped = _swap()
    try:
        with alarm_held():
            swapped.__enter__()            # before the audit hook refuses __code__ assignments
            sys.setprofile(watch)
            threading.setprofile(watch)
            _ACTIVE.append(hits)
        with lab_audit.refusing(REFUSAL, hits):
            yield hits
        if sys.getprofile() is not watch and not hits:
            hits.append("it switched the grader's watch off")
    finally:
        with alarm_held():
            if _ACTIVE and _ACTIVE[-1] is hits:
                _ACTIVE.pop()
            sys.setprofile(previous)
            threading.setprofile(previous_threads)
            swapped.__exit__(None, None, None)


def guarded(fn):
    """``fn`` wrapped so that each call runs under :func:`no_library_counts`; a refusal, even one
    the learner caught, becomes an error naming what was called."""
    def run(*args, **kwargs):
        with no_library_counts() as hits:
            try:
                result = plain(fn(*args, **kwargs))     # read now, under the guard (gpumem.course.plain)
            except Exception:
                if hits:
                    raise RuntimeError(f"{REFUSAL} ({hits[0]})") from None
                raise
        if hits or (hits := [w for w in (lab_intact.now(),) if w]):   # a library changed in the call
            raise RuntimeError(f"{REFUSAL} ({hits[0]})")
        return result
    return run
