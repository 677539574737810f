"""Lab 06, review r32 #3 (and r34 #2): the NVMe swap-buffer family's answer was None on all 28 draws
seen: every NVMe layout of its 405B clusters keeps the same ZeRO-3 states on the host, and the cap
was drawn between the fastest layout's states and its states plus swap buffers with the answer
required 5 % slower, which no layout was. The cap is now drawn where another NVMe layout, with
smaller buffers (the optimizer alone on NVMe: no parameter swap buffers), keeps it."""

import random

from gpumem.chapters.ch06_combining_strategies import lab06_limit_cases as L
from gpumem.planner.swap_buffers import offload_buffers
from gpumem.memory import models

FAMILY = next(f for f in L.FAMILIES if f.name == "NVMe swap buffers")


def test_the_swap_familys_members_have_a_layout_to_choose():
    rng, answers = random.Random(7), set()
    for _ in range(4):
        case, link, limits = L.draw(FAMILY, rng)
        found = L.truth(*case, link, limits)
        fastest = found.planner_best[1]
        assert found.best is not None and fastest.device == "nvme" and found.best[1].device == "nvme", case
        without, with_swap = L.swap_of(case[0], case[1], case[3], fastest)
        assert without <= limits.host_per_node < with_swap                  # the buffers tip the fastest
        kept = L.swap_of(case[0], case[1], case[3], found.best[1])[1]
        assert kept <= limits.host_per_node                                  # the answer keeps the cap whole
        # what differs is the parameters' swap buffers: the fastest has them, the answer not
        cfg = models.get(case[0])
        swaps = lambda lay: {k for k, v in offload_buffers(cfg, lay).items() if k.endswith("swap") and v}   # noqa: E731
        assert swaps(found.best[1]) < swaps(fastest), (swaps(found.best[1]), swaps(fastest))
        answers.add(found.best[1].label())
    assert len(answers) > 1                                                  # not one layout every time
