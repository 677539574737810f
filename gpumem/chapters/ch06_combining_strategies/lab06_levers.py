"""Lab 06: the levers a team's training stack may lack (``Limits.without``).

A team's stack seldom runs every lever the planner prices: a plain DeepSpeed install has no
context parallelism or interleaved schedule, an FSDP one no pipeline, a cluster without local
drives no NVMe offload. The lab's ``choose_plan`` takes ``without``, a tuple of names from
:data:`LACKS`, and must return a layout that uses none of them.

Review r26 packed ~115 harvested winning layouts in ~420 bytes: under the 500-byte literal rule
(:mod:`.lab06_table`). The family "the stack lacks a lever" (:mod:`.lab06_limit_cases`) draws
``without`` as 1-3 of the levers the planner's own fastest layout uses, on clusters of every other
family's ranges, so its winners are second choices that change with the combination: a table
would need many times more winners than fit the rule (tests/test_lab06_adversarial.py measures it).
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
