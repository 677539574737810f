"""Lab 04's exp2 rule for the backward (parts 1 and 2): the probabilities are rebuilt the way
FlashAttention-2's kernels rebuild them, with exp2 and log2(e) folded into the softmax scale.

FlashAttention-2 never calls ``exp``: ``flash_api.cpp`` (``set_params_fprop``) sets
``params.scale_softmax_log2 = softmax_scale * M_LOG2E`` and ``softmax.h``'s ``scale_apply_exp2``
computes ``exp2f(S * scale_softmax_log2 - lse * M_LOG2E)``: one multiply-add per score before
exp2, which the GPU's special-function unit evaluates natively (Dao-AILab/flash-attention,
csrc/flash_attn/src; the backward, ``flash_bwd_kernel.h``, calls the same ``scale_apply_exp2``).
Since exp2(x log2 e) = exp(x), the numbers cannot tell the two apart; the data flow can.

:class:`Exp2Rule` follows the ops :class:`.labguard.Watch` dispatches, by storage: Q and K (the
call's inputs, their views, copies and casts) are *plain*; a matrix product of plain Q and plain
K is a *raw* score tile; the raw tile times the Python number c2 = scale * log2(e) (or Q or K
times c2 before the product, or ``baddbmm(..., alpha=c2)``) is *folded*; masking keeps the form;
adding or subtracting a term that is not made from both Q and K (the lse in base 2, a mask bias)
makes it *ready*. Each ``exp2`` (or ``pow(2, x)``) must take a folded or ready tensor of its own
shape. So ``exp2(log2e * (S * scale - lse))`` (log2 e applied on its own: two multiplies per
score) fails, and so does a multiply by c2 of anything else (a dummy scalar, a tile that never
reaches the exponential). An exponential in the natural base (``exp``, ``expm1``, a softmax or
logsumexp, ``sigmoid``, ``pow`` of another base) is named first, then any other transcendental op
on scores (:data:`.labops._OTHER`: review r13 #1 took P = 1 / (cosh x - sinh x)), then too few
exp2: exp2 must reach every visible score of the call, counted over DISTINCT (query row, key, head)
pairs (:mod:`.labpairs`; review r15 #1 took exp2 of one tile again and again, r16 #2 recomputed its
product each time). A tensor's Q|K bits are those of every tensor an op takes (r15: K laundered
through index_select's index). ``pow(2.0, x)`` is exp2. P^T dO must take exp2's output (r27: a decoy;
r28's open route: with a matmul or without, :mod:`.labproducts`).

The provenance rule (review r31 #1): :mod:`.labgrad`.
"""

import torch

from .labexp2_words import verdict
from .labgrad import Provenance
from .labpairs import Pairs
from .labproducts import Products
from .labops import (  # noqa: F401 (LOG2E is read from here too)
    COND, FOLDED, GRAD, K, LOG2E, ONE, PLAIN, PROB, QK, RAW, READY, Q, _ADD, _CMP, _DIVIDES, _FACTORS, _LINEAR, _MASK,
    _FRESH, _MM, _OTHER, _POWERS, _REDUCE, _RTOL, _SAME, _flat, _marks, _number, _ptr, _rest, _rows_of_d, _wider)

# exponentials in the natural base: what chapter 04's code (and a softmax) takes
_PLAIN = frozenset({"exp", "exp_", "expm1", "expm1_", "_softmax", "_log_softmax", "logsumexp", "sigmoid",
                    "sigmoid_", "_safe_softmax", "_masked_softmax"})      # review r31: _masked_softmax too


