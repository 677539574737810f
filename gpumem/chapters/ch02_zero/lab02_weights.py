"""Lab 02's value rows: the gradient shards when backward returns (:func:`grade_shards`, with what a
wrong shard looks like), and the weights after a few steps of the learner's hooks and the given
``sharded_step`` against single-process ``torch.optim.AdamW`` on the whole batch.

The two sum the same gradients in another order, so they differ by float32 rounding, and AdamW
divides by ``sqrt(v)``: an element whose gradient is at rounding level (a few in a tensor, on some
seeds) can step by up to ``lr`` either way in each step where the other side stepped the other way.
So most elements must agree within :data:`W_ATOL`, and at most :data:`FEW` of a tensor's elements
may differ by more, each by no more than ``2 * lr * steps`` (both sides' largest steps). A wrong
update (a stale or missing shard, a step skipped) moves most elements of a tensor by about ``lr``.
"""

import math
import numbers

SHARD_RTOL, SHARD_ATOL = 1e-4, 1e-5   # gradient shards: float32 sums in another order
W_ATOL = 1e-4           # most elements: float32 rounding through a few Adam steps
RTOL = 1e-4
FEW = 1e-3              # the share of a tensor's elements allowed past W_ATOL (at least one)


def first_diverging(names: list[str], want: list, ranks: list[dict], lr: float, steps: int) -> str | None:
    """The first tensor, on any rank, whose weights differ beyond the rule above, or None."""
    import torch
    for r, res in enumerate(ranks):
        for name, w, got in zip(names, want, res["weights"]):
            diff = (got - w).abs()
            far = diff > W_ATOL + RTOL * w.abs()
            few = int(far.sum()) <= max(1, int(FEW * w.numel()))
            if not (few and diff.max().item() <= 2 * lr * steps):
                return (f"first diverging tensor: {name} on rank {r}, max |got - expected| = {diff.max().item():.3g}"
                        f" ({int(far.sum())} of {w.numel()} elements beyond {W_ATOL:g})")
    return None


def grade_shards(ranks: list[dict], ref: dict, world: int) -> str | None:
    """The first wrong, missing or extra shard after the first backward, or a full gradient left behind."""
    import torch
    names = ref["names"]
    unused = [n for n, g in zip(names, ref["grads"]) if g is None]
    why = (f"; {' and '.join(unused)} get no gradient here, so a count of arrivals never reaches "
           "len(params): let autograd's engine tell you the pass is over" if unused else
           " (was the last, partly filled bucket sent?)")
    for r, res in enumerate(ranks):
        keys = [k for k in res["first"]["shards"] if isinstance(k, bool) or not isinstance(k, numbers.Integral)]
        if keys:         # review r12 #3: chapter 02's ZeroAdamW keys its shards by the parameter itself
            return (f"grad_shards' keys must be each parameter's index in params (an int, 0 to {len(names) - 1}); "
                    f"rank {r} has {type(keys[0]).__name__} keys (chapter 02's ZeroAdamW keys by the parameter)")
        left = res["first"]["grads_left"]
        if left and left[0] not in res["first"]["shards"]:
            return f"{names[left[0]]} has its full .grad and no shard on rank {r} when backward returns{why}"
        if left:
            return f"{names[left[0]]} still has its full .grad on rank {r} when backward returns (free it)"
        for i, (name, g) in enumerate(zip(names, ref["grads"])):
            got = res["first"]["shards"].get(i)
            if g is None:
                if got is not None:
                    return (f"grad_shards has an entry for {name}, which got no gradient in this pass: leave "
                            "it out (the step skips it, as torch.optim skips a .grad of None)")
                continue
            c = math.ceil(g.numel() / world)
            want = torch.nn.functional.pad(g.reshape(-1), (0, c * world - g.numel()))[r * c:(r + 1) * c]
            if got is None:
                return f"grad_shards has no entry for {name} (index {i}) on rank {r} when backward returns{why}"
            if got.shape != want.shape:
                return f"grad_shards[{i}] ({name}) on rank {r}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            if not torch.allclose(got, want, rtol=SHARD_RTOL, atol=SHARD_ATOL):
                return (f"first wrong gradient shard: {name} on rank {r}, max |got - expected| = "
                        f"{(got - want).abs().max().item():.3g}" + why_wrong(got, want, ref["grads"], world))
    return None


def why_wrong(got, want, grads: list, world: int, unwaited: bool = True) -> str:
    """What a wrong shard looks like: the sum over ranks, or values of the right gradients from
    another place in the flattened bucket (the rank-major layout skipped); else, with ``unwaited``,
    a shard read before its wait."""
    import torch
    if torch.allclose(got, want * world, rtol=SHARD_RTOL, atol=SHARD_ATOL):
        return (f": you summed, the reference averages over {world} ranks (AdamW barely notices a constant "
                "factor, so the weights rows may pass: this row is the one to trust)")
    k = min(8, got.numel())
    if not k or torch.allclose(got[:k], want[:k], rtol=SHARD_RTOL, atol=SHARD_ATOL):
        return ""
    flat = torch.cat([g.reshape(-1) for g in grads if g is not None])
    for scale, how in ((1, ""), (world, "summed, and ")):
        windows = (flat * scale).unfold(0, k, 1) if flat.numel() >= k else flat[:0].view(0, k)
        if torch.isclose(windows, got[:k], rtol=SHARD_RTOL, atol=SHARD_ATOL).all(dim=1).any():
            return (f": {how}it holds gradient values from another place in the bucket, so the shard order is "
                    "not rank-major ([piece r of every gradient] goes to rank r)")
    # review r12 #5: a shard read before its wait holds torch.empty's garbage
    if not unwaited:
        return ""
    return (": its values match no place in the gradients: was it read (or divided) before its handle was "
            "waited? On gloo a reduce-scatter's output is written only by wait()")
