"""Lab 04's exp2 rule in words: the first part of :class:`.labexp2.Exp2Rule` a call broke, named, then
a question that points at what to find (review r31 #3: no formula, no value of the folded scale;
cell 2 asks the learner to work them out)."""


def verdict(rule, need: int = 0) -> str:
    """'' or the first part of the rule ``rule`` saw broken; ``need``: the visible scores of the call
    (heads x query rows x the keys each sees), each of which exp2 must have taken."""
    if rule.plain:
        return (f"it rebuilt P with {rule.plain}, the natural base, as chapter 04's backward does. "
                f"FlashAttention-2's kernels take every exponential with exp2: what must go into exp2 so "
                f"that it gives the same probabilities?")
    if rule.other:
        return (f"{rule.other} on scores (numbers made from both Q and K): only exp2 may exponentiate. "
                f"Which step of your kernel makes P without exp2?")
    if rule.exp2n < need:
        return (f"it took exp2 of {rule.exp2n:,} distinct scores, fewer than the {need:,} visible scores of "
                f"the call (heads x query rows x the keys each sees; a tile taken again, or its product made "
                f"again, counts once). Which visible scores got their probability by another road?")
    if rule.unfolded and rule.alone:
        return (f"it took exp2 of scores multiplied by log2(e) on its own ({rule.unfolded}): a second "
                f"multiply per score. Where can log2(e) go so that each score gets a single multiply-add "
                f"before exp2?")
    if rule.unfolded:
        return (f"it took {rule.unfolded} that does not come from the score tile Q K^T multiplied once "
                f"by scale * log2(e) (then the lse in base 2 subtracted, masking allowed). What did exp2 "
                f"take, and which steps made it from the scores?")
    if rule.unused:
        tile, _, how = rule.unused.partition("|")      # how: the product without a matmul (labproducts)
        return (f"a product (P^T dO, dS K or dS^T Q){how} took {tile} made from Q and K that is not "
                f"exp2's output: the probabilities must be the ones exp2 rebuilt (masked, cast or scaled "
                f"after it), not numbers made by another road")
    return ""


def too_wide(shape: tuple, block: int, rows: bool) -> str:
    """A tensor wider than a block: keys side by side, or (``rows``: a transposed tile of scores or P,
    review r31 #4) query rows, as when the rows of several heads are stacked in one tile."""
    if rows:
        return (f"a tile of shape {shape} was made: {shape[-1]} query rows side by side (a transposed tile of "
                f"scores or P), more than one block ({block}); a tile holds at most {block} query rows, of one "
                "head: are the rows of several heads stacked in it?")
    return (f"a tensor of shape {shape} was made: {shape[-1]} keys side by side, more than one block ({block}); "
            "only K and V themselves may be that long")
