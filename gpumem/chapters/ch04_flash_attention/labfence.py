"""Lab 04's fence around a learner's call: the ways to leave :class:`.labguard.Watch`'s sight.

The op watch is a pair of torch modes, and torch keeps modes per thread: work done in another
thread, or with the modes switched off, is not seen. While the call runs, in the thread that
grades it only (a Jupyter kernel's own threads go on), these raise and mark the case broken:

* starting a thread or a process (``threading.Thread.start``, ``_thread.start_new_thread``,
  ``multiprocessing``'s ``Process.start``; a ``ThreadPoolExecutor`` starts threads too);
* the entry points that switch the modes off: ``torch.utils._python_dispatch._disable_current_modes``
  and ``_pop_mode_temporarily``, ``torch._C.DisableTorchFunction``, ``torch._C._DisableTorchDispatch``.

A reference saved before the call (``from torch._C import DisableTorchFunction`` at the top of a
cell) escapes this fence; the watch's backstop catches what it computes: an op fed a tensor that is
neither an input nor made by a watched op (:meth:`.labguard.Watch.unknown`).
``torch.overrides._pop_mode_temporarily`` is left alone: torch's own ``handle_torch_function`` uses it.
"""

import _thread
import multiprocessing.process
import threading

import torch
import torch.utils._python_dispatch as python_dispatch

THREADS = ((threading.Thread, "start"), (_thread, "start_new_thread"), (threading, "_start_new_thread"),
           (multiprocessing.process.BaseProcess, "start"))
MODES = ((python_dispatch, "_disable_current_modes"), (python_dispatch, "_pop_mode_temporarily"),
         (torch._C, "DisableTorchFunction"), (torch._C, "_DisableTorchDispatch"))


def _label(owner, attr: str) -> str:
    return f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}"


class Fence:
    """``with Fence(flag):`` the entry points above refuse in this thread; ``flag(message)`` is
    called first, so a learner's ``except`` cannot hide the attempt."""

    def __init__(self, flag):
        self.flag, self.saved = flag, []

    def _refusing(self, owner, attr: str, original, what: str):
        label, owner_thread, flag = _label(owner, attr), threading.get_ident(), self.flag

        def refuse(*args, **kwargs):
            if threading.get_ident() != owner_thread:
                return original(*args, **kwargs)            # not the graded call: a kernel's own
            message = f"it {what} ({label} is off while lab 04 is graded): " + (
                "the watch sees only this thread; compute in the call itself" if what.startswith("started")
                else "leave the grader's watch on")
            flag(message)
            raise RuntimeError(message)
        return refuse

    def __enter__(self):
        for group, what in ((THREADS, "started a thread"), (MODES, "switched the grader's watch off")):
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
