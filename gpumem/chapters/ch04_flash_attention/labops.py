"""Lab 04's op tables (frozensets: review r15 #2 added ``bmm`` to a mutable ``_SAME`` for the length of
the call and passed 25/25) for :mod:`.labexp2`: which ATen ops (by name, without namespace and overload)
are exponentials, views and copies, products, sums, reductions and masks, and the tags the exp2
rule gives a tensor (where its numbers come from, and its form); with the helpers both read."""

import functools
import math
from types import MappingProxyType

import torch

LOG2E = math.log2(math.e)
_RTOL = 1e-9                      # a Python float of scale * log2 e, however it was spelled
Q, K, QK = 1, 2, 3                # where a tensor's numbers come from (bits)
PLAIN, ONE, RAW, FOLDED, READY = "plain", "one", "raw", "folded", "ready"
PROB = "prob"                       # exp2's output from a folded or ready tile (masked, cast or scaled)
GRAD = "grad"                       # made from PROB by one product with dO, Q or K, then sums (review r31 #1)
COND = "cond"                       # a comparison of a score tile or of P: a mask, never a number
# ops whose output holds the same numbers as their first tensor (views, copies, casts)
_SAME = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "_reshape_copy", "expand", "expand_copy", "slice",
    "select", "transpose", "t", "permute", "unsqueeze", "squeeze", "as_strided", "narrow", "alias",
    "detach", "clone", "_to_copy", "contiguous", "view_copy", "permute_copy", "transpose_copy",
    "unsqueeze_copy", "squeeze_copy", "slice_copy", "select_copy", "unbind", "split", "split_with_sizes",
    "movedim", "flatten", "repeat", "repeat_interleave", "index_select", "_conj", "resolve_conj",
    "resolve_neg", "lift_fresh", "lift_fresh_copy"})
_MM = frozenset({"mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm"})
_ADD = frozenset({"add", "add_", "sub", "sub_", "rsub"})
_REDUCE = frozenset({  # rows of a tile: no tile
    "sum", "mean", "amax", "amin", "max", "min", "logsumexp", "prod", "norm", "linalg_vector_norm",
    "var", "std", "argmax", "argmin", "all", "any", "count_nonzero", "nansum"})
_MASK = frozenset({"masked_fill", "masked_fill_", "index_put", "index_put_", "fill_"})
# review r31 #1, the provenance rule: GRAD keeps its form through these (adds, sums, joins, partial writes)...
_LINEAR = frozenset({
    "add", "add_", "sub", "sub_", "rsub", "neg", "neg_", "sum", "nansum", "mean", "cumsum", "cumsum_", "cat",
    "stack", "copy_", "index_put", "index_put_", "_index_put_impl_", "index_add", "index_add_", "masked_fill",
    "masked_fill_", "where", "select_scatter", "slice_scatter", "scatter_add", "scatter_add_", "zero_",
    "constant_pad_nd"})
# ...and is made by one of these products (where its factors are; the divisor of a division is the last)
_FACTORS = MappingProxyType({      # read-only, like the frozensets (review r15 #2)
    **dict.fromkeys(("mm", "bmm", "matmul", "mv", "dot", "vdot", "mul", "mul_"), slice(0, 2)),
    **dict.fromkeys(("div", "div_", "true_divide", "true_divide_"), slice(0, 2)),
    **dict.fromkeys(("addmm", "baddbmm", "addbmm", "addmv", "addr", "addcmul", "addcmul_", "addcdiv", "addcdiv_",
                     "addmm_", "baddbmm_", "addbmm_", "addmv_", "addr_"), slice(1, 3))})
_DIVIDES = frozenset({"div", "div_", "true_divide", "true_divide_", "addcdiv", "addcdiv_"})
# comparisons: of a score tile or of P (with numbers or tensors made from neither Q nor K) they make a mask
_CMP = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "isinf", "isnan", "isneginf", "isposinf", "isfinite",
                  "logical_not", "logical_and", "logical_or", "logical_xor", "bitwise_not", "bitwise_and",
                  "bitwise_or", "bitwise_xor"})
# other transcendental ops: on numbers made from both Q and K, another road to e^x (review r13 #1:
# P = 1 / (cosh x - sinh x) passed with no exp2 at all); in-place forms end in "_"
_OTHER = frozenset({
    "cosh", "sinh", "tanh", "softplus", "erf", "erfc", "erfinv", "lgamma", "digamma", "polygamma",
    "mvlgamma", "sin", "cos", "tan", "asin", "acos", "atan", "asinh", "acosh", "atanh", "atan2", "log",
    "log2", "log10", "log1p", "logit", "logaddexp", "logaddexp2", "xlogy", "ldexp", "i0", "sinc",
    "gelu", "silu", "elu", "celu", "selu", "mish", "log_sigmoid_forward", "hardsigmoid", "frexp",
    "float_power", "glu"})              # review r24: glu(x) = x1 * sigmoid(x2), and sigma(x) / sigma(-x) = e^x
