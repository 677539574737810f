"""Lab 08's guard: while one call of the learner's runs, gpumem's own fine-tuning counts refuse.

Refused (:data:`BLOCKED`) is their *code*, wherever it is called from: a profile hook
(``sys.setprofile``, and ``threading.setprofile`` for threads the call starts) refuses every call
into a function defined at those places (file, name), so a reference saved before grading or a
``types.FunctionType`` copy refuses alike. A copy of their source run under another name
(``exec(compile(inspect.getsource(finetune), "<mine>", "exec"))``) is refused by content
(:class:`gpumem.course.copy_watch.Prints`), and so is any code that is neither a notebook cell's
nor an installed file's (:func:`allowed`: code compiled from a string or a learner's own module,
however rewritten). Known gaps (review r11): a rewritten copy pasted into a cell, or compiled under
a cell's name with a linecache entry, or run with ``GPUMEM_TEST_CELLS`` set, is beyond it.
Switching the hook off or assigning a function's ``__code__`` while the call runs is refused by an
audit hook, and every refusal is recorded, so a learner who catches the exception is still
reported. Lab 05's guard does the same for its lab.

Reaching the grader's frames (``sys._getframe``, ``inspect``, ``traceback``, a traceback's or a
generator's frame), the collector's object lists, or starting another process, all from the
learner's call, are refused by an audit hook (the drawn answers sit in the grader's
frames while the call runs): :mod:`gpumem.course.lab_audit`, shared with labs 05 and 06. What it
cannot stop: answers computed before grading (the cases are drawn at check time, so a table made
then holds none of them).
"""

import contextlib
import linecache
import os
import re
import sys
import tempfile
import threading

from gpumem.course import copy_watch, genuine, lab_audit
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


# A notebook cell's file name: ipykernel's (a temporary folder per kernel, a number per cell),
# IPython's older one, the course's tests' (tests/test_labs.py), or the kernel's IPYKERNEL_CELL_NAME.
# ipykernel names cells under tempfile.gettempdir() as it is, not resolved: both forms are taken
# (review r11: on macOS the temporary folder is behind a symlink, and the resolved form alone
# refused the solution's own cells).
_TMP = "|".join(sorted({re.escape(tempfile.gettempdir()), re.escape(os.path.realpath(tempfile.gettempdir()))}))
_CELL = re.compile(r"<ipython-input-\d+-[0-9a-f]+>|<[^<>]+\.ipynb cell \d+>|"
                   + f"(?:{_TMP})" + r"[/\\]ipykernel_\d+[/\\]\d+\.py")
_ORIGIN: dict = {}      # code object -> where it comes from is allowed (checked once per code)


def allowed(code) -> bool:
    """True for code a notebook cell defines (its name is a cell's and its source is in linecache,
    where IPython keeps cells) or that its installed file defines (:func:`genuine.genuine`);
    False for code compiled from a string or loaded from a file the learner wrote (review r10: a
    generic AST rewrite of the library, exec'd under another name, beat the content match).
    ``GPUMEM_TEST_CELLS`` (os.pathsep-separated) adds the file names the course's tests write
    learners' code in; a learner who sets it has stepped round the rule on purpose."""
    if code not in _ORIGIN:
        name = code.co_filename
        cell = (bool(_CELL.fullmatch(name)) or name == os.environ.get("IPYKERNEL_CELL_NAME")) \
            and bool(linecache.getlines(name)) or name in os.environ.get("GPUMEM_TEST_CELLS", "").split(os.pathsep)
        _ORIGIN[code] = cell or genuine.genuine(code) or _frozen(code) or _generated(code)
    return _ORIGIN[code]


def _generated(code) -> bool:
    """Code the standard library writes and compiles itself (no file): a dataclass's methods
    (``dataclasses._create_fn``) and a namedtuple's ``__new__`` (a lambda calling ``_tuple_new``)."""
    return code.co_filename == "<string>" and (
        code.co_qualname.startswith("__create_fn__.<locals>.")
        or (code.co_qualname == "<lambda>" and code.co_names == ("_tuple_new",)))


def _frozen(code) -> bool:
    """Code of a module frozen into the interpreter (``<frozen codecs>``), as the interpreter has it."""
    found = re.fullmatch(r"<frozen ([\w.]+)>", code.co_filename)
    if not found:
        return False
    try:
        import _imp
        name = found.group(1)           # importlib's bootstrap is frozen under an alias
        top = _imp.get_frozen_object({"importlib._bootstrap": "_frozen_importlib", "importlib._bootstrap_external":
                                      "_frozen_importlib_external"}.get(name, name))
    except ImportError:
        return False
    stack = [top]
    while stack:
        c = stack.pop()
        if c.co_qualname == code.co_qualname and genuine.same(c, code):
            return True
        stack += [k for k in c.co_consts if isinstance(k, type(code))]
    return False


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
        if not allowed(code):
            hits.append(f"it ran {code.co_qualname} from {code.co_filename}, neither a notebook cell nor an "
                        "installed library: while graded, only your cells' code and installed libraries run")
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
