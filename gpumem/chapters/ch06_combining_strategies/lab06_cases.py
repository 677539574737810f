"""Lab 06's unseen clusters: families of questions, one member of each drawn at check time.

Each family is built around one lever (``uses``: the layout pulls it). For every member, the
fastest fitting layout that does not pull it is at least :data:`MARGIN` behind the fastest layout
(or none fits without it) -- tests/test_lab06_adversarial.py asserts this for every member, so a
search that skips the lever fails whichever member is drawn. ``check()`` draws from a seed (fresh
each time unless one is given), so the cases are not known before the check runs.
"""

import os
import random
from typing import Callable, NamedTuple

SLOW_LINK = 1.25e9        # 10 Gb/s Ethernet per GPU between nodes, bytes/s
MARGIN = 1.05             # each family's lever is worth at least the slack (3 %) plus 2 points


class Family(NamedTuple):
    """Questions built around one lever, and how to tell a layout that pulls it."""
    lever: str                                  # what the learner reads when the search lacks it
    uses: Callable                              # layout -> True when it pulls the lever
    members: tuple                              # (model, gpus, gpu, seq, global_batch) questions
    inter_node: float | None = None             # None: the node type's own NICs


FAMILIES = (
    Family("offload (the states do not fit on the GPUs)", lambda lay: lay.offload != "none",
           (("llama-3-70b", 16, "a100-40gb", 4096, 128), ("llama-3-70b", 16, "a100-40gb", 4096, 64))),
    Family("NVMe offload (host memory, with the swap buffers, is too small)",
           lambda lay: lay.offload != "none" and lay.device == "nvme",
           (("llama-3.1-405b", 16, "h100-80gb", 4096, 64), ("llama-3.1-405b", 16, "h100-80gb", 4096, 32))),
    Family("tensor and pipeline parallelism together", lambda lay: lay.tp > 1 and lay.pp > 1,
           (("llama-3.1-405b", 64, "h200", 4096, 256), ("llama-3.1-405b", 64, "h200", 4096, 512))),
    Family("context parallelism (cp > 1: ring attention)", lambda lay: lay.cp > 1,
           (("llama-3-8b", 16, "h100-80gb", 131072, 8), ("llama-3-8b", 16, "h100-80gb", 131072, 16))),
    Family("the interleaved schedule (vp > 1 virtual stages)", lambda lay: lay.vp > 1,
           (("llama-3-70b", 32, "h100-80gb", 4096, 256), ("llama-3-70b", 32, "h100-80gb", 4096, 128),
            ("llama-3-8b", 16, "h100-80gb", 2048, 256)), SLOW_LINK),
    Family("ZeRO-1 or ZeRO-2 (optimizer states sharded, weights whole)",
           lambda lay: lay.zero in (1, 2), (("llama-3-8b", 64, "h100-80gb", 2048, 512),), SLOW_LINK),
    Family("hybrid sharding (hybrid='hsdp' or 'hpz' with a shard group)", lambda lay: lay.hybrid != "none",
           (("llama-3-8b", 64, "h100-80gb", 2048, 1024), ("llama-3-8b", 64, "h100-80gb", 4096, 512)), SLOW_LINK),
)
REFLECTION = len(FAMILIES) - 1                  # the slow-link hybrid-sharding family is the reflection


def rng_of(seed: int | None) -> random.Random:
    """A generator from ``seed``, or a fresh one (os.urandom) when None."""
    return random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))


def draw(rng: random.Random) -> list[tuple]:
    """One ``(family, case)`` per family, in the families' order."""
    return [(f, rng.choice(f.members)) for f in FAMILIES]


def every_member():
    """(family, case) for every member of every family (for the tests)."""
    return [(f, m) for f in FAMILIES for m in f.members]
