"""Lab 06's diagnosis of a plan that is too slow: the lever the fastest layout pulls and the
learner's does not, or else the term of the step where the learner's plan loses the most.

A lever is named only when it matters in the case: every fitting layout without it is itself more
than the lab's slack behind the fastest (read from the reference's full list of fitting plans,
computed after the learner's call). The case's own lever (its family's) is tried first. The
fastest layout's label and values are never printed, only the names of the settings in which it
differs from the learner's: the learner reads what is missing, not the answer.
"""

import copy

# (what the learner reads, the layout uses it)
LEVERS = (
    ("hybrid sharding (hybrid='hsdp' or 'hpz' with a shard group)", lambda lay: lay.hybrid != "none"),
    ("context parallelism (cp > 1: ring attention)", lambda lay: lay.cp > 1),
    ("the interleaved schedule (vp > 1 virtual stages)", lambda lay: lay.vp > 1),
    ("pipeline parallelism (pp > 1)", lambda lay: lay.pp > 1),
    ("tensor parallelism (tp > 1)", lambda lay: lay.tp > 1),
    ("ZeRO-1 or ZeRO-2", lambda lay: lay.zero in (1, 2)),
    ("NVMe offload (device='nvme')", lambda lay: lay.offload != "none" and lay.device == "nvme"),
    ("offload (optimizer or optimizer+params)", lambda lay: lay.offload != "none"),
    ("Megatron-Core's engine (mcore=True: its overlaps)", lambda lay: lay.mcore),
)
# which kind of hybrid sharding, named first (review r21: a search that tried HSDP read "it lacks hybrid
# sharding" where the fastest layout used hpZ)
HYBRIDS = (
    ("hpZ (hybrid='hpz': a secondary copy of the parameter shards inside each shard group)",
     lambda lay: lay.hybrid == "hpz"),
    ("HSDP (hybrid='hsdp': shards inside each group, replicas across groups)", lambda lay: lay.hybrid == "hsdp"),
)
TERMS = ("compute", "attention_scores", "pipeline_bubble", "tensor_parallel", "context_parallel",
         "pipeline_p2p", "data_parallel", "optimizer", "offload")


def fastest(plans: list):
    """The fitting plan with the shortest step (the ranking may put a tie-band neighbour first)."""
    return min(plans, key=lambda p: p.time["total"])


def best_without(plans: list, uses) -> float | None:
    """Seconds of the fastest fitting plan that does not pull the lever; None when none fits."""
    times = [p.time["total"] for p in plans if not uses(p.layout)]
    return min(times) if times else None


def why_slower(mine, result, slack: float, family=None) -> str:
    """One clause: the missing lever that matters here, else the term that loses the most. Where one
    of the learner's own settings, put into the fastest layout, costs more than the lever's absence
    (review r38 #3: micro_batch 1 there, 156.12 s; without tp, 120.74 s), that setting leads."""
    best = fastest(result.plans)
    levers = ((family.lever, family.uses),) if family is not None else ()
    swaps = one_swaps(mine.layout, best.layout, result.plans)
    for text, uses in HYBRIDS + levers + LEVERS:
        if uses(best.layout) and not uses(mine.layout):
            without = best_without(result.plans, uses)
            if without is None or without > slack * best.time["total"]:
                tail = (f"The fastest also differs from yours in {differs(mine.layout, best.layout)}: does your "
                        f"search reach them together?" + _swapped(swaps))
                k, t = swaps[0] if swaps else (None, None)
                if k is not None and t is not None and uses(_with(best.layout, k, getattr(mine.layout, k))) \
                        and (without is None or t > without):
                    return (f"your {k} holds it back most: the fastest layout with your {k} takes {t:.2f} s, "
                            f"against {best.time['total']:.2f} s. " + tail)
                alone = "no layout fits without it" if without is None else f"without it the best is {without:.2f} s"
                return f"it lacks {text}; {alone}. " + tail
    term = max(TERMS, key=lambda k: mine.time[k] - best.time[k])
    lever = _which_lever(term, mine, best.layout, result.plans)     # review r32: else the settings, by name
    return (f"your plan's {term.replace('_', ' ')} term takes {mine.time[term]:.2f} s against "
            f"{best.time[term]:.2f} s in the fastest layout"
            + (lever or f"; the fastest differs from yours in {differs(mine.layout, best.layout)}"))


