"""Lab 06, review r32 #3: the NVMe swap-buffer family's answer was None on all 28 draws seen, and the
lab did not say so. Every NVMe layout of its 405B clusters keeps the same states on the host (ZeRO-3
shards) and about 0.13 TB of swap buffers a node, so a cap between the two keeps none of them."""

import json
import random
from pathlib import Path

from gpumem.chapters.ch06_combining_strategies import lab06_limit_cases as L

FAMILY = next(f for f in L.FAMILIES if f.name == "NVMe swap buffers")


def test_the_swap_familys_members_keep_no_layout_and_the_lab_says_so():
    rng = random.Random(7)
    for _ in range(3):
        case, link, limits = L.draw(FAMILY, rng)
        found = L.truth(*case, link, limits)
        assert found.best is None and found.planner_best[1].device == "nvme", (case, limits)
        without, with_swap = L.swap_of(case[0], case[1], case[3], found.planner_best[1])
        assert without <= limits.host_per_node < with_swap
    root = Path(__file__).resolve().parents[1]
    for folder in ("solutions", "labs"):
        cells = json.loads((root / folder / "lab06_choose_plan.ipynb").read_text())["cells"]
        text = " ".join(" ".join("".join(c["source"]).split()) for c in cells)
        assert "no layout keeps that cap, so the right answer is None" in text, folder
