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
  head), unless it is ``(..., s_q, d)``: rows of outputs, such as the merge's stacked partials,
  whose size says nothing about keys (a merge's ``s_k`` may even equal ``d``): the whole score matrix;
* a floating-point tensor (index and mask tensors are not scores) whose last dimension is
  longer than one block, other than K and V, their views and copies (a GQA expansion, a cast)
  (``rows`` lists the lengths that are not keys: the query length for per-row vectors such as the
  logsumexp, the head dim); or one with ``s_k`` rows that is not ``(..., s_k, d)`` (dK, dV);
* with ``tile_rows``: a tile of more than ``block`` query rows against one key block (the
  key-block kernel must loop over query blocks); with ``exp2``, any tensor made from both Q and K
  larger than one ``block`` x ``block`` tile per head, whatever its key width (:mod:`.labexp2`);
* with ``joined``: a tensor with more rows than the longest K/V shard (shards concatenated);
* with ``no_autograd`` (the backward parts): an op fed a tensor that requires grad (autograd's own
  backward of a surrogate loss would write the products the part asks for);
* with ``causal_from`` (the key block's first key, causal): work on query rows that all lie above
  the diagonal (rows ``i0:i1`` of Q or dO with ``i1 <= j0`` fed to an op): the causal skip missed;
* a way out of torch (``.numpy()``, ``__array__``, ``apply_``/``map_``, storage or pointer access, DLPack,
  ``torch.tensor`` of a NumPy array, ``from_numpy``, ``tensor_split`` by a tensor), and numbers read into
  Python (:meth:`Watch.taken`: ``.tolist()`` of more than 64, more than 1,000 in all, or more than
  :data:`_QK_READS` made from Q or K; every ``item``/``float``/``int``/``bool``/``__index__`` ends in
  ATen's ``_local_scalar_dense``, counted there; printing or ``format`` of a tensor is refused: review
  r16 #2 read K out through ``format(t, '.17e')`` and rebuilt it with no K bits); and
  (:meth:`Watch.foreign`) a returned tensor whose storage no watched op made; (:meth:`Watch.unknown`)
  an op fed a floating tensor of more than 64 numbers that no watched op made.

Vectors of one number per query row (``lse``, ``delta``, their slices) and tensors made from them or
from Q, dO elementwise are query rows, not keys: the "keys side by side" rule skips them.
:mod:`.labfence` refuses threads and the mode-switching entry points during the call;
:meth:`Watch.overworked` counts the exponentials a causal key block takes, or its score tiles if more
(review r13 #1); with ``exp2=(q, k, hidden)``, :class:`.labexp2.Exp2Rule` follows the data flow into
every exponential (the backward's exp2 rule: each exp2 takes the score tile times scale * log2 e).
"""

import sys

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gpumem.course.plain import odd_tensor

from .labexp2 import Exp2Rule
from .labfence import BRIDGES as _BRIDGES, Fence, refusing as _refusing
from .labops import (_ANSWERS, _COPIES, _EXITS, _EXPS, _FRESH, _PRINTS, _QK_READS, _READ_BUDGET, _READS, _SIZED,
                     _SMALL, _flat, _ptr, _tensors)
from . import labbake, labexp2, labfence, labgrad, labops, labpairs, labproducts, labseal, labshape
from .labseal import Sealed, cells, seal, seal_dispatch, tally


class _Functions(Sealed, TorchFunctionMode):
    def __init__(self, watch):
        super().__init__()
        self.watch, self.flag = watch, watch.flag

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if vars(Watch).get("__torch_dispatch__") is not _DISPATCH:   # a swapped one never runs: checked here
            self.watch.flag("it patched the grader (Watch.__torch_dispatch__) while lab 04 was graded: leave it alone")
        name = getattr(func, "__name__", str(func))
        if "scaled_dot_product" in name:
            self.watch.flag(f"it calls {name}: SDPA is not allowed here, write the tiles yourself")
        if name in _PRINTS:
            self.watch.refuse(f"it printed or formatted a tensor (Tensor.{name}) while lab 04 was graded: that "
                              f"reads its numbers into Python, where the watch cannot follow them; print in a "
                              f"cell of your own, before the check")
        if name in _EXITS or (name in ("tensor", "as_tensor", "asarray") and any(
                isinstance(a, np.ndarray) for a in args)):
            self.watch.exit(f"Tensor.{name}" if name in _EXITS else f"torch.{name} of a NumPy array")
        elif name in _READS and args and isinstance(args[0], torch.Tensor):
            self.watch.taken(args[0], args[0].numel(), name)
        elif name in _SIZED and any(isinstance(a, torch.Tensor) for a in (*args[1:], *(kwargs or {}).values())):
            self.watch.exit(f"{name} by a tensor of indices: the chunks' lengths are that tensor's numbers")
        return func(*args, **(kwargs or {}))


class Watch(Sealed, TorchDispatchMode):
    """Watch one call: ``with Watch(...) as w: fn(...)``; then ``w.broken`` is '' or the first rule
    broken. ``allowed`` are the input tensors whose views may be any shape (K, V, their shards).
    Sealed while entered (:mod:`.labseal`): the verdict and counts live in a closure."""

    broken = property(lambda self: self.read("broken"))
    exps = property(lambda self: self.read("exps"))         # elements exponentiated
    reads = property(lambda self: self.read("reads"))

    def __init__(self, s_q: int, s_k: int, d: int, block: int, heads: int, allowed=(),
                 tile_rows: int | None = None, joined: int | None = None, rows=(), queries=(),
                 causal_from: int | None = None, inputs=(), exp2=(), no_autograd: bool = False):
        super().__init__()
        self.flag, self.count, self.read = tally()          # the first rule broken: flag(message)
        self.exp2 = Exp2Rule(d, *exp2) if exp2 else None   # exp2: (q, k), the backward's rule (:mod:`.labexp2`)
        self.s_q, self.s_k, self.d, self.block, self.heads = s_q, s_k, d, block, heads
        self.allowed = {_ptr(t) for t in allowed if t.numel()}
        self.rows = {_ptr(t) for t in (*rows, *queries) if t.numel()}     # per query row: not keys
        self.queries = {_ptr(t) for t in queries if t.numel()}            # Q, dO: (..., s_q, d)
        self.tile_rows, self.joined, self.causal_from = tile_rows, joined, causal_from
        self.no_autograd = no_autograd                 # the backward parts: the products are the learner's
        self._functions, self.made, self.fills = _Functions(self), set(), set()   # fills: labops.fills
        self.tiles: dict = {}                          # storage of a copy of Q / dO rows -> (i0, i1)
        self.known = {_ptr(t) for t in (*allowed, *rows, *queries, *inputs) if t.numel()}
        self.fence = Fence(self.flag)                  # threads, modes off, the mode stack reached

    def unknown(self, func, args) -> None:
        """Flag an op fed a tensor that is neither an input nor made inside the call, or a tensor
        of more than 64 numbers built from Python data (``torch.tensor`` of a list)."""
        if self.broken:
            return
        if str(func).split(".")[1] in _FRESH:
            size = sum(t.numel() for t in _tensors(list(args)))
            if size > _SMALL:
                self.flag(f"it built a tensor of {size:,} numbers from Python data (torch.tensor of a list): "
                          f"numbers computed outside torch; compute them with torch ops in the call")
            return
        for t in _tensors([a for x in args for a in (x if isinstance(x, (tuple, list)) else (x,))]):
            if t.is_floating_point() and t.numel() > _SMALL and _ptr(t) not in self.known \
                    and _ptr(t) not in self.made:
                self.flag(f"it used a tensor of shape {tuple(t.shape)} that is no input and that no torch op "
                          f"in the call made (computed in another thread, with the watch off, or kept "
                          f"from before?): compute it inside the call")
                return

    def overworked(self, j0: int, n: int) -> str:
        """'' or why a causal key block (keys j0..j0+n-1) met too many query rows: the rows that
        see any of its keys start at j0's query block; twice that many plus one block is allowed."""
        heads, needed = self.heads, max(0, self.s_q - j0 // self.block * self.block)
        made = max(self.exps, self.exp2.scores if self.exp2 is not None else 0)   # score products too
        met = made / max(1, heads * n)
        if met <= 2 * needed + self.block:
            return ""
        return (f"causal key block from key {j0}: it took exp for {met:.0f} query rows x {n} keys x {heads} "
                f"heads, but only the {needed} rows from {j0 // self.block * self.block} on see any of its "
                f"keys; skip the query blocks above the diagonal")

    def refuse(self, message: str) -> None:
        """Flag and stop the learner's call here with the reason."""
        self.flag(message)
        raise RuntimeError(self.broken)

    def exit(self, what: str) -> None:
        self.refuse(f"it took the numbers out of torch ({what}): compute every tile with torch ops "
                    f"inside the call, no NumPy, lists or storage access")

    def taken(self, t, n: int, how: str) -> None:
        """Count ``n`` numbers of ``t`` read into Python; refuse past the budget, a long ``tolist``, and
        past a handful made from Q or K: they could come back as a tensor with no Q|K bits."""
        qk = self.exp2 is not None and self.exp2._tag(t)[0] != 0
        total, mine = self.count("reads", n), (self.count("qk", n) if qk else 0)
        if total > _READ_BUDGET or (how == "tolist" and n > _SMALL):
            self.exit(f"{how} ({total:,} numbers read out)")
        if mine > _QK_READS:
            self.refuse(f"it read {mine:,} numbers made from Q or K into Python ({how}), more than {_QK_READS}: "
                        f"the watch cannot follow them back into a tensor; keep scores and K in torch ops, "
                        f"and decide what to skip from indices, not from the numbers")

    def foreign(self, out) -> str:
        """'' or why a returned tensor was not made by an op the watch saw (torch.from_numpy...), or
        is not a plain ``torch.Tensor`` (:func:`gpumem.course.plain.odd_tensor`)."""
        if why := odd_tensor(out):
            return why
        for t in _tensors(out if isinstance(out, (tuple, list)) else (out,)):
            if t.numel() and _ptr(t) not in self.made:
                return (f"a returned tensor of shape {tuple(t.shape)} was not made by any torch op in "
                        f"the call (NumPy, from_numpy, a list?): compute it with torch ops")
        return ""

    def __enter__(self):
        self.fence.__enter__()
        self._bridges = [(m, a, getattr(m, a)) for m, a in _BRIDGES if hasattr(m, a)]
        for module, attr, _ in self._bridges:
            setattr(module, attr, _refusing(f"torch.{attr}"))
        self._functions.__enter__()
        entered = super().__enter__()
        exp2 = (self.exp2.mark, self.exp2.add) if self.exp2 is not None else ()
        self._cells = cells(self.flag, self.count, self.read, *exp2)     # checked at every op
        for obj in (self, self._functions):
            seal(obj, True)
        return entered

    def __exit__(self, *exc):
        for obj in (self, self._functions):
            seal(obj, False)
        self.fence.__exit__(*exc)
        try:
            return super().__exit__(*exc)
        finally:
            self._functions.__exit__(*exc)
            for module, attr, fn in self._bridges:
                setattr(module, attr, fn)

    def _dispatch(self, func, types, args=(), kwargs=None, check=None, swapped=None):
        """Every op: the grader's integrity (``check``, ``swapped``: labseal's baked checks), the
        rules, the op, the records. The grader's own work runs with the profile hook off (the copy
        watch and labblock's records watch the learner's calls; in the grader's bookkeeping they
        saw a million calls a check and made grading 3.5 times slower); the op itself keeps it. Only
        the baked checks run quiet: other functions passed in are watched as the learner's code."""
        profile = sys.getprofile()
        quiet = type(self) is Watch and check is _CHECK and swapped is _SWAPPED
        if quiet:
            sys.setprofile(None)
        try:
            patched = (check() or swapped(self)) if check is not None else ""
            if patched:
                self.flag(f"it patched the grader ({patched}) while lab 04 was graded: leave the grader alone")
            name = self._before(func, args, kwargs)
        finally:
            if quiet:
                sys.setprofile(profile)
        try:
            out = func(*args, **(kwargs or {}))
        except Exception:                     # review r32 #1: K read back from IndexError messages
            self.flag(name, "raised")         # kept apart from the verdict: the error may stop the call
            raise
        if quiet:
            sys.setprofile(None)
        try:
            self._after(func, name, args, kwargs, out)
        finally:
            if quiet:
                sys.setprofile(profile)
        return out

    def _before(self, func, args, kwargs) -> str:
        name = str(func)
        if name.startswith("aten._local_scalar_dense") and args:       # item, float, int, bool, format...
            self.taken(args[0], 1, "Tensor.item, float, int or bool")
        elif _answers(func, name, args):
            ins = [t for t in _flat(args) if isinstance(t, torch.Tensor)]   # a bool, or a length made from them
            self.taken(next((t for t in ins if self.exp2 is not None and self.exp2._tag(t)[0]), ins[0]), 1,
                       f"torch.{name.split('.')[1]}, whose answer (a number, a bool, its result's length) is read from the numbers")
        self.unknown(func, list(args) + [v for k, v in (kwargs or {}).items() if k != "out"])
        labops.fills(self, name, args)
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
        return name

    def _after(self, func, name: str, args, kwargs, out) -> None:
        if self.causal_from is not None:
            labshape.above_diagonal(self, name, args, out)
        op, first = name.split(".")[1], list(_tensors(args[:1]))
        if self.exp2 is not None:
            self.exp2.note(op, args, kwargs, out)
        if op in _EXPS or (op == "pow" and args and not isinstance(args[0], torch.Tensor)):
            self.count("exps", sum(t.numel() for t in _tensors(out)))  # pow(2, x) is exp2 too
        for tag in (self.allowed, self.queries):     # a copy of a whole Q (a cast) is Q; of a tile not
            if op in _COPIES and any(t.numel() and _ptr(t) in tag for t in first):
                tag.update(_ptr(t) for t in _tensors(out) if t.numel() and (
                    tag is self.allowed or (t.dim() >= 2 and t.shape[-2] == self.s_q)))
        wide = {t.shape[-1] for t in _tensors(list(args)) if t.dim() and t.numel() and _ptr(t) in self.rows}
        for t in _tensors(out):
            if t.numel():
                self.made.add(_ptr(t))
                if t.dim() and t.shape[-1] in wide and t.shape[-1] != self.s_k:
                    self.rows.add(_ptr(t))            # made from per-row vectors: still query rows
            labshape.shape(self, t)
        if self.no_autograd and any(t.requires_grad for t in _tensors(list(args))):    # after the op's own rules
            self.flag("it used autograd (an op met a tensor that requires grad, review r19): write dV, dS, dQ "
                      "and dK from the tile's probabilities yourself")
        if self.exp2 is not None and not self.broken:      # tiles of both Q and K: one block of rows
            self.flag(self.exp2.tile(op, args, out, self.heads, self.block, self.d))


def _answers(func, name: str, args) -> bool:
    """Whether the op answers Python from its inputs' numbers: a bool (``equal``), or a result whose
    length they set (ATen's ``dynamic_output_shape`` tag: nonzero, bincount, unique, masked_select,
    repeat_interleave by a tensor, one_hot...; review r34 read K byte by byte from bincount's length).
    Indexing counts only by a boolean mask (by positions its length is the index's)."""
    if not args or not isinstance(args[0], torch.Tensor):
        return False
    if name.split(".")[1] in _ANSWERS or labops.scalar_out(func):
        return True
    if not labops.dynamic(func):
        return False
    return not name.startswith("aten.index.") or any(
        isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in _flat(args[1:]))


# every op first checks that none of the grader's modules and classes was patched during the call;
_UNSEALED = ("_DISPATCH", "_CHECK", "_SWAPPED")   # grader_seal: made with code baked in (labseal.bake), not the file's
_DISPATCH, _CHECK, _SWAPPED = seal_dispatch(Watch, (sys.modules[__name__], labbake, labexp2, labfence, labops, labpairs, labseal, labshape,
                                          labproducts, labgrad, Watch, _Functions, labexp2.Exp2Rule, labpairs.Pairs,
                                          labproducts.Products, labgrad.Provenance, labfence.Fence, Sealed))
