"""Lab 04's watchers: what the learner's call computes, op by op, so that a right answer reached
the wrong way (the whole score matrix, a softmax over a whole row, SDPA itself) still fails.

:class:`Watch` is a ``TorchDispatchMode`` (it sees every ATen op, backward ops that autograd runs
inside the call included, and every tensor they return) joined to a ``TorchFunctionMode`` (it sees
Python-level calls such as ``F.scaled_dot_product_attention`` before they decompose). It keeps
the FIRST rule broken, in the order the ops ran, as one sentence for the grader's row:

* any ``scaled_dot_product_*`` op or function (SDPA and its flash / efficient / math / cuDNN
  kernels, forward or backward);
* a softmax or logsumexp over more than ``block`` entries (a whole row of keys at once);
* a tensor of ``s_q x s_k`` scores (last two dims, either way round, or that many elements per
  head): the whole score matrix;
* a floating-point tensor (index and mask tensors are not scores) whose last dimension is
  longer than one block, other than K and V, their views and copies (a GQA expansion, a cast)
  (``rows`` lists the lengths that are not keys: the query length for per-row vectors such as the
  logsumexp, the head dim); or one with ``s_k`` rows that is not ``(..., s_k, d)`` (dK, dV);
* with ``tile_rows``: a tile of more than ``block`` query rows against one key block (the
  key-block kernel must loop over query blocks);
* with ``joined``: a tensor with more rows than the longest K/V shard (shards concatenated).

Limits: a learner who leaves the modes on purpose (``_disable_current_modes``) or computes in
another thread is not seen; the lab's rules forbid it in words.
"""

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


# ops that copy a tensor without arithmetic: a copy of K or V (its GQA expansion, its fp32 cast)
# is K or V for the rules; joining shards (cat, copy_ into a buffer) is not in the list
_COPIES = {"clone", "_to_copy", "index_select", "repeat", "repeat_interleave", "contiguous"}


def _tensors(out):
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(t, torch.Tensor):
            yield t


class _Functions(TorchFunctionMode):
    def __init__(self, watch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if "scaled_dot_product" in name:
            self.watch.flag(f"it calls {name}: SDPA is not allowed here, write the tiles yourself")
        return func(*args, **(kwargs or {}))


class Watch(TorchDispatchMode):
    """Watch one call: ``with Watch(...) as w: fn(...)``; then ``w.broken`` is '' or the first rule
    broken. ``allowed`` are the input tensors whose views may be any shape (K, V, their shards)."""

    def __init__(self, s_q: int, s_k: int, d: int, block: int, heads: int, allowed=(),
                 tile_rows: int | None = None, joined: int | None = None):
        super().__init__()
        self.s_q, self.s_k, self.d, self.block, self.heads = s_q, s_k, d, block, heads
        self.allowed = {t.untyped_storage().data_ptr() for t in allowed if t.numel()}
        self.tile_rows, self.joined = tile_rows, joined
        self.broken, self._functions = "", _Functions(self)

    def flag(self, message: str) -> None:
        self.broken = self.broken or message

    def __enter__(self):
        self._functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._functions.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "scaled_dot_product" in name:
            self.flag(f"it calls {name}: SDPA is not allowed here, write the tiles yourself")
        if ("softmax" in name or "logsumexp" in name) and "backward" not in name and args \
                and isinstance(args[0], torch.Tensor) and len(args) > 1:
            dims = args[1] if isinstance(args[1], (list, tuple)) else (args[1],)
            width = 1
            for dim in dims:
                width *= args[0].shape[dim] if isinstance(dim, int) and args[0].dim() else 1
            if width > self.block:
                self.flag(f"a {name.split('.')[1]} over {width} entries at once (a whole row of keys): "
                          f"tiles are at most {self.block} keys wide")
        out = func(*args, **(kwargs or {}))
        if name.split(".")[1] in _COPIES and any(
                t.numel() and t.untyped_storage().data_ptr() in self.allowed for t in _tensors(args[:1])):
            self.allowed.update(t.untyped_storage().data_ptr() for t in _tensors(out) if t.numel())
        for t in _tensors(out):
            self._shape(t)
        return out

    def _shape(self, t: torch.Tensor) -> None:
        if self.broken or t.dim() < 1 or (t.numel() and t.untyped_storage().data_ptr() in self.allowed):
            return
        shape, s_q, s_k, block = tuple(t.shape), self.s_q, self.s_k, self.block
        last2 = shape[-2:] if t.dim() >= 2 else ()
        if last2 in ((s_q, s_k), (s_k, s_q)) or t.numel() // max(self.heads, 1) >= s_q * s_k:
            self.flag(f"a tensor of shape {shape} was made: the whole {s_q} x {s_k} score matrix; "
                      f"work one block of keys at a time")
        elif not t.is_floating_point():
            return                                    # key indices and masks are not scores
        elif shape[-1] > block and shape[-1] not in (s_q, self.d):
            self.flag(f"a tensor of shape {shape} was made: {shape[-1]} keys side by side, more than "
                      f"one block ({block}); only K and V themselves may be that long")
        elif len(last2) == 2 and last2[0] == s_k and s_k > block and last2[1] != self.d:
            self.flag(f"a tensor of shape {shape} was made: a row for each of the {s_k} keys; "
                      f"work one block of keys at a time")
        elif self.tile_rows is not None and len(last2) == 2 and self.d not in last2 and (
                (last2[0] > block and last2[1] == self.tile_rows)
                or (last2[1] > block and last2[0] == self.tile_rows)):
            self.flag(f"a tile of shape {shape} was made: more than {block} query rows against the "
                      f"key block at once; loop over query blocks of {block} rows")
        elif self.joined is not None and len(shape) >= 2 and shape[-2] > self.joined and shape[-2] != s_q:
            self.flag(f"a tensor of shape {shape} was made: {shape[-2]} keys in one tensor, more than "
                      f"the longest shard ({self.joined}); the shards were joined, merge partials instead")