SETTINGS = ("tp", "cp", "pp", "vp", "zero", "hybrid", "group", "offload", "device", "checkpoint", "micro_batch", "mcore")


def differs(mine, best) -> str:
    """The settings in which ``best`` differs from ``mine``, by name, not value (review r23: a lever
    the search tried was blamed where the policy was the knob; r24: printing the fastest layout
    handed out the answers a fixed table needs)."""
    names = [k for k in SETTINGS if getattr(mine, k, None) != getattr(best, k, None)]
    return ", ".join(names) or "nothing the lab sets"


def _with(layout, key: str, value):
    """A copy of ``layout`` with one setting changed (a frozen dataclass's too)."""
    out = copy.copy(layout)
    object.__setattr__(out, key, value)
    return out


def one_swaps(mine, best, plans) -> list:
    """[(setting, seconds or None)] for each setting in which ``best`` differs from ``mine``: the
    fastest layout's step with that one setting at the learner's value (None: no fitting layout, too
    big or no layout at all, e.g. hpZ groups of 16 at dp 40, review r39; listed last), the costliest
    first (review r37 #3, r38 #3: the best step that merely kept a value tied three settings at the
    learner's own time; a swap into the fastest tells them apart). Read from the fitting plans,
    matched on every setting; the fastest's values are never given."""
    out = []
    for k in (k for k in SETTINGS if getattr(mine, k, None) != getattr(best, k, None)):
        want = _with(best, k, getattr(mine, k, None))
        times = [p.time["total"] for p in plans
                 if all(getattr(p.layout, s, None) == getattr(want, s, None) for s in SETTINGS)]
        out.append((k, min(times) if times else None))
    return sorted(out, key=lambda c: (c[1] is None, -(c[1] or 0.0)))


def _swapped(swaps: list) -> str:
    if len(swaps) < 2:
        return ""
    return " The fastest layout with one of your values: " + ", ".join(
        f"{k} {'no fitting layout' if t is None else f'{t:.2f} s'}" for k, t in swaps) + "."


def _which_lever(term: str, plan, best, plans=()) -> str:
    """The lever behind a term, where the two layouts differ in it (review r9: "compute" and "data
    parallel" did not say that the checkpoint policy or the micro-batch was the knob). A lighter
    policy is named only where one fits the learner's own degrees (review r22: none did at pp 2,
    and the degrees were the knob); else the degrees the faster fitting layouts use."""
    mine = plan.layout
    if term == "compute" and mine.checkpoint != best.checkpoint:
        degrees = ("tp", "cp", "pp", "vp")
        faster = [p.layout for p in plans if p.time["total"] < plan.time["total"]]
        if not faster or any(all(getattr(x, k) == getattr(mine, k) for k in degrees) for x in faster):
            return f" (it recomputes more: checkpoint={mine.checkpoint!r}; does your search try lighter policies?)"
        reach = ", ".join(f"{k} in {{{', '.join(map(str, sorted({getattr(x, k) for x in faster})))}}}"
                          for k in degrees[:3])
        return (f" (it recomputes more: checkpoint={mine.checkpoint!r}, but no lighter policy fits your tp, cp "
                f"and pp; the faster layouts that fit use {reach}: do your loops reach them?)")
    if term == "data_parallel" and mine.micro_batch < best.micro_batch:
        return (f" (micro_batch={mine.micro_batch}: more micro-batches a step, each gathering or reducing "
                "over the data-parallel group; does your search try larger ones?)")
    return ""


def why_none(result, family=None) -> str:
    """The clause for a search that found nothing although layouts fit: what every fitting layout
    pulls (a lever the search must reach) and which degrees reach past powers of two, never their
    values (review r26: the values handed a table its missing pp); the search's choices are unknown."""
    plans = result.plans
    levers = ((family.lever, family.uses),) if family is not None else ()
    needed = next((text for text, uses in levers + LEVERS if all(uses(p.layout) for p in plans)), None)
    head = f"{len(plans)} layouts fit" + (f", all with {needed}" if needed else "")
    odd = sorted(k for k in ("tp", "cp", "pp", "vp") if any(getattr(p.layout, k) & (getattr(p.layout, k) - 1)
                                                            for p in plans))      # not a power of two
    degrees = "every tp, cp, pp and vp the GPUs and layers allow" + (
        f" ({' and '.join(odd)} of them not powers of two)" if odd else "")
    return f"{head}; yours returned none. Do your loops reach {degrees}? Check your fit test too"
