"""Lab 01's guard: while a learner's function runs, the course's own answers are switched off.

Every plain function of the modules in :data:`MODULES` (gpumem's formulas, tracers and this
chapter's truth functions) has its code swapped for one that raises ``RuntimeError("... derive
it yourself")``: a reference the learner bound earlier (``from gpumem.memory.activations import
layer_parts``, a lambda's default) is switched off too, which renaming a module attribute would
miss. The truth functions cache in plain dicts inside their code, so no cache answers either.
Tracing tools are refused the same way (saved-tensor hooks, ``FakeTensorMode``, ``MemTracker``,
subprocesses), and autograd records nothing (``torch.no_grad``, which ``enable_grad`` and
``set_grad_enabled`` cannot lift).
"""

import contextlib
import importlib
import inspect
import sys

MODULES = ("gpumem.memory.activations", "gpumem.memory.accounting", "gpumem.memory.estimate",
           "gpumem.memory.models", "gpumem.memory.llama",
           "gpumem.memory.tracer", "gpumem.memory.trace_compose", "gpumem.memory.megatron",
           "gpumem.memory.ds_estimators", "gpumem.memory.crosscheck", "gpumem.memory.timeline",
           "gpumem.chapters.ch01_memory_anatomy.labcheck", "gpumem.chapters.ch01_memory_anatomy.variants",
           "gpumem.chapters.ch01_memory_anatomy.lab_gpu", "gpumem.chapters.ch01_memory_anatomy.diagrams",
           "gpumem.chapters.ch01_memory_anatomy.steps", "gpumem.chapters.ch01_memory_anatomy.claims")
SAYS = "is switched off while your function is graded: derive it yourself"


def _refuse(*args, **kwargs):
    import sys
    raise RuntimeError(f"{sys._getframe().f_code.co_filename} "
                       "is switched off while your function is graded: derive it yourself")


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
    """(owner, attribute) of the tracing tools a learner could measure with instead of deriving."""
    import subprocess

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    return [(torch.autograd.graph.saved_tensors_hooks, "__enter__"), (FakeTensorMode, "__enter__"),
            (MemTracker, "__enter__"), (subprocess.Popen, "__init__"), (torch.enable_grad, "__enter__")]


def _tool_refuser(name: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{name} {SAYS}")
    return refuse


@contextlib.contextmanager
def derive_it_yourself():
    """Switch off the course's answers and the tracing tools for the duration of the block."""
    import torch
    swapped = []
    for name in MODULES:
        try:
            module = sys.modules.get(name) or importlib.import_module(name)
        except ImportError:
            continue
        for f in _functions(module):
            label = f"{name}.{f.__qualname__}"
            swapped.append((f, f.__code__))
            f.__code__ = _refuse.__code__.replace(co_name=f.__name__, co_qualname=f.__qualname__,
                                                  co_filename=label)
    tools = [(owner, attr, owner.__dict__.get(attr)) for owner, attr in _tools()]
    switch = torch.set_grad_enabled.__init__
    recording = torch.is_grad_enabled()

    def grad_stays_off(self, mode):         # no_grad's exit sets False again: allowed
        if mode:
            raise RuntimeError(f"torch.set_grad_enabled(True) {SAYS}")
        switch(self, mode)
    try:
        for owner, attr, _ in tools:
            setattr(owner, attr, _tool_refuser(f"{owner.__module__}.{owner.__qualname__}"))
        torch.set_grad_enabled.__init__ = grad_stays_off
        torch._C._set_grad_enabled(False)
        yield
    finally:
        with _no_alarm():     # the time limit's repeated SIGALRM must not stop the restoring half-way
            torch._C._set_grad_enabled(recording)
            torch.set_grad_enabled.__init__ = switch
            for owner, attr, original in tools:
                if original is None:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, original)
            for f, code in swapped:
                f.__code__ = code


@contextlib.contextmanager
def _no_alarm():
    """SIGALRM held back in this thread for the block, delivered after it (POSIX)."""
    import signal
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def guarded(fn):
    """``fn`` called inside :func:`derive_it_yourself`; a non-callable is returned unchanged (the
    grader says what it is)."""
    if not callable(fn):
        return fn

    def learner(*args, **kwargs):
        with derive_it_yourself():
            return fn(*args, **kwargs)
    return learner
