"""Lab 06's NVMe swap-buffer family: a host cap per node that NVMe offload's states fit but, with
their swap buffers, the planner's fastest layout does not (review r9: the buffers never decided a
case).

Every NVMe layout of a 405B cluster keeps the same ZeRO-3 states on the host, so what sets one
layout's host bytes against another's is its swap buffers (``offload_buffers``: offloading the
parameters to NVMe adds their own). Review r32 #3: with the cap drawn anywhere between the fastest
layout's host bytes without and with its buffers, and the answer required 5 % slower, no layout kept
it (28 of 28 draws): the answer was always None, free for a search that never priced NVMe. The cap
is now drawn between the smallest buffers of another NVMe layout and the fastest's own, so that
layout keeps it (the optimizer alone on NVMe, 1-4 % slower), and the search must price every
layout's buffers to find it.
"""

from gpumem import planner
from gpumem.memory import models
from gpumem.planner.memory import per_gpu
from gpumem.planner.question import GPUS_PER_NODE as NODE
from gpumem.planner.swap_buffers import offload_buffers

from . import lab06_cases

STEP = 0.001e12                  # caps to 0.001 TB: the buffers of two layouts differ by about 0.01 TB
# 405B on 2 nodes of 8 GPUs, where the planner's fastest offloads optimizer and parameters to NVMe
SPACE = lab06_cases._space(("llama-3.1-405b",), (16,), ("h100-80gb", "a100-80gb"), (4096, 6144), (32, 256, 8),
                           lab06_cases.FAST)


def swap_of(model: str, gpus: int, seq: int, lay) -> tuple[float, float]:
    """(host bytes of one node without, with NVMe offload's swap buffers) of ``lay``."""
    cfg = models.get(model)
    host = per_gpu(cfg, seq, lay)["host"]
    swap = sum(v for k, v in offload_buffers(cfg, lay).items() if k.endswith("swap"))
    return host * min(gpus, NODE), (host + swap) * min(gpus, NODE)


def caps(case: tuple, link, fastest: tuple) -> range:
    """The caps (in :data:`STEP`) that the ``fastest`` (seconds, layout) NVMe layout's states fit and
    its buffers break, and that another NVMe layout, with smaller buffers, keeps whole (empty: none)."""
    model, gpus, gpu, seq, batch = case
    lo, hi = swap_of(model, gpus, seq, fastest[1])
    every = planner.plan(model, gpus, gpu, seq=seq, global_batch=batch, inter_node=link, advise=False,
                         recipes=("mixed",)).plans
    floor = min((w for w in (swap_of(model, gpus, seq, p.layout)[1] for p in every) if lo < w < hi), default=None)
    return range(0) if floor is None else range(-int(-floor // STEP), -int(-hi // STEP))


def hinges(found, limits, case: tuple) -> bool:
    """The planner's fastest is NVMe offload, its states fit the cap and with its swap buffers do
    not (so a search that leaves them out picks it), and some layout keeps the cap. No margin here,
    unlike the other families: the fastest is refused by the cap itself, and what keeps it differs
    from it in what it offloads (the parameters' swap buffers: 0.01 TB a node on 405B, 2 nodes)."""
    if found.planner_best is None or found.planner_best[1].device != "nvme" or limits.host_per_node is None:
        return False
    without, with_swap = swap_of(case[0], case[1], case[3], found.planner_best[1])
    return without <= limits.host_per_node < with_swap and found.best is not None
