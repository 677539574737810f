"""Lab 01's guard: while a learner's function runs, the course's own answers are switched off.

Every plain function of the modules in :data:`MODULES` (gpumem's formulas, tracers and this
chapter's truth functions) has its code swapped for one that raises ``RuntimeError("... derive
it yourself")``: a reference the learner bound earlier (``from gpumem.memory.activations import
layer_parts``, a lambda's default) is switched off too, which renaming a module attribute would
miss. The truth functions cache in plain dicts inside their code, so no cache answers either.
Tracing tools are refused the same way (saved-tensor hooks, ``FakeTensorMode``, ``MemTracker``,
subprocesses), and autograd records nothing (``torch.no_grad``, which ``enable_grad``,
``set_grad_enabled`` and ``torch._C._set_grad_enabled`` cannot lift).

A formula needs no tensor at all: while the learner's function runs, a ``TorchDispatchMode`` and a
``TorchFunctionMode`` refuse every tensor operation ("no tensor ops: derive the count, do not
measure it"), so a copy of the course's code loaded under another name, a model of the learner's own
or a walk over ``grad_fn._saved_*`` has nothing to run on. The answer is read at once, inside the
guard (:func:`gpumem.course.plain.read_now`, review r20). The ways out of those modes that Python can
reach are refused during the call, and after it the grader checks the modes are still in place and
recording is still off. Copies of the guarded files in ``sys.modules`` under other names are
switched off like the originals, and opening a gpumem source file during the call is refused by an
audit hook. Whatever the call rebinds or changes in the course, its caches or torch is put back and
the call fails (:mod:`.labstate`). Starting another process (``os.system``, ``subprocess``,
``os.posix_spawn``, ``os.fork``: an interpreter where no guard watches, review r8), reading the
grader's frames, trace or profile hooks and threads are refused by the labs' shared audit hook
(:func:`gpumem.course.lab_audit.refusing`, around the learner's call only). Covered: measuring
*during* the call (bar C entry points bound before it). Not covered: measuring *before* the check
and fitting (review r9): nothing stops a fit measured before the check and packed under the
limits (review r35, :mod:`.labtable`), bar part 3's chains since r38 (:mod:`.labcheck`'s docstring).
"""

import contextlib
import functools
import importlib
import inspect
import os
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from gpumem.course import lab_audit
from gpumem.course.case_limits import alarm_held
from gpumem.course.plain import read_now

from . import labcopies, labstate

MODULES = ("gpumem.memory.activations", "gpumem.memory.accounting", "gpumem.memory.estimate",
           "gpumem.memory.models", "gpumem.memory.llama", "gpumem.memory.tracer", "gpumem.memory.trace_compose", "gpumem.memory.megatron",
           "gpumem.memory.ds_estimators", "gpumem.memory.crosscheck", "gpumem.memory.timeline",
           "gpumem.chapters.ch01_memory_anatomy.labcheck", "gpumem.chapters.ch01_memory_anatomy.variants",
           "gpumem.chapters.ch01_memory_anatomy.labhints", "gpumem.chapters.ch01_memory_anatomy.labstate",
           "gpumem.chapters.ch01_memory_anatomy.lab_gpu", "gpumem.chapters.ch01_memory_anatomy.labtruth",
           "gpumem.chapters.ch01_memory_anatomy.labwide", "gpumem.chapters.ch01_memory_anatomy.labpart2",
           "gpumem.chapters.ch01_memory_anatomy.diagrams",
           "gpumem.chapters.ch01_memory_anatomy.steps", "gpumem.chapters.ch01_memory_anatomy.claims")
SAYS = "is switched off while your function is graded: derive it yourself"
NO_OPS = "no tensor ops: derive the count, do not measure it (your function runs on plain ints)"
_ACTIVE = [False]           # read by the audit hook
# another process, the grader's frames, trace hooks, threads (gpumem.course.lab_audit; review r8: an
# os.system interpreter ran labwide.measure / variants.measure, where no guard of this kernel watches)
REFUSAL = "derive it yourself: lab 01's grader refuses this inside your function"


class _NoDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} ran inside your function: {NO_OPS}")


