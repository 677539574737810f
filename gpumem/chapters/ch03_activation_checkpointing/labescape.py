"""Lab 03's escape watch: while the learner's code runs, numbers may not leave torch.

A checkpoint that packs every saved tensor into NumPy (``saved_tensors_hooks`` with ``.numpy()``),
a list, raw storage or a DLPack capsule hides what it keeps from the grader's memory tracer
(chapter 01's MemTracker counts torch storages only) and never needs to re-run anything. So,
as lab 04's ``labguard.Watch`` does for scores, a ``TorchFunctionMode`` refuses, inside the
learner's calls, the ways out of torch:

* ``Tensor.numpy``, ``__array__``, ``__dlpack__``, storage and pointer access, pickling and
  ``copy.deepcopy`` of a tensor, ``tolist`` of more than 64 numbers, more than 1,000 ``item()``
  reads;
* ``torch.from_numpy``, ``torch.from_dlpack``, ``torch.utils.dlpack.*`` and ``torch.tensor`` of a
  NumPy array (swapped for refusals for the block's duration).

The grader's own tracer reads storages too (``torch.distributed._tools``), as does the course's
measurement code (``gpumem.memory``): calls made directly from those files pass. Detached clones
and CPU copies stay torch tensors: the tracer counts them (the "bytes kept" row), and a
checkpoint that never re-runs its layers in backward fails the "re-run" rows whatever it kept.

Limits: code that switches torch-function handling off on purpose (``torch._C.DisableTorchFunction``)
or holds references bound before the check is not seen here; ``labprints.c_exit`` sees those C
calls from the guard's profile hook, and the re-run rows still catch a checkpoint that keeps
everything.
"""

import os
import sys

import numpy as np
import torch
import torch.utils.dlpack
from torch.overrides import TorchFunctionMode

EXITS = {"numpy", "__array__", "untyped_storage", "storage", "_storage", "_typed_storage", "data_ptr",
         "_data_ptr", "__dlpack__", "__dlpack_device__", "__array_interface__", "__reduce_ex__",
         "__reduce__", "__setstate__", "__getstate__", "__deepcopy__"}
READS = {"item", "__float__", "__int__", "__index__", "__complex__", "__bool__"}
READ_BUDGET, LIST_LIMIT = 1000, 64
BRIDGES = ((torch, "from_numpy"), (torch, "from_dlpack"), (torch, "to_dlpack"), (torch, "frombuffer"),
           (torch.utils.dlpack, "from_dlpack"), (torch.utils.dlpack, "to_dlpack"))
_TORCH_TOOLS = os.path.join(os.path.dirname(torch.__file__), "distributed", "_tools") + os.sep
_GPUMEM_MEMORY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "memory") + os.sep


def sentence(what: str) -> str:
    """The row's detail for a way out of torch."""
    return (f"it took tensors out of torch ({what}): kept copies outside torch hide the activations "
            f"and skip the recomputation; keep only the inputs and re-run the segment in backward")


def _graders(frame) -> bool:
    """True when ``frame`` (the caller) is the grader's tracer or the course's measurement code."""
    name = frame.f_code.co_filename if frame is not None else ""
    return name.startswith(_TORCH_TOOLS) or name.startswith(_GPUMEM_MEMORY) or name == __file__


class Escapes(TorchFunctionMode):
    """``with Escapes(hits):`` refuses the ways out of torch; each refusal is appended to ``hits``
    as ``"escape: <what>"`` (a learner who catches the exception is still reported)."""

    def __init__(self, hits: list):
        super().__init__()
        self.hits, self.reads, self._swapped = hits, 0, []

    def refuse(self, what: str):
        self.hits.append("escape: " + what)
        raise RuntimeError(sentence(what))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if (name in EXITS or name in READS or name == "tolist" or name in ("tensor", "as_tensor", "asarray")) \
                and not _graders(sys._getframe(1)):
            if name in EXITS:
                self.refuse(f"Tensor.{name}")
            if name in ("tensor", "as_tensor", "asarray") and any(isinstance(a, np.ndarray) for a in args):
                self.refuse(f"torch.{name} of a NumPy array")
            if name == "tolist" and args and isinstance(args[0], torch.Tensor) and args[0].numel() > LIST_LIMIT:
                self.refuse(f"tolist of {args[0].numel():,} numbers")
            if name in READS:
                self.reads += 1
                if self.reads > READ_BUDGET:
                    self.refuse(f"more than {READ_BUDGET:,} item() reads")
        return func(*args, **(kwargs or {}))

    def _bridge(self, attr: str):
        def refuse(*args, **kwargs):
            self.refuse(f"torch.{attr}")
        return refuse

    def __enter__(self):
        self._swapped = [(m, a, getattr(m, a)) for m, a in BRIDGES if hasattr(m, a)]
        for module, attr, _ in self._swapped:
            setattr(module, attr, self._bridge(attr))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for module, attr, fn in reversed(self._swapped):
                setattr(module, attr, fn)
