"""Lab 03's selective cases (``labsac``): layers and budgets that no greedy rule meets.

A budget is kept only if every rule of :func:`greedy_picks` re-runs more than ``labsac.SLACK``
above the fewest FLOPs at that budget (:func:`traps`). The rules take the operators with FLOPs in
some order and keep each that still fits: FLOPs per byte first (exact, or rounded down to a whole
number), with ties by bytes up or down, by FLOPs, or by place either way; the most FLOPs first;
the fewest bytes first. Each rule skips what does not fit, or stops there, and each is also tried
as "that, or the single operator with the most FLOPs that fits" (the textbook fix for greedy
knapsack). A submission that takes the best of several of them still misses.

Early stop (``labsac``'s docstring): for a layer alone the re-run never reaches W_down, the last
operator with FLOPs; with the final norm in the region it re-runs everything. So the draw works
on two listings of the hand count (:func:`_sketch`, :func:`_spent`): the FLOPs the re-run spends
(tests hold them equal to the measured ``Listing.worth``) and the wrong reading of the region
(W_down counted for a layer alone, as the FLOPs given to the learner; W_down left out with the
final norm). A budget is kept only if the greedy rules miss on both (each rule's pick judged by
the FLOPs the re-run spends) and every best choice of the wrong reading misses too
(:func:`_defeats`). Every check has a case of each region (:func:`draw`): a knapsack over the
FLOPs as given fails it, and so does one that always leaves the last matmul out.

This module is not among those ``labguard`` refuses or fingerprints: a learner's own greedy loop
must not be taken for a copy of the grader's (review: one was, while these rules sat in
``labsac``). What it uses of the answer key, ``labsac.best``, is refused inside a learner's call.
"""

import random

from .labsac import FFN, HIDDEN, SEQ, SHARES, SLACK, best
from .labsacrun import Layer

TRIES = 200                 # layers drawn per case, at most, for one with a greedy-defeating budget


def _greedy(ops: list, budget: int, key, stop: bool) -> set:
    """The operators with FLOPs in ``key``'s order, each kept if it fits (``stop``: until one does not)."""
    kept, used = set(), 0
    for i in sorted((i for i, o in enumerate(ops) if o["flops"] > 0), key=lambda i: key(i, ops[i])):
        if used + ops[i]["bytes"] <= budget:
            kept.add(i)
            used += ops[i]["bytes"]
        elif stop:
            break
    return kept


