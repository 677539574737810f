"""Lab 06's diagnosis of a plan that is too slow: the lever the fastest layout pulls and the
learner's does not, or else the term of the step where the learner's plan loses the most.

A lever is named only when it matters in the case: the planner's best without it is itself more
than the lab's slack behind the fastest layout (computed here, outside the learner's call). So a
search without hybrid sharding is told so on the slow network, one without context parallelism
at 131,072 tokens, one without interleaving where 1F1B's sends are exposed.
"""

from functools import lru_cache

from gpumem import planner

# (what the learner reads, the layout uses it, the planner's levers without it)
LEVERS = (
    ("hybrid sharding (hybrid='hsdp' or 'hpz' with a shard group)",
     lambda lay: lay.hybrid != "none", {"hybrid": ("none",)}),
    ("context parallelism (cp > 1: ring attention)",
     lambda lay: lay.cp > 1, {"cp": (1,)}),
    ("the interleaved schedule (vp > 1 virtual stages)",
     lambda lay: lay.vp > 1, {"vp": (1,)}),
    ("pipeline parallelism (pp > 1)", lambda lay: lay.pp > 1, {"pp": (1,)}),
    ("tensor parallelism (tp > 1)", lambda lay: lay.tp > 1, {"tp": (1,)}),
    ("offload (optimizer or optimizer+params)", lambda lay: lay.offload != "none",
     {"offloads": (("none", "cpu"),)}),
    ("Megatron-Core's engine (mcore=True: its overlaps)", lambda lay: lay.mcore, None),
)
TERMS = ("compute", "attention_scores", "pipeline_bubble", "tensor_parallel", "context_parallel",
         "pipeline_p2p", "data_parallel", "optimizer", "offload")


def fastest(plans: list):
    """The fitting plan with the shortest step (the ranking may put a tie-band neighbour first)."""
    return min(plans, key=lambda p: p.time["total"])


@lru_cache(maxsize=32)
def best_without(case: tuple, inter_node, levers: tuple):
    """The planner's fastest fitting plan for ``case`` with ``levers`` (``(name, values)`` pairs)
    narrowed, mixed precision; None when nothing fits (kept: the tests ask the same)."""
    model, gpus, gpu, seq, batch = case
    r = planner.plan(model, gpus, gpu, seq=seq, global_batch=batch, inter_node=inter_node, advise=False,
                     recipes=("mixed",), **dict(levers))
    return fastest(r.plans) if r.plans else None


def _best_without(result, case: tuple, inter_node, kwargs, uses) -> float | None:
    if kwargs is None:
        times = [p.time["total"] for p in result.plans if not uses(p.layout)]
        return min(times) if times else None
    p = best_without(case, inter_node, tuple(kwargs.items()))
    return None if p is None else p.time["total"]


def why_slower(mine, result, case: tuple, inter_node, slack: float) -> str:
    """One clause: the missing lever that matters here, else the term that loses the most."""
    best = fastest(result.plans)
    for text, uses, kwargs in LEVERS:
        if uses(best.layout) and not uses(mine.layout):
            without = _best_without(result, case, inter_node, kwargs, uses)
            if without is None or without > slack * best.time["total"]:
                alone = "no layout fits without it" if without is None else f"without it the best is {without:.2f} s"
                return (f"your plan lacks {text}, which the fastest layout uses; {alone}. Does your search "
                        f"try it? (fastest: {best.layout.label()})")
    term = max(TERMS, key=lambda k: mine.time[k] - best.time[k])
    return (f"its {term.replace('_', ' ')} term takes {mine.time[term]:.2f} s against {best.time[term]:.2f} s in "
            f"the fastest layout ({best.layout.label()})")
