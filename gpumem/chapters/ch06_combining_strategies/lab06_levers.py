"""Lab 06: the levers a team's training stack may lack (``Limits.without``).

A team's stack seldom runs every lever the planner prices: a plain DeepSpeed install has no
context parallelism or interleaved schedule, an FSDP one no pipeline, a cluster without local
drives no NVMe offload. The lab's ``choose_plan`` takes ``without``, a tuple of names from
:data:`LACKS`, and must return a layout that uses none of them.

Review r29 packed ~115 harvested winning layouts in ~420 bytes: under the 500-byte literal rule
(:mod:`.lab06_table`). The family "the stack lacks a lever" (:mod:`.lab06_limit_cases`) draws
``without`` as 1-3 of the levers the planner's own fastest layout uses, on clusters of every other
family's ranges, so its winners are second choices that change with the lack and the cluster.
Measured on its members (2026-12-07, seeds 0-129): 10, 20, 34, 58, 67, 76 distinct winners at 10,
20, 40, 80, 100, 130 seeds; a search over only the winners of seeds 0-9 (20 layouts, with the
planner's own) passed 8 of 30 fresh members, over those of seeds 0-99 (107 layouts) 23 of 30. The
lack makes a table hold more winners; a large one still passes most members (the winners under a
lack are often within the slack of a layout another member won with).
"""

import random

from gpumem.planner import Layout

# name: (what the learner reads, layout -> True when it uses the lever)
LACKS = {
    "tp": ("tensor parallelism: tp must be 1", lambda lay: lay.tp > 1),
    "pp": ("pipeline parallelism: pp must be 1", lambda lay: lay.pp > 1),
    "cp": ("context parallelism: cp must be 1", lambda lay: lay.cp > 1),
    "vp": ("the interleaved schedule: vp must be 1", lambda lay: lay.vp > 1),
    "zero3": ("ZeRO-3 (weights sharded): zero must not be 3", lambda lay: lay.zero == 3),
    "offload": ("offload of any kind: offload must be 'none'", lambda lay: lay.offload != "none"),
    "nvme": ("NVMe offload: device must not be 'nvme'", lambda lay: lay.offload != "none" and lay.device == "nvme"),
    "hybrid": ("hybrid sharding: hybrid must be 'none'", lambda lay: lay.hybrid != "none"),
    "mcore": ("Megatron-Core's overlaps: mcore must be False", lambda lay: lay.mcore),
    "selective": ("selective recomputation: checkpoint must not be 'selective'",
                  lambda lay: lay.checkpoint == "selective"),
}
MOST = 3                 # levers lacked at once


def used(lay: Layout) -> tuple[str, ...]:
    """The names in :data:`LACKS` of the levers ``lay`` uses."""
    return tuple(name for name, (_, uses) in LACKS.items() if uses(lay))


def lacking(without: tuple, lay: Layout) -> tuple[str, ...]:
    """The levers of ``without`` that ``lay`` uses (empty when it keeps the limit)."""
    return tuple(name for name in without if LACKS[name][1](lay))


def draw(rng: random.Random, lay: Layout) -> tuple[str, ...] | None:
    """1 to :data:`MOST` of the levers ``lay`` uses, sorted; None when it uses none."""
    names = used(lay)
    if not names:
        return None
    return tuple(sorted(rng.sample(names, rng.randint(1, min(MOST, len(names))))))