_RATIOS = (lambda o: o["flops"] / o["bytes"], lambda o: o["flops"] // o["bytes"])
_TIES = (lambda i, o: -o["bytes"], lambda i, o: o["bytes"], lambda i, o: -o["flops"], lambda i, o: i,
         lambda i, o: -i)
_KEYS = tuple((lambda i, o, r=r, t=t: (-r(o), t(i, o))) for r in _RATIOS for t in _TIES) + (
    lambda i, o: -o["flops"], lambda i, o: o["bytes"])


def greedy_picks(ops: list, budget: int) -> list:
    """What greedy rules keep: FLOPs per byte first (exact or whole, ties by bytes up or down, by
    FLOPs, by order either way), the most FLOPs first, the fewest bytes first; each skipping what
    does not fit or stopping there, and each also as "that, or the best single operator"."""
    picks = [_greedy(ops, budget, key, stop) for key in _KEYS for stop in (False, True)]
    fits = [i for i, o in enumerate(ops) if 0 < o["bytes"] <= budget and o["flops"] > 0]
    single = {max(fits, key=lambda i: ops[i]["flops"])} if fits else set()
    return picks + [max(p, single, key=lambda q: sum(ops[i]["flops"] for i in q)) for p in picks]


def _spent(ops: list, final_norm: bool, wrong: bool = False) -> list:
    """``ops`` (the hand count) with the FLOPs the early-stopping re-run spends on each (or, with
    ``wrong``, the other region's reading): a layer alone never re-runs W_down (the last saved
    tensor is its input); with the final norm, the norm saves the residual sum, and all is re-run."""
    if final_norm != wrong:
        return ops
    return ops[:-1] + [dict(ops[-1], flops=0)]


def _defeats(worth: list, wrong: list, budget: int) -> bool:
    """At ``budget``, with ``worth`` the FLOPs the re-run spends and ``wrong`` the other region's
    reading: every greedy rule, on either, re-runs more than :data:`SLACK` above the fewest FLOPs,
    and so does every best choice on ``wrong`` (for a layer alone, every best choice on the FLOPs
    as given keeps W_down, and every choice keeping it misses; with the final norm, every choice
    leaving W_down out misses)."""
    total, cost = sum(o["flops"] for o in worth), best(worth, budget)[0]
    enough = cost * (1 + SLACK)
    if not all(total - sum(worth[i]["flops"] for i in p) > enough
               for p in greedy_picks(worth, budget) + greedy_picks(wrong, budget)):
        return False
    down = worth[-1] if worth[-1]["flops"] else wrong[-1]
    if worth[-1]["flops"]:                                  # final norm: W_down left out
        return best(wrong, budget)[0] + down["flops"] > enough
    with_down = best(worth, budget - down["bytes"])[0] if down["bytes"] <= budget else total
    naive = sum(o["flops"] for o in wrong) - best(wrong, budget)[0]          # most FLOPs kept, as given
    return with_down > enough and naive > total - cost


def traps(ops: list, low: float, high: float) -> list:
    """The budgets between ``low`` and ``high`` of the costly operators' bytes that every greedy
    rule misses (as :func:`greedy_picks` and ``labsac.best`` would say, computed here at once for
    every budget): each the bytes of some set of operators (the optimum fills it exactly)."""
    costly = [i for i, o in enumerate(ops) if o["flops"] > 0]
    most = {0: 0}                                    # bytes of a set of them -> the most FLOPs kept
    for i in costly:
        size, gain = ops[i]["bytes"], ops[i]["flops"]
        for held, kept in list(most.items()):
            if most.get(held + size, -1) < kept + gain:
                most[held + size] = kept + gain
    orders = [sorted(costly, key=lambda i: key(i, ops[i])) for key in _KEYS]
    total, size = sum(o["flops"] for o in ops), sum(ops[i]["bytes"] for i in costly)
    found, top = [], 0
    for budget in sorted(most):
        top = max(top, most[budget])
        if not low * size <= budget <= high * size:
            continue
        enough = total - (total - top) * (1 + SLACK)      # FLOPs a rule must keep to come within SLACK
        single = max((ops[i]["flops"] for i in costly if ops[i]["bytes"] <= budget), default=0)
        if single >= enough or _met(ops, orders, budget, enough):
            continue
        found.append(budget)
    return found


def _met(ops: list, orders: list, budget: int, enough) -> bool:
    """True as soon as one greedy rule (each order, skipping or stopping) keeps at least ``enough``
    FLOPs within ``budget``."""
    for order in orders:
        for stop in (False, True):
            kept = used = 0
            for i in order:
                if used + ops[i]["bytes"] <= budget:
                    kept, used = kept + ops[i]["flops"], used + ops[i]["bytes"]
                elif stop:
                    break
            if kept >= enough:
                return True
    return False


def _sketch(layer) -> list:
    """The operators with FLOPs of ``layer`` by hand count, in forward order (bf16; the CPU flash
    kernel's fp32 logsumexp): what ``labsacrun.forward_ops`` measures for them, with no torch run
    (tests/test_lab03_adversarial.py holds the two equal, and checks every greedy rule against
    the measured listing of draws 0-39), so that drawing costs no forward."""
    b, s, a, h, F = layer.batch, layer.seq, layer.heads, layer.d_model, layer.ffn
    T, d = b * s, h // a
    kv = d * layer.kv_heads
    proj = [(2 * T * o, 2 * T * i * o) for i, o in ((h, h), (h, kv), (h, kv))]
    attn = ([(2 * b * a * s * s, 2 * b * a * s * s * d), (2 * b * a * s * d, 2 * b * a * s * s * d)]
            if layer.kernel == "eager" else [(2 * T * h + 4 * b * a * s, 4 * b * a * s * s * d)])
    rest = [(2 * T * h, 2 * T * h * h), (2 * T * F, 2 * T * h * F), (2 * T * F, 2 * T * h * F), (2 * T * h, 2 * T * F * h)]
    return [{"op": "", "bytes": size, "flops": gain} for size, gain in proj + attn + rest]


def draw(rng: random.Random) -> list:
    """The check's selective cases: (``labsacrun.Layer``, budget), one per kind of ``SHARES``, at
    least one a layer alone and one with the final norm; each budget one that every greedy rule and
    every best choice of the wrong region's reading misses (:func:`traps`, :func:`_defeats`: layers
    are drawn until one has such a budget in the kind's share of the bytes of its operators the
    re-run reaches)."""
    cases = []
    norms = [True, False, rng.random() < 0.5]
    rng.shuffle(norms)
    for (kind, (low, high)), final_norm in zip(SHARES.items(), norms):
        for _ in range(TRIES):
            h, heads = rng.choice(HIDDEN)
            kv = rng.choice([k for k in (1, 2, heads) if heads % k == 0])
            kernel = rng.choice(("flash", "eager")) if kind == "either" else kind
            layer = Layer(h, heads, kv, rng.choice(FFN), kernel, rng.choice(SEQ), final_norm=final_norm)
            ops = _sketch(layer)
            worth, wrong = _spent(ops, final_norm), _spent(ops, final_norm, wrong=True)
            found = [b for b in traps(worth, low, high) if _defeats(worth, wrong, b)]     # the answer key's word
            if found:
                break
        else:
            raise RuntimeError(f"no {kind} layer with a budget that defeats the greedy rules in {TRIES} draws")
        budget = rng.choice(found)
        loose = budget + rng.randrange(min(o["bytes"] for o in ops if o["flops"]) // 8)
        cases.append((layer, loose if _defeats(worth, wrong, loose) else budget))
    return cases
