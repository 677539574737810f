"""Lab 06's unseen clusters: families of questions, one member of each drawn at check time.

Each family is built around one lever (``uses``: the layout pulls it) and spans ranges of GPU
count, sequence length, global batch and, on the slow-link families, the link between nodes, so
that no table of answers computed beforehand covers what the check asks (a few thousand members a
family, seconds of planning each). A member counts only when it hinges on its lever: the planner's
fastest fitting layout pulls it and every fitting layout that does not is at least :data:`MARGIN`
behind (or none fits). :func:`draw` checks this for each member it draws (the reference is priced,
tested and dropped before the learner's call) and draws again, up to :data:`TRIES` times, then
takes one of the family's ``fallback`` members (tests/test_lab06_adversarial.py asserts those
hinge). ``check()`` draws from a seed (fresh each time unless one is given).
"""

import random
from typing import Callable, NamedTuple

from gpumem.course import seeds

SLOW_LINK = 1.25e9        # 10 Gb/s Ethernet per GPU between nodes, bytes/s
MARGIN = 1.05             # each family's lever is worth at least the slack (3 %) plus 2 points
TRIES = 4                 # draws of a family before its fallback member
LINK_STEP = 0.05e9        # drawn links are rounded to 0.05 GB/s


class Family(NamedTuple):
    """Questions built around one lever, and how to tell a layout that pulls it."""
    name: str                                   # the row's label
    lever: str                                  # what the learner reads when the search lacks it
    uses: Callable                              # layout -> True when it pulls the lever
    space: dict                                 # model, gpus, gpu, seq: choices; batch: (lo, hi, step),
    #                                             or {"tokens_per_gpu": choices}; link: (lo, hi) bytes/s
    #                                             per GPU, or None (the node's NICs)
    fallback: tuple                             # ((model, gpus, gpu, seq, global_batch), link) that hinge


def _space(model, gpus, gpu, seq, batch, link=None) -> dict:
    return {"model": model, "gpus": gpus, "gpu": gpu, "seq": seq, "batch": batch, "link": link}


SLOW = (0.6e9, 2.5e9)     # 5-20 Gb/s per GPU between nodes: an assumption (commodity Ethernet); the
#                           slow-link families' levers are tested at each draw, so only their sizes ride on it
FAST = (25e9, 50e9)       # 200-400 Gb/s per GPU: InfiniBand HDR to NDR, one NIC a GPU (NVIDIA DGX H100
#                           datasheet: 8 x ConnectX-7 at 400 Gb/s, one per GPU)

# review r24: the winners of the first ranges (70B on 8-16 A100 40GB only) fit in a table of ~70 layouts; r25:
# a table of the winners on power-of-two clusters still passed 8 of 12 seeds, so the offload family draws
# whole nodes of 3, 5, 6, 7 and 10 (24-80 GPUs), where the fastest layouts take pipeline and data-parallel
# degrees (pp 12 or 40, dp 3 ...) that no power-of-two winner has, the batch drawn in steps of 4 or 8
SEQS = (1024, 2048, 3072, 4096, 6144, 8192)
OFFLOAD_SPACES = (_space(("llama-3-70b",), (24,), ("a100-40gb",), SEQS, (12, 480, 4), FAST),
                  _space(("llama-3.1-405b",), (40, 48, 56, 80), ("a100-80gb", "h100-80gb"), SEQS, (64, 512, 8), FAST))

