"""Lab 08's guard: while one call of the learner's runs, gpumem's own fine-tuning counts refuse.

Refused (:data:`BLOCKED`) is their *code*, wherever it is called from: a profile hook
(``sys.setprofile``, and ``threading.setprofile`` for threads the call starts) refuses every call
into a function defined at those places (file, name), so a reference saved before grading or a
``types.FunctionType`` copy refuses alike. A copy of their source run under another name
(``exec(compile(inspect.getsource(finetune), "<mine>", "exec"))``) is refused by content
(:class:`gpumem.course.copy_watch.Prints`). Switching the hook off or assigning a function's
``__code__`` while the call runs is refused by an audit hook, and every refusal is recorded, so a
learner who catches the exception is still reported. Lab 05's guard does the same for its lab.

Reaching the grader's frames (``sys._getframe``, ``inspect``, ``traceback``, a traceback's or a
generator's frame), the collector's object lists, or starting another process, all from the
learner's call, are refused by an audit hook (the drawn answers sit in the grader's
frames while the call runs): :mod:`gpumem.course.lab_audit`, shared with labs 05 and 06. What it
cannot stop: answers computed before grading (the cases are drawn at check time, so a table made
then holds none of them).
"""

import contextlib
import sys
import threading

from gpumem.course import copy_watch, lab_audit
from gpumem.course.case_limits import alarm_held
from gpumem.course.plain import plain
from gpumem.memory import accounting, finetune, finetune_acts, finetune_setup, gpus, models

from . import lab_draw, scale

REFUSAL = "count it yourself: gpumem's fine-tuning counts are off while lab 08 is graded"
_NAMES = {finetune: [n for n, f in vars(finetune).items() if callable(f) and getattr(f, "__module__", "") == finetune.__name__
                     and not isinstance(f, type)],
          finetune_acts: ["copy_bytes", "layer_saved", "finetune_activations"],
          finetune_setup: ["validate", "matrices", "adapter_tensors", "lora_params"],
          accounting: ["model_states"], gpus: ["usable", "of"], scale: ["usable"],
          lab_draw: ["truth", "nf4_constants"],
          models: ["n_params", "layer_params", "attention_params", "mlp_params", "expert_params",
                   "embedding_params", "norm_params"]}
BLOCKED = {(m.__file__, n): f"{m.__name__}.{n}" for m, names in _NAMES.items() for n in names}
_ACTIVE: list[list[str]] = []
_HOOKED: list = []
_PRINTS: list = []


def prints() -> copy_watch.Prints:
    """Content fingerprints of the library's fine-tuning counts, built once."""
    if not _PRINTS:
        _PRINTS.append(copy_watch.Prints([(finetune, "gpumem.memory.finetune"),
                                          (finetune_setup, "gpumem.memory.finetune_setup")], least=25))
    return _PRINTS[0]


def _audit(event, args):
    """Switching the profile hook off or assigning ``__code__`` while the learner's call runs (the
    grader's frames and other processes: :mod:`gpumem.course.lab_audit`)."""
    if event not in ("sys.setprofile", "object.__setattr__") or not _ACTIVE:
        return
    hits = _ACTIVE[-1]
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


def _watch(hits: list):
    copies = prints()

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
    return watch


@contextlib.contextmanager
def no_library_counts():
    """Inside the block every function of :data:`BLOCKED` refuses; yields the list of refusals."""
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(True)
    hits: list[str] = []
    previous, previous_threads = sys.getprofile(), threading.getprofile()
    watch = _watch(hits)
    try:
        with alarm_held():
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
        if hits:
            raise RuntimeError(f"{REFUSAL} ({hits[0]})")
        return result
    return run
