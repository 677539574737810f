"""Lab 02's weights row: the weights after a few steps of the learner's hooks and the given
``sharded_step`` against single-process ``torch.optim.AdamW`` on the whole batch.

The two sum the same gradients in another order, so they differ by float32 rounding, and AdamW
divides by ``sqrt(v)``: an element whose gradient is at rounding level (a few in a tensor, on some
seeds) can step by up to ``lr`` either way in each step where the other side stepped the other way.
So most elements must agree within :data:`W_ATOL`, and at most :data:`FEW` of a tensor's elements
may differ by more, each by no more than ``2 * lr * steps`` (both sides' largest steps). A wrong
update (a stale or missing shard, a step skipped) moves most elements of a tensor by about ``lr``.
"""

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
