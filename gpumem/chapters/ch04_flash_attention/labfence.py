"""Lab 04's fence around a learner's call: the ways to leave :class:`.labguard.Watch`'s sight.

The op watch is a pair of torch modes, and torch keeps modes per thread: work done in another
thread, or with the modes switched off, is not seen. While the call runs, in the thread that
grades it only (a Jupyter kernel's own threads go on), these raise and mark the case broken:

* starting a thread or a process (``threading.Thread.start``, ``_thread.start_new_thread``,
  ``multiprocessing``'s ``Process.start``; a ``ThreadPoolExecutor`` starts threads too);
* the entry points that switch the modes off: ``torch.utils._python_dispatch._disable_current_modes``
  and ``_pop_mode_temporarily``, ``torch._C.DisableTorchFunction``, ``torch._C._DisableTorchDispatch``;
* the getters and poppers of the mode stacks (:data:`REACH`: ``_get_current_dispatch_mode`` and
  ``_get_current_dispatch_mode_stack``, ``torch.overrides._get_current_function_mode(_stack)``,
  their ``torch._C`` stack accessors, ``_pop_mode``): they hand the learner the watch itself, whose
  verdict could then be rebound (review r10 of lab 04: 10 of 10 rows). torch's own code calling
  them (``torch.get_default_device`` does) is let through (:func:`_torch_calls`).

A reference saved before the call (``from torch._C import DisableTorchFunction`` at the top of a
cell) escapes this fence; the watch's backstop catches what it computes: an op fed a tensor that is
neither an input nor made by a watched op (:meth:`.labguard.Watch.unknown`); a watch reached that
way is sealed (:mod:`.labseal`: rebinding its attributes is refused and found after the call).
``torch.overrides._pop_mode_temporarily`` is left alone: torch's own ``handle_torch_function`` uses it.
:data:`BRIDGES` (``from_numpy``, DLPack) are swapped for :func:`refusing` by :class:`.labguard.Watch`.
"""

import _thread
import multiprocessing.process
import threading

import sys

import torch
import torch.overrides
import torch.utils.dlpack
import torch.utils._python_dispatch as python_dispatch

from gpumem.course import genuine

from . import labbake

THREADS = ((threading.Thread, "start"), (_thread, "start_new_thread"), (threading, "_start_new_thread"),
           (multiprocessing.process.BaseProcess, "start"))
MODES = ((python_dispatch, "_disable_current_modes"), (python_dispatch, "_pop_mode_temporarily"),
         (torch._C, "DisableTorchFunction"), (torch._C, "_DisableTorchDispatch"))
REACH = tuple((owner, attr) for owner, names in (
    (python_dispatch, ("_get_current_dispatch_mode", "_get_current_dispatch_mode_stack", "_pop_mode")),
    (torch.overrides, ("_get_current_function_mode", "_get_current_function_mode_stack", "_pop_mode")),
    (torch._C, ("_get_dispatch_stack_at", "_get_function_stack_at", "_pop_torch_dispatch_stack",
                "_pop_torch_function_stack"))) for attr in names)
_TORCH = torch.__file__.rsplit("/", 1)[0] + "/"
_HANDS_ON = frozenset({"get_torch_dispatch_modes"})      # torch helpers that return the stack itself


def _torch_calls() -> bool:
    """True when the refused entry point's caller is torch's own (genuine) code, other than a
    helper that hands the stack to its own caller (``proxy_tensor.get_torch_dispatch_modes``)."""
    code = sys._getframe(2).f_code
    return code.co_filename.startswith(_TORCH) and code.co_name not in _HANDS_ON and genuine.genuine(code)


def _refuse(*args, **kwargs):
    label, owner_thread, flag, original, what, get_ident, torch_calls, error = [x.__next__() for x in (
        "@label", "@owner_thread", "@flag", "@original", "@what", "@get_ident", "@torch_calls", "@error")]
    if get_ident() != owner_thread or (what.startswith("reached") and torch_calls()):
        return original(*args, **kwargs)            # not the graded call: a kernel's own
    message = f"it {what} ({label} is off while lab 04 is graded): " + (
        "the watch sees only this thread; compute in the call itself" if what.startswith("started")
        else "leave the grader's watch alone" if what.startswith("reached") else "leave the grader's watch on")
    flag(message)
    raise error(message)


def _label(owner, attr: str) -> str:
    return f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}"


class Fence:
    """``with Fence(flag):`` the entry points above refuse in this thread; ``flag(message)`` is
    called first, so a learner's ``except`` cannot hide the attempt."""

    def __init__(self, flag):
        self.flag, self.saved = flag, []

    def _refusing(self, owner, attr: str, original, what: str):
        """The refusing stand-in for ``owner.attr``; no closure: its references (the real entry
        point among them) are baked into its code (:func:`.labbake.bake`, review r13 #2)."""
        return labbake.bake(_refuse, label=_label(owner, attr), owner_thread=threading.get_ident(), flag=self.flag,
                            original=original, what=what, get_ident=threading.get_ident, torch_calls=_torch_calls,
                            error=RuntimeError)

    def __enter__(self):
        for group, what in ((THREADS, "started a thread"), (MODES, "switched the grader's watch off"),
                            (REACH, "reached for the grader's watch")):
            for owner, attr in group:
                if hasattr(owner, attr):
                    original = getattr(owner, attr)
                    self.saved.append((owner, attr, original))
                    setattr(owner, attr, self._refusing(owner, attr, original, what))
        return self

    def __exit__(self, *exc):
        while self.saved:
            owner, attr, original = self.saved.pop()
            setattr(owner, attr, original)
        return False


def refusing(name: str):
    """A stand-in for the bridge ``name`` that refuses, in any thread, while lab 04 is graded."""
    def refuse(*args, **kwargs):
        raise RuntimeError(f"it took the numbers out of torch ({name} is off while lab 04 is "
                           f"graded): compute every tile with torch ops inside the call")
    return refuse


# module functions that move numbers between torch and other libraries, off during the call
BRIDGES = ((torch, "from_numpy"), (torch, "from_dlpack"), (torch, "to_dlpack"),
            (torch.utils.dlpack, "from_dlpack"), (torch.utils.dlpack, "to_dlpack"))