class Exp2Rule(Provenance):
    """The exp2 rule for one call on head dimension ``d`` (scale 1/sqrt(d)); ``q``, ``k``: the
    call's query and key tensors, ``hidden`` its causal mask. What it found lives in a closure (:func:`_marks`), and no
    attribute is rebound after ``__init__``, so a learner's call that reached the watch cannot
    clear it (:mod:`.labseal` names a rebinding that skipped ``__setattr__``)."""

    plain = property(lambda self: self.seen("plain"))
    other = property(lambda self: self.seen("other"))
    exp2n = property(lambda self: self.seen("exp2n"))
    scores = property(lambda self: self.seen("scores"))
    exp2 = property(lambda self: self.seen("exp2"))
    unfolded = property(lambda self: self.seen("unfolded"))
    alone = property(lambda self: self.seen("alone"))
    unused = property(lambda self: self.seen("unused"))

    def __init__(self, d: int, q=None, k=None, hidden=None):
        self.folded_scale = d ** -0.5 * LOG2E
        self.pairs = Pairs(q, k, self.folded_scale, hidden) if _ptr(q) and _ptr(k) else None
        self.mark, self.add, self.seen = _marks()
        self.tags: dict[int, tuple[int, str | None]] = {}        # storage -> (bits, form)
        self.tiles: set[int] = set()                              # storages of P's family
        self.counted: dict = {}            # product (or storage, unfolded) -> numbers exp2 took of it
        self.origins: dict = {}            # storage -> (key, numbers, pair ids) of its Q K^T product
        self.products = Products(self)     # the product rule (:mod:`.labproducts`)
        for t, bit in ((q, Q), (k, K)):
            if _ptr(t):
                self.tags[_ptr(t)] = (bit, PLAIN)

    def __setattr__(self, name, value):
        if name in self.__dict__ or name in ("plain", "other", "exp2", "exp2n", "scores", "unfolded", "alone",
                                             "unused"):
            raise AttributeError(f"it rebound the grader's watch (Exp2Rule.{name}): leave the watch alone")
        object.__setattr__(self, name, value)

    def _tag(self, x) -> tuple[int, str | None]:
        return self.tags.get(_ptr(x), (0, None)) if isinstance(x, torch.Tensor) else (0, None)

    def _near(self, x, c: float) -> bool:
        return _number(x) and x != 0 and abs(x - c) <= _RTOL * abs(c)

    def _factor(self, op: str, args) -> tuple[object, object]:
        """(the tensor, the Python number it is multiplied by) of a mul or div, else (None, None)."""
        a, b = (list(args) + [None, None])[:2]
        if isinstance(a, torch.Tensor) and _number(b):
            return a, (b if op.startswith("mul") else (1.0 / b if b else None))
        if op.startswith("mul") and isinstance(b, torch.Tensor) and _number(a):
            return b, a
        return None, None

    def _scaled(self, op, args, bits):
        x, c = self._factor(op, args)
        if x is None:                               # tensor by tensor: P times a mask, dropout's or (dP - D)
            tags = [self._tag(t) for t in args[:2] if isinstance(t, torch.Tensor)]
            keeps = len(tags) == 2 and any(f == PROB for _, f in tags) and \
                all(f == PROB or (b & QK) == 0 for b, f in tags)
            return bits, (PROB if keeps else None)
        xb, xf = self._tag(x)
        if xf == PROB:
            return bits, PROB
        if xb == QK and self._near(c, LOG2E):
            self.mark("alone", True)                # log2 e on its own: the unfolded form
        if not self._near(c, self.folded_scale):
            return bits, None
        return bits, {PLAIN: ONE, RAW: FOLDED}.get(xf)

    def _product(self, op, args, kwargs):
        ins = list(args)
        first, (a, b) = (ins[0], ins[1:3]) if op in ("addmm", "baddbmm", "addbmm") else (None, ins[:2])
        (ab, af), (bb, bf) = self._tag(a), self._tag(b)
        bits = ab | bb | self._tag(first)[0]
        form = None
        if {ab, bb} == {Q, K} and af in (PLAIN, ONE) and bf in (PLAIN, ONE) and (af, bf) != (ONE, ONE):
            form = FOLDED if ONE in (af, bf) else RAW
        alpha = (kwargs or {}).get("alpha", 1)
        if alpha != 1:
            form = FOLDED if form == RAW and self._near(alpha, self.folded_scale) else None
        if first is not None and (kwargs or {}).get("beta", 1) != 0:
            form = self._added(form, self._tag(first)[0])
        return bits, form

    @staticmethod
    def _added(form, other_bits):
        """The form of a raw/folded/ready tile plus a term with ``other_bits``."""
        if form not in (RAW, FOLDED, READY) or other_bits == QK:
            return None
        return RAW if form == RAW else READY

    def _sum(self, op, args, kwargs, out):
        a, b = (list(args) + [None, None])[:2]
        if op == "rsub":
            a, b = b, a                             # rsub(x, y) = y - alpha x
        (ab, af), (bb, bf) = self._tag(a), self._tag(b)
        alpha = (kwargs or {}).get("alpha", 1)
        carriers = [(t, f) for t, f in ((a, af), (b, bf)) if f in (RAW, FOLDED, READY)]
        if PROB in (af, bf) and all(f == PROB or not bits & QK for bits, f in ((ab, af), (bb, bf))):
            return ab | bb, PROB                    # P dP - P D, P plus a bias: still exp2's output
        if len(carriers) != 1 or not isinstance(out, torch.Tensor) or carriers[0][0].shape != out.shape \
                or (alpha != 1 and carriers[0][0] is b):
            return ab | bb, None
        other = bb if carriers[0][0] is a else ab
        return ab | bb, self._added(carriers[0][1], other)

    def _exponent(self, op, args):
        """The tensor an exp2 takes (None if ``op`` is no exp2); names a natural-base one."""
        if op in ("exp2", "exp2_"):
            return args[0]
        if op in ("pow", "pow_", "float_power", "float_power_") and len(args) > 1 \
                and isinstance(args[1], torch.Tensor):
            if _number(args[0]) and args[0] == 2:
                return args[1]
            if not self.plain:
                self.mark("plain", f"{op}({args[0]:g}, x)" if _number(args[0]) else f"{op}(tensor, x)")
        elif op in _PLAIN and not self.plain:
            self.mark("plain", op.strip("_"))
        return None

    def note(self, op: str, args, kwargs, out=None) -> None:
        """Record one dispatched op (``op``: its name without namespace and overload) and its output."""
        if op in _FRESH:          # torch.tensor of Python numbers: made outside dispatch, maybe where a dead
            for ptr in {_ptr(t) for t in _flat(args)} - {0}:     # tensor's tag still is (review r32 #2:
                for kept in (self.tags, self.origins, self.counted):  # refused as made from Q and K)
                    kept.pop(ptr, None)
        x = self._exponent(op, args)
        self.products.note(op, args, kwargs, out)         # P^T dO, dS K, dS^T Q take exp2's output (labproducts)
        if x is not None:
            self.mark("exp2", True)
            self.add("exp2n", self._fresh(x))
            if isinstance(x, torch.Tensor) and x.numel() and self._tag(x)[1] not in (FOLDED, READY) \
                    and not self.unfolded:
                self.mark("unfolded", f"exp2 of a tensor of shape {tuple(x.shape)}")
        written = [t for t in _flat([(kwargs or {}).get("out")]) if isinstance(t, torch.Tensor)]   # out=: a write
        every = [t for t in _flat([*args, *(v for n, v in (kwargs or {}).items() if n != "out")])
                 if isinstance(t, torch.Tensor)]
        bits, form = 0, None
        for t in every:           # every tensor's: index_select's index, where's condition (review r15 #1)
            bits |= self._tag(t)[0]
        if op in _SAME or op == "copy_":  # the form of the first tensor; copy_ overwrites (partly: see below)
            src = args[1] if op == "copy_" else next(iter(every), None)
            bits, form = (self._tag(src)[0] if op == "copy_" else bits), self._tag(src)[1]
            if op in _SAME and any(self._tag(t)[0] for t in every if t is not src):
                form = None                         # review r31: index_select by an index made from Q or K
        elif op in ("mul", "mul_", "div", "div_"):
            bits, form = self._scaled(op, args, bits)
        elif op in _MM:
            bits, form = self._product(op, args, kwargs)
        elif op in _ADD:
            bits, form = self._sum(op, args, kwargs, out)
        elif op in _MASK or op == "where":
            bits, form = self._masked(op, args)
        elif op in _CMP:
            form = self._compared(every)
        if x is not None and self._tag(x)[1] in (FOLDED, READY):
            form = PROB                             # exp2's own output: what P^T dO must take
        if form is None and bits == QK:
            form = self._grad(op, args, every)      # the provenance rule (review r31 #1)
        self._other(op, args)
        outs, shared = [t for t in _flat([out]) if isinstance(t, torch.Tensor) and t.numel()], {_ptr(t) for t in every}
        if not op.endswith("_") and op not in _SAME and not written:   # a view this rule does not know: the
            outs = [t for t in outs if _ptr(t) not in shared]             # storage keeps its tag
        target = written[0] if written else (args[0] if op.endswith("_") and args else None)
        if isinstance(target, torch.Tensor) and target.numel() and outs:
            # an in-place write (or one through out=), maybe to part of a storage
            if target.numel() * target.element_size() < target.untyped_storage().nbytes():
                ob, of = self._tag(target)
                if (bits, form) != (ob, of) and not (op in _MASK and bits == ob):
                    grad = GRAD in (form, of) and all(f == GRAD or b != QK for b, f in ((bits, form), (ob, of)))
                    bits, form = bits | ob, (GRAD if grad else None)   # GRAD into a buffer of zeros stays GRAD
        origin = (object(), sum(t.numel() for t in outs), self._pid(op, args, form)) if op in _MM else next((self.origins.get(_ptr(t)) for t in (
            args[1:2] if op == "copy_" else every) if self._tag(t)[1] in (RAW, FOLDED, READY)), None)
        for t in outs:
            self.tags[_ptr(t)], self.origins[_ptr(t)] = (bits, form), (origin if form in (RAW, FOLDED, READY) else None)
            if op not in _SAME or _ptr(t) not in shared:     # new numbers there (a view writes none)
                self.counted.pop(_ptr(t), None)

    def _pid(self, op, args, form):
        """The (query row, key) pair ids of a score product's numbers (:class:`.labpairs.Pairs`)."""
        if form not in (RAW, FOLDED, READY) or self.pairs is None or op not in ("mm", "bmm", "addmm", "baddbmm"):
            return None
        a, b = args[1:3] if op in ("addmm", "baddbmm") else args[:2]
        return self.pairs.product(a, b, self._tag(a)[0] == Q, self._tag(a)[1] == ONE, self._tag(b)[1] == ONE)

    def _fresh(self, x) -> int:
        """Scores of ``x`` exp2 has not taken yet: the visible (query row, key) pairs of the Q K^T
        product a folded or ready tile comes from that no exp2 reached (review r15 #1: one tile again
        and again; r16 #2: its product recomputed), else numbers of its storage since it was last written."""
        ptr = _ptr(x)
        if self.origins.get(ptr) is not None and self.pairs is not None:
            return self.pairs.take(self.origins[ptr][2], x.numel())
        key, room, _ = self.origins.get(ptr) or (ptr, x.untyped_storage().nbytes() // x.element_size() if ptr else 0, 0)
        n = max(0, min(x.numel() if ptr else 0, room - self.counted.get(key, 0)))
        self.counted[key] = self.counted.get(key, 0) + n
        return n

    def _other(self, op: str, args) -> None:
        """Name a transcendental op other than exp2 (or ``pow`` of a score tile to a power that is no
        plain algebra) fed numbers made from both Q and K: only exp2 may exponentiate scores."""
        name = op.rstrip("_")
        tensors = [t for t in _flat(args) if isinstance(t, torch.Tensor)]
        if self.other or not any(self._tag(t)[0] == QK for t in tensors):
            return
        if name in _OTHER or name.startswith("special_") or name.endswith(("_backward", "_backward_data")):
            self.mark("other", name)      # review r24: elu_backward(1, x) is e^x for x <= 0
        elif name == "pow" and args and isinstance(args[0], torch.Tensor) and self._tag(args[0])[0] == QK:
            power = args[1] if len(args) > 1 else None
            if not (_number(power) and power in _POWERS):
                self.mark("other", f"pow(x, {power:g})" if _number(power) else "pow(x, tensor)")

    _rest, _rows_of_d = staticmethod(_rest), staticmethod(_rows_of_d)

    def tile(self, op: str, args, out, heads: int, block: int, d: int = 0) -> str:
        """'' or why ``op`` made or took (views aside) a tile of P's family larger than one
        ``block`` x ``block`` tile per head: a dimension past the batch and heads over ``block``, or
        more than ``heads * block**2`` numbers. P's family is decided by where the numbers come
        from (the Q|K bits), not by the form (review r13 #1: ``Q + 0.0`` hid the product): a
        product of two tensors that are not tiles whose numbers come from both Q and K (Q K^T in
        any layout or key width), every exponential of such numbers, any other op that makes such
        numbers (Q and K met elementwise, a reduction over the head dimension) unless it adds to
        ``(..., rows, d)`` sums (dQ, dK, dV), and what elementwise work, masking, views or joins
        make from tiles (P, dP - D, dS). A product that contracts a tile (dS K, P^T dO) is not
        one. So all query rows at once fail whatever the key width or layout."""
        ins = [t for t in _flat(args) if isinstance(t, torch.Tensor) and t.numel()]
        outs = [t for t in _flat([out]) if isinstance(t, torch.Tensor) and t.numel()]
        fed = [t for t in ins if _ptr(t) in self.tiles]
        exp = op in _PLAIN or op in ("exp2", "exp2_") or (op in ("pow", "pow_") and args and _number(args[0]))
        both = bool(outs) and all(self._tag(t)[0] == QK for t in outs)
        if op in _MM:
            made = bool(outs) and (all(self._tag(t)[1] in (RAW, FOLDED, READY) for t in outs) or (both and not fed))
            if made and not fed:
                self.add("scores", sum(t.numel() for t in outs))
        elif op in _SAME:
            made = bool(fed)
        else:
            rows_d = bool(outs) and all(self._rows_of_d(t, d, heads) for t in outs)
            sums = any(self._tag(t)[0] == QK for t in ins) and rows_d
            # review r23: einsum contracts a one-row block by a broadcast mul, (keys, d, 1): dK's part, no tile
            einsum = op in ("mul", "mul_") and rows_d and all(t.shape[-1] == 1 for t in outs)
            made = (exp and any(self._tag(t)[0] == QK for t in ins)) or (bool(fed) and op not in _REDUCE
                                                                         and not einsum) or (both and not fed and not sums)
        shared = {_ptr(t) for t in ins}
        for t in outs:             # a view keeps its storage's standing; a fresh storage takes the op's
            if _ptr(t) not in shared or (made and op.endswith("_")):
                (self.tiles.add if made else self.tiles.discard)(_ptr(t))
        for t in (outs if made else []) + ([] if op in _SAME else fed):
            if _wider(self._rest(t.shape, heads), block, d) or t.numel() > heads * block * max(block, d):
                return (f"a tile of shape {tuple(t.shape)} made from both Q and K (scores, P, dP - D or dS) "
                        f"is larger than one {block} x {block} tile per head: more than {block} query rows "
                        f"against the key block at once; loop over query blocks of {block} rows")
        return ""

    def wrong(self, need: int = 0) -> str:
        """'' or the first part of the rule the call broke (:func:`.labexp2_words.verdict`); ``need``:
        the visible scores of the call (heads x query rows x the keys each sees), each of which exp2
        must have taken."""
        return verdict(self, need)
