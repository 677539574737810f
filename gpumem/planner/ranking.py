"""How the planner orders the plans that fit: by step time, with ties broken the way practice does.

The cost model cannot tell two plans apart when their step times differ by less than
:data:`TIE` (0.5 %): its terms are stated figures (MFU, achieved bandwidths, overlap windows)
each uncertain by more than that. So the ranking is

1. sort by step time; the fastest remaining plan opens a tie group of every remaining plan within
   ``TIE`` of it (relative to that plan, not to fixed buckets, so 88.339 s and 88.592 s are one
   group however the buckets fall); a plan never ranks above a faster plan of an earlier group;
2. inside a group: roomy plans before :func:`tight` ones (a plan with less than
   :func:`tight_limit` of headroom runs out on the first fragmentation spike, a longer sequence
   or a library upgrade), then the mixed recipe before pure bf16 (fp32 master weights), then
   fewer bytes offloaded to host and drive (fewer moving parts), then fewer pipeline stages x
   context-parallel ways (the costs the model leaves out -- SM time taken by overlapped
   communication, short ring-attention chunks, more p2p hops, harder debugging -- grow with them,
   so practice keeps data parallelism wide), then fewer bytes per GPU, then time
   (and the layout's label, so that the order is total);
3. repeat with the plans after the group.
"""

from bisect import bisect_right

TIE = 0.005
TIGHT_BYTES = 5 * 10**9        # 5 GB: allocator fragmentation and NCCL buffers grow by this much (stated)
TIGHT_SHARE = 0.06             # or 6 % of the usable bytes, whichever is larger (stated)


def tight_limit(usable: int) -> int:
    """Headroom below which a plan is ``tight``: max(5 GB, 6 % of ``usable``)."""
    return max(TIGHT_BYTES, int(TIGHT_SHARE * usable))


def tight(headroom: int, usable: int) -> bool:
    """Whether ``headroom`` bytes left of ``usable`` make a plan tight."""
    return headroom < tight_limit(usable)


def secondary_key(p) -> tuple:
    """Order inside a tie group (see the module)."""
    m = p.memory
    lay = p.layout
    return (bool(m.get("tight")), lay.recipe != "mixed", m["host"] + m["nvme"], lay.pp * lay.cp, m["total"],
            p.time["total"], lay.label())   # the label last: a total order, so rank_of is exact


def rank(plans: list, key=secondary_key) -> list:
    """``plans`` in the planner's order (see the module); ``key`` orders a tie group (the fine-tuning
    search passes its own: its layouts have no recipe or pipeline)."""
    rest = sorted(plans, key=lambda p: p.time["total"])
    times = [p.time["total"] for p in rest]
    out, start = [], 0
    while start < len(rest):
        end = bisect_right(times, times[start] * (1 + TIE), lo=start)
        out += sorted(rest[start:end], key=key)
        start = end
    return out


def rank_of(plans: list, plan) -> int:
    """1-based rank ``plan`` would take among ``plans`` (a plan with the same layout is replaced)."""
    others = [p for p in plans if p.layout != plan.layout]
    return next(i for i, p in enumerate(rank(others + [plan]), 1) if p is plan)