class _NoFunctions(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", None) or repr(func)
        raise RuntimeError(f"torch {name} ran inside your function: {NO_OPS}")


def _package_dir() -> str:
    import gpumem
    return os.path.dirname(os.path.abspath(gpumem.__file__))


def _audit(event, args):
    """Opening one of gpumem's source files while a learner's function is graded: refused."""
    if _ACTIVE[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.endswith((".py", ".pyc")) and os.path.abspath(path).startswith(_PACKAGE):
            raise RuntimeError(f"opening {os.path.basename(path)} {SAYS}")


_PACKAGE = _package_dir()
sys.addaudithook(_audit)


def _refuse(*args, **kwargs):
    raise RuntimeError("\0label is switched off while your function is graded: derive it yourself")


def _refusing_code(f, label: str):
    """:func:`_refuse`'s code named as ``f``, its message naming ``label`` (a constant: no frame
    is read, which :mod:`gpumem.course.lab_audit` would refuse)."""
    code = _refuse.__code__
    consts = tuple(c.replace("\0label", label) if isinstance(c, str) else c for c in code.co_consts)
    return code.replace(co_name=f.__name__, co_qualname=f.__qualname__, co_filename=label, co_consts=consts)


def _functions(module):
    """(function, display name) of the plain functions ``module`` defines, methods included."""
    found = []
    for value in vars(module).values():
        members = vars(value).values() if inspect.isclass(value) and value.__module__ == module.__name__ else [value]
        for f in members:
            f = getattr(f, "__func__", f)                       # staticmethod, classmethod
            if inspect.isfunction(f) and f.__module__ == module.__name__ and not f.__code__.co_freevars:
                found.append(f)
    return found


def _tools():
    """(owner, attribute) of the tools a learner could measure with, and the recipe table's fields (r22)."""
    import subprocess
    from torch._subclasses.fake_tensor import FakeTensorMode as Fake
    from torch.distributed._tools.mem_tracker import MemTracker
    from gpumem.memory.accounting import Recipe
    return [(torch.autograd.graph.saved_tensors_hooks, "__enter__"), (Fake, "__enter__"), (MemTracker, "__enter__"),
            (subprocess.Popen, "__init__"), (torch.enable_grad, "__enter__"), (Recipe, "__getattribute__"),
            (torch.inference_mode, "__enter__")]    # r26: inference_mode(False) records again


def _tool_refuser(name: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{name} {SAYS}")
    return refuse


@contextlib.contextmanager
def derive_it_yourself(modules: list | None = None):
    """Switch off the course's answers and the tracing tools for the duration of the block."""
    tools = [(owner, attr, owner.__dict__.get(attr)) for owner, attr in _tools()]
    switch = torch.set_grad_enabled.__init__
    recording = torch.is_grad_enabled()

    def grad_stays_off(self, mode):         # no_grad's exit sets False again: allowed
        if mode:
            raise RuntimeError(f"torch.set_grad_enabled(True) {SAYS}")
        switch(self, mode)
    modes, entered, swapped, seen = (_NoFunctions(), _NoDispatch()), [], [], set()
    try:
        for label, f in _switched_off(modules):
            if id(f) not in seen:
                seen.add(id(f))
                swapped.append((f, f.__code__))
                f.__code__ = _refusing_code(f, label)
        for owner, attr, _ in tools:
            setattr(owner, attr, _tool_refuser(f"{owner.__module__}.{owner.__qualname__}"))
        torch.set_grad_enabled.__init__ = grad_stays_off
        _C_SET_GRAD(False)
        for attr, value in _c_refusers().items():
            setattr(torch._C, attr, value)
        _ACTIVE[0] = True
        for mode in modes:
            mode.__enter__()
            entered.append(mode)
        yield
        _still_in_place(*modes)
    finally:
        with alarm_held():     # the time limit's repeated SIGALRM must not stop the restoring half-way
            _ACTIVE[0] = False
            for attr, value in _C_ORIGINALS.items():
                setattr(torch._C, attr, value)
            for f, code in reversed(swapped):     # the modes' own exits use _pop_mode
                f.__code__ = code
            _leave(entered)
            _C_SET_GRAD(recording)
            torch.set_grad_enabled.__init__ = switch
            for owner, attr, original in tools:
                if original is None:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, original)


def _leave(entered: list) -> None:
    """Pop the modes ``entered`` (and any the learner pushed above them), innermost first."""
    for mode in reversed(entered):
        length, at, pop = ((torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at,
                            torch._C._pop_torch_dispatch_stack) if isinstance(mode, TorchDispatchMode) else
                           (torch._C._len_torch_function_stack, torch._C._get_function_stack_at,
                            torch._C._pop_torch_function_stack))
        if not any(at(i) is mode for i in range(length())):
            continue
        while at(length() - 1) is not mode:
            pop()
        mode.__exit__(None, None, None)


def _switched_off(modules=None):
    """(label, function) of every function the guard swaps: the course's, and the ways out of the modes."""
    for name, module in modules or _guarded_modules():
        for f in _functions(module):
            yield f"{name}.{f.__qualname__}", f
    for f in _escape_functions():
        yield f"{f.__module__}.{f.__qualname__}", f


_real = functools.lru_cache(maxsize=None)(os.path.realpath)     # a path's target does not move


def _guarded_modules():
    """(name, module) of :data:`MODULES`, and of any copy of their files loaded under another name."""
    found, files = [], {}
    for name in MODULES:
        try:
            module = sys.modules.get(name) or importlib.import_module(name)
        except ImportError:
            continue
        found.append((name, module))
        files[_real(module.__file__)] = name
    ids = {id(m) for _, m in found}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and id(module) not in ids and _real(path) in files:
            found.append((f"{files[_real(path)]} (loaded again as {name})", module))
    return found


_C_ORIGINALS = {attr: getattr(torch._C, attr) for attr in (
    "_set_grad_enabled", "_pop_torch_dispatch_stack", "_pop_torch_function_stack", "_unset_dispatch_mode",
    "_DisableTorchDispatch", "DisableTorchFunction", "DisableTorchFunctionSubclass")}
_C_SET_GRAD = _C_ORIGINALS["_set_grad_enabled"]


def _c_refusers() -> dict:
    def set_grad(mode):                    # no_grad's exit and set_grad_enabled(False): allowed
        if mode:
            raise RuntimeError(f"torch._C._set_grad_enabled(True) {SAYS}")
        _C_SET_GRAD(False)
    return {attr: set_grad if attr == "_set_grad_enabled" else _tool_refuser(f"torch._C.{attr}")
            for attr in _C_ORIGINALS}


def _escape_functions():
    """Python-level ways out of the tensor-op modes."""
    import torch.overrides as fmodes
    import torch.utils._python_dispatch as dmodes
    ways = ((dmodes, ("_pop_mode", "_pop_mode_temporarily", "_disable_current_modes")),
            (fmodes, ("_pop_mode", "_pop_mode_temporarily")))
    found = [getattr(m, n) for m, names in ways
            for n in names if inspect.isfunction(getattr(m, n, None))]
    return [f for f in map(inspect.unwrap, found) if not f.__code__.co_freevars]


def _still_in_place(functions, ops) -> None:
    """After the learner's call: both modes still on top of their stacks, recording still off."""
    top_f = torch._C._len_torch_function_stack()
    top_d = torch._C._len_torch_dispatch_stack()
    if (top_f == 0 or torch._C._get_function_stack_at(top_f - 1) is not functions or top_d == 0
            or torch._C._get_dispatch_stack_at(top_d - 1) is not ops or torch.is_grad_enabled()):
        raise RuntimeError(f"the tensor-op guard was switched off inside your function: {NO_OPS}")



def _refused(copied: list, hits: list) -> str:
    """The call's refusal: a copy of the course's code first (stopping it makes CPython unset the
    profile hook, which the audit hook then reports too), else the first audit refusal."""
    return f"{copied[0]} {labcopies.SAYS}" if copied else f"{REFUSAL} ({hits[0]})"


def guarded(fn):
    """``fn`` called inside :func:`derive_it_yourself`; a non-callable is returned unchanged (the
    grader says what it is)."""
    if not callable(fn):
        return fn

    # bound now: the learner's call could rebind the module attributes, not these closure cells
    snapshot, restore, refusal, held, guard = (labstate.snapshot, labstate.restore, labstate.refusal,
                                               alarm_held, derive_it_yourself)
    copies, watch = labcopies.prints(MODULES + ("gpumem.memory.activation_parts",)), labcopies.no_copies
    shared, refusing, explain, threads = labcopies.shared(), lab_audit.refusing, _refused, lab_audit.foreign_threads
    from gpumem.course import grading       # its Report and Row: a patched class could pass anything
    me = [("gpumem.chapters.ch01_memory_anatomy.labguard", sys.modules[__name__]),
          ("gpumem.course.grading", grading)]

    def learner(*args, **kwargs):
        threads()        # its file reads, cached now: opening gpumem's files is refused in the block
        modules = _guarded_modules()
        taken, hits, copied = snapshot(modules + me), [], []
        try:
            with guard(modules), watch(copies, shared, copied), refusing(REFUSAL, hits):
                result = read_now(fn(*args, **kwargs))   # under the guard (r20: a dict subclass)
        except BaseException:
            with held():
                restore(taken)
            if copied or hits:  # a refusal the learner caught still fails; a copy is named first
                raise RuntimeError(explain(copied, hits)) from None
            raise
        with held():
            changed = restore(taken)
        if copied or hits:
            raise RuntimeError(explain(copied, hits))
        if changed:
            raise RuntimeError(refusal(changed))
        return result
    return learner
