"""Lab 04's exp2 rule in words: the first part of :class:`.labexp2.Exp2Rule` a call broke, with
the fix FlashAttention-2's kernels show (exp2 with log2(e) folded into the softmax scale)."""


def verdict(rule, need: int = 0) -> str:
    """'' or the first part of the rule ``rule`` saw broken; ``need``: the visible scores of the call
    (heads x query rows x the keys each sees), each of which exp2 must have taken."""
    c = f"{rule.folded_scale:.6g}"
    if rule.plain:
        return (f"it rebuilt P with {rule.plain}, the natural base, as chapter 04's backward does: "
                f"FlashAttention-2's kernels take exp2 with log2(e) folded into the softmax scale "
                f"(scale_softmax_log2 = scale * log2 e); use torch.exp2, no exp")
    if rule.other:
        return (f"{rule.other} on scores (numbers made from both Q and K): only exp2 may exponentiate; "
                f"rebuild P as FlashAttention-2 does, exp2(S * c2 - lse * log2 e), c2 = scale * log2(e) = {c}")
    if rule.exp2n < need:
        return (f"it took exp2 of {rule.exp2n:,} distinct scores, fewer than the {need:,} visible scores of "
                f"the call (heads x query rows x the keys each sees; a tile taken again, or its product made "
                f"again, counts once): rebuild every visible probability with exp2 (S * c2 - lse * log2 e), "
                f"c2 = scale * log2(e) = {c}, not by another road")
    if rule.unfolded and rule.alone:
        return (f"it took exp2 of scores multiplied by log2(e) on its own ({rule.unfolded}): two multiplies "
                f"per score; fold log2(e) into the softmax scale: exp2(S * c2 - lse * log2 e), c2 = "
                f"scale * log2(e) = {c}")
    if rule.unfolded:
        return (f"it took {rule.unfolded} that does not come from the score tile Q K^T multiplied once "
                f"by scale * log2(e) = {c} (then the lse in base 2 subtracted, masking allowed): fold "
                f"log2(e) into the softmax scale, exp2(S * c2 - lse * log2 e)")
    if rule.unused:
        tile, _, how = rule.unused.partition("|")      # how: the product without a matmul (labproducts)
        return (f"a product (P^T dO, dS K or dS^T Q){how} took {tile} made from Q and K that is not "
                f"exp2's output: the probabilities must be the ones exp2 rebuilt (masked, cast or scaled "
                f"after it), not numbers made by another road")
    return ""