FAMILIES = (
    Family("offload", "offload (the states do not fit on the GPUs)", lambda lay: lay.offload != "none",
           OFFLOAD_SPACES, ((("llama-3-70b", 16, "a100-40gb", 4096, 128), None),)),
    Family("NVMe offload", "NVMe offload (host memory, with the swap buffers, is too small)",
           lambda lay: lay.offload != "none" and lay.device == "nvme",
           _space(("llama-3.1-405b",), (16,), ("h100-80gb", "h200", "a100-80gb"), (2048, 3072, 4096, 6144, 8192),
                  (16, 256, 8), FAST),
           ((("llama-3.1-405b", 16, "h100-80gb", 4096, 64), None),)),
    Family("tensor and pipeline", "tensor and pipeline parallelism together", lambda lay: lay.tp > 1 and lay.pp > 1,
           # r25: 9, 12 and 14 nodes, so the stages (126 layers) split in 3, 7, 9 or 14 as well (18 of 18 drawn
           # members defeat the table of power-of-two winners)
           (_space(("llama-3.1-405b",), (72, 96, 112), ("h200",), (2048, 3072, 4096), (128, 1024, 32), FAST),
            _space(("llama-3.1-405b",), (96, 112), ("h100-80gb",), (2048, 3072, 4096), (128, 1024, 32), FAST)),
           ((("llama-3.1-405b", 64, "h200", 4096, 256), None),)),
    # review r9: on the family above mcore is worth 0-3.1 %, so a search without it passed or failed
    # by the draw; at 16 stages of tp 8 its tensor-parallel overlap is worth 8-17 % (30 of 30 drawn)
    Family("Megatron-Core's engine", "Megatron-Core's engine (mcore=True: its tensor-parallel overlap)",
           lambda lay: lay.mcore,
           _space(("llama-3.1-405b",), (128,), ("h100-80gb",), (2048, 3072, 4096), (128, 1024, 32), FAST),
           ((("llama-3.1-405b", 128, "h100-80gb", 2048, 672), None),)),
    # review r22: at 128K-192K tokens cp 2 was within the slack, so a search stopping at cp 2 passed; at
    # 256K-512K on 32-64 GPUs cp 4 or 8 is worth 6-158 % (40 of 42 members of these ranges hinge)
    Family("context parallelism", "context parallelism of 4 or more (cp > 2: ring attention over more ranks)",
           lambda lay: lay.cp > 2,
           _space(("llama-3-8b",), (32, 64), ("h100-80gb", "h200", "a100-80gb"), (262144, 393216, 524288), (2, 32, 2),
                  FAST),
           ((("llama-3-8b", 32, "h100-80gb", 262144, 8), None),)),
    Family("interleaved schedule", "the interleaved schedule (vp > 1 virtual stages)", lambda lay: lay.vp > 1,
           _space(("llama-3-70b",), (32, 64), ("h100-80gb",), (2048, 4096), (128, 512, 32), SLOW),
           ((("llama-3-70b", 32, "h100-80gb", 4096, 256), SLOW_LINK),)),
    Family("ZeRO-1/2", "ZeRO-1 or ZeRO-2 (optimizer states sharded, weights whole)", lambda lay: lay.zero in (1, 2),
           _space(("llama-3-8b",), (64,), ("h100-80gb",), (2048,), (512, 896, 32), (0.8e9, 2e9)),
           ((("llama-3-8b", 64, "h100-80gb", 2048, 512), SLOW_LINK),)),
    Family("hybrid sharding", "hybrid sharding (hybrid='hsdp' or 'hpz' with a shard group)",
           lambda lay: lay.hybrid != "none",
           _space(("llama-3-8b",), (48, 64, 80, 96, 112, 128), ("h100-80gb",), (2048, 4096, 8192),
                  {"tokens_per_gpu": (32768,)}, (1.1e9, 1.4e9)),
           ((("llama-3-8b", 64, "h100-80gb", 2048, 1024), SLOW_LINK),)),
)


def rng_of(seed: int | None) -> random.Random:
    """A generator from ``seed``, or a fresh one (:func:`gpumem.course.seeds.rng`) when None."""
    return seeds.rng(seed)


def spaces(family) -> tuple:
    """The family's sub-spaces (a space, or a tuple of them: clusters whose ranges differ)."""
    return (family.space,) if isinstance(family.space, dict) else family.space


def member(family: Family, rng: random.Random) -> tuple:
    """One ``(case, link)`` from the family's ranges (one sub-space first, each as likely)."""
    s = rng.choice(spaces(family))
    model, gpus, gpu, seq = (rng.choice(s[k]) for k in ("model", "gpus", "gpu", "seq"))
    if isinstance(s["batch"], dict):          # one step's tokens per GPU: the batch follows the GPUs
        batch = gpus * rng.choice(s["batch"]["tokens_per_gpu"]) // seq
    else:
        lo, hi, step = s["batch"]
        batch = rng.randrange(lo, hi + 1, step)
    case = (model, gpus, gpu, seq, batch)
    link = None if s["link"] is None else round(rng.uniform(*s["link"]) / LINK_STEP) * LINK_STEP
    return case, link


def hinges(family: Family, result) -> bool:
    """Whether the planner's answer turns on the family's lever by at least :data:`MARGIN`."""
    if not result.plans:
        return False
    best = min(result.plans, key=lambda p: p.time["total"])
    without = [p.time["total"] for p in result.plans if not family.uses(p.layout)]
    return family.uses(best.layout) and (not without or min(without) >= MARGIN * best.time["total"])


def draw(family: Family, rng: random.Random, ref) -> tuple:
    """A ``(case, link)`` of the family that hinges on its lever (``ref(case, link)``: the planner's
    answer, dropped here; the grader prices it again after the learner's call)."""
    for _ in range(TRIES):
        case, link = member(family, rng)
        if hinges(family, ref(case, link)):      # the answer holds no cycles: freed on return,
            return case, link                     # so gc.get_objects() cannot find it later
    return rng.choice(family.fallback)


def size(family: Family) -> int:
    """How many members the family's ranges hold (before the hinge test; links in 0.05 GB/s steps)."""
    return sum(_size(s) for s in spaces(family))


def _size(s: dict) -> int:
    if isinstance(s["batch"], dict):
        batches = len(s["batch"]["tokens_per_gpu"])
    else:
        lo, hi, step = s["batch"]
        batches = len(range(lo, hi + 1, step))
    links = 1 if s["link"] is None else round((s["link"][1] - s["link"][0]) / LINK_STEP) + 1
    return len(s["model"]) * len(s["gpus"]) * len(s["gpu"]) * len(s["seq"]) * batches * links