_POWERS = (0.5, 1, 2, -1, -0.5)   # pow(x, c) of a score tile that is algebra, not an exponential


def _ptr(t) -> int:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) and t.numel() else 0


def _tensors(out) -> list:
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def _flat(xs) -> list:
    """``xs`` with nested tuples and lists flattened, in order. A list, not a generator: it runs
    inside lab 04's profile hooks, where every generator step is two more events."""
    out, todo = [], [iter(xs)]
    while todo:
        for x in todo[-1]:
            if isinstance(x, (tuple, list)):
                todo.append(iter(x))
                break
            out.append(x)
        else:
            todo.pop()
    return out


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _rest(shape, heads: int) -> list:
    """``shape`` without its leading batch and head dimensions (``heads`` of them in all, in
    any grouping: (b, a, ...), (b * a, ...), (b, kv, g, ...), or heads packed with rows)."""
    dims, done = list(shape), 1
    while dims and done < heads and dims[0]:
        if heads % (done * dims[0]) == 0:
            done *= dims.pop(0)
        elif (done * dims[0]) % heads == 0:
            dims[0], done = done * dims[0] // heads, heads
        else:
            break
    return dims


def _rows_of_d(t, d: int, heads: int) -> bool:
    """``t`` is (..., rows, d) past its batch and heads: dQ, dK, dV or a sum of their parts. Trailing
    1s go first (einsum's broadcast product ends in the contracted axis, review r23); the heads are
    folded out of what is left of d, never into d (review r23: dq[:, h] of a per-head loop has no head
    axis, and (2, 1, 20) with 4 heads folded 20 into them); a group of one query head, (b, kv, 1,
    rows, d), and a block of one row (review r22) leave leading 1s."""
    shape = list(t.shape)
    while len(shape) > 1 and shape[-1] == 1 and d != 1:
        shape.pop()
    if not shape or shape[-1] != d:
        return False
    rest = _rest(shape[:-1], heads)
    while len(rest) > 1 and rest[0] == 1:
        rest.pop(0)
    return len(rest) <= 1


def _wider(rest: list, block: int, d: int) -> bool:
    """A dimension past the batch and heads over ``block``; a last one of d (after trailing 1s) is
    not a key width (review r23: einsum's broadcast product of a key block and dO, d > block)."""
    dims = list(rest)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return any(x > block for x in (dims[:-1] if dims and dims[-1] == d else dims))


def _marks():
    """``(mark, add, seen)`` over one closure: what the rule found (``plain``, ``other``, ``exp2``,
    ``unfolded``, ``alone``, ``unused``), each kept once set, and what it counted (``exp2n``: distinct
    visible scores taken exp2 of; ``scores``: numbers of score tiles made), which only grow."""
    state = {"plain": "", "other": "", "exp2": False, "unfolded": "", "alone": False, "unused": "", "exp2n": 0,
             "scores": 0}

    def mark(name: str, value) -> None:
        state[name] = state[name] or value

    def add(name: str, n) -> None:
        state[name] += max(0, int(n))
    return mark, add, state.get


# the watch's tables (:mod:`.labguard`)
# ops that copy a tensor without arithmetic: a copy of K or V (its GQA expansion, its fp32 cast)
# is K or V for the rules; joining shards (cat, copy_ into a buffer) is not in the list
_COPIES = frozenset({"clone", "_to_copy", "index_select", "repeat", "repeat_interleave", "contiguous"})
# Tensor methods that take the numbers out of torch (computing elsewhere would hide the tiles)
_EXITS = frozenset({"numpy", "__array__", "untyped_storage", "storage", "_storage", "data_ptr", "__dlpack__",
          "__array_interface__", "__reduce_ex__", "__setstate__", "__deepcopy__", "_typed_storage",
          "__getstate__", "_data_ptr", "apply_", "map_", "map2_"})
# numbers read into Python: tolist here (item, float, int, bool, __index__ are ATen's _local_scalar_dense);
# of them, a handful made from Q or K (a tile's emptiness tested, say); printing reads them all
_READS, _READ_BUDGET, _QK_READS = frozenset({"tolist"}), 1000, 8
_PRINTS = frozenset({"__format__", "__repr__", "__str__"})
_EXPS = frozenset({"exp", "exp_", "exp2", "exp2_", "expm1", "expm1_", "_softmax", "_masked_softmax",
                   "sigmoid"})                                                                 # probabilities
