"""Lab 04's shape rules, op by op, for :class:`.labguard.Watch` (``watch`` is the watch): a tensor
the size of the score matrix, wider than a key block, with a row per key, too many query rows
against a key block or more keys than a shard (:func:`shape`); work on query rows above the causal
diagonal (:func:`above_diagonal`). The watch's docstring lists the rules in words."""

import torch

from .labexp2_words import too_wide
from .labops import _COPIES, _ptr, _tensors, rows_last


def above_diagonal(watch, name: str, args, out) -> None:
    """Flag an op (not a view, not a copy) fed rows i0:i1 of Q or dO, or a copy of them, that all
    lie before key ``causal_from``; a copy of such rows carries their range on."""
    if watch.broken or any(w in name for w in ("slice", "view", "select", "expand", "split", "unbind")):
        return
    copy = name.split(".")[1] in _COPIES or name.split(".")[1] in ("copy_", "_to_copy", "clone")
    for t in _tensors(list(args)):
        if not (t.dim() >= 2 and t.numel()):
            continue
        if _ptr(t) in watch.tiles:
            i0, i1 = watch.tiles[_ptr(t)]
        elif _ptr(t) in watch.queries and t.stride(-2) == watch.d and t.stride(-1) == 1 \
                and t.shape[-2] < watch.s_q:                    # a tile, not the whole of Q
            i0 = (t.storage_offset() // watch.d) % watch.s_q
            i1 = i0 + t.shape[-2]
        else:
            continue
        if i1 > watch.causal_from:
            continue
        if copy:
            watch.tiles.update({_ptr(o): (i0, i1) for o in _tensors(out) if o.numel()})
        else:
            watch.flag(f"causal key block from key {watch.causal_from}: it worked on query rows "
                      f"{i0}:{i1}, which see none of its keys; skip the query blocks above the diagonal")


def shape(watch, t: torch.Tensor) -> None:
    """Flag ``t``, a tensor an op made, by its shape: the whole score matrix, wider than a key block
    (K, V and rows of queries aside), a row per key, too many query rows against a key block, or
    more keys than the longest shard (the first that applies)."""
    if watch.broken or t.dim() < 1 or (t.numel() and _ptr(t) in watch.allowed):
        return
    shape, s_q, s_k, block = tuple(t.shape), watch.s_q, watch.s_k, watch.block
    last2 = shape[-2:] if t.dim() >= 2 else ()
    rows_of_d = last2 == (s_q, watch.d)            # outputs, dQ or a stack of them: not scores
    if not rows_of_d and (last2 in ((s_q, s_k), (s_k, s_q)) or t.numel() // max(watch.heads, 1) >= s_q * s_k):
        watch.flag(f"a tensor of shape {shape} was made: the whole {s_q} x {s_k} score matrix; "
                  f"work one block of keys at a time")
    elif not t.is_floating_point():
        return                                    # key indices and masks are not scores
    elif shape[-1] > block and shape[-1] not in (s_q, watch.d) and not (t.numel() and _ptr(t) in watch.rows):
        watch.flag(too_wide(shape, block, watch.exp2 is not None and rows_last(t, watch.exp2.tiles)))
    elif len(last2) == 2 and last2[0] == s_k and s_k > block and last2[1] != watch.d:
        watch.flag(f"a tensor of shape {shape} was made: a row for each of the {s_k} keys; "
                  f"work one block of keys at a time")
    elif watch.tile_rows is not None and len(last2) == 2 and watch.d not in last2 and (
            (last2[0] > block and last2[1] == watch.tile_rows)
            or (last2[1] > block and last2[0] == watch.tile_rows)):
        watch.flag(f"a tile of shape {shape} was made: more than {block} query rows against the "
                  f"key block at once; loop over query blocks of {block} rows")
    elif watch.joined is not None and len(shape) >= 2 and shape[-2] > watch.joined and shape[-2] != s_q:
        watch.flag(f"a tensor of shape {shape} was made: {shape[-2]} keys in one tensor, more than "
                  f"the longest shard ({watch.joined}); the shards were joined, merge partials instead")