_FRESH = frozenset({"lift_fresh", "lift_fresh_copy", "lift"})     # torch.tensor(...) of Python numbers
_SMALL = 64                                           # numbers a constant may hold
_SIZED = frozenset({"tensor_split"})   # by a tensor: ATen reads its memory unseen (review r18 #1 read K so)
# ops whose answer in Python is read from the numbers: a bool, or the length of their result (review r32 #1)
_ANSWERS = frozenset({"equal", "nonzero", "nonzero_numpy", "argwhere", "masked_select", "unique_dim",
                      "_unique", "_unique2", "unique_consecutive",
                      "_pack_padded_sequence"})   # review r37: its batch_sizes' length is set by the lengths' values
# ops that hand Python a number but read only a tensor's shape, not its values
_SHAPE_ONLY = frozenset({"size", "sym_size", "stride", "sym_stride", "dim", "numel", "sym_numel", "storage_offset",
                         "sym_storage_offset", "is_contiguous", "is_same_size", "is_strides_like_format",
                         "is_non_overlapping_and_dense", "_local_scalar_dense"})
_SCALARS = ("float", "int", "bool", "Scalar", "SymInt", "SymFloat", "SymBool", "number", "complex")


@functools.lru_cache(maxsize=None)      # per op, once: it runs at every op of a graded call
def scalar_out(func) -> bool:
    """The op returns Python numbers, not tensors (review r35: ``q_scale`` of a quantized copy of K
    handed Python one float of K's a call, ``_nnz`` the count of a sparse one), shape queries and
    ``item`` (counted on its own) aside."""
    schema = func._schema
    return schema.name.split("::")[-1] not in _SHAPE_ONLY and any(
        str(r.type).rstrip("?") in _SCALARS for r in schema.returns)


def rows_last(t: torch.Tensor, tiles) -> bool:
    """``t`` is a transposed view (its last axis the storage's rows) of a tile of P's family (``tiles``:
    their storages): a score tile is made (query rows, keys), so its last axis holds query rows, not keys."""
    return t.dim() >= 2 and bool(t.numel()) and _ptr(t) in tiles and t.stride(-2) == 1 and t.stride(-1) != 1


@functools.lru_cache(maxsize=None)      # per op, once (19 us a call uncached: 7 s a check)
def dynamic(func) -> bool:
    """Some overload of the op has ATen's ``dynamic_output_shape`` tag (review r36: ``bincount.out``,
    ``repeat_interleave.Tensor_out`` and ``index.Tensor_out`` lack it where their plain overloads have it)."""
    packet = func.overloadpacket
    return torch.Tag.dynamic_output_shape in func.tags or any(
        torch.Tag.dynamic_output_shape in getattr(packet, o).tags for o in packet.overloads())


_FILLS = frozenset({"full", "full_like", "new_full", "scalar_tensor", "fill_", "fill"})
_LIFTS = frozenset({"lift_fresh", "lift_fresh_copy"})
FILL_BUDGET = 32        # distinct Python numbers a call may make tensors of, plus s_q + s_k; the lab's kernels use 2-4


def fills(watch, name: str, args) -> None:
    """Review r36: every launder of K so far came back as Python numbers, one ``torch.full`` (or
    ``torch.tensor``) an element. Count the distinct numbers the call makes tensors of (0, -inf and
    the scale in an honest kernel; a position per row or key, at most); past :data:`FILL_BUDGET` plus
    the case's query and key lengths, flag it (laundering K takes one or more per element of K)."""
    op = name.split(".")[1]
    if op in _FILLS:
        watch.fills.add(next((a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)), None))
    elif op in _LIFTS and args and isinstance(args[0], torch.Tensor):      # torch.tensor(...): its values,
        lifted = args[0]                                                     # review r37: not one per element
        watch.fills.update(lifted.flatten().tolist() if lifted.numel() <= 4096 else [("lifted", id(lifted))])
    budget = FILL_BUDGET + watch.s_q + watch.s_k          # a row or key position each, at most, beside them
    if len(watch.fills) > budget:
        watch.flag(f"it made tensors of {len(watch.fills)} different Python numbers (torch.{op}, torch.full, "
                   f"torch.tensor...), more than {budget}: a kernel's constants are few; numbers taken out "
                   "of torch and put back are its inputs' numbers, laundered")
