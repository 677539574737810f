"""The graders' fresh seeds (gpumem.course.seeds): review r13's lab 03 cheat replaced os.urandom with
zeros, so every check drew seed 0 and answers worked out before the check passed 21/21. A replaced
os.urandom or random.Random is now refused before any lab is graded."""

import os
import random

import pytest

from gpumem import chapters
from gpumem.course import seeds
from gpumem.course.grader_seal import GraderChanged


def test_fresh_seeds_differ_and_a_given_seed_is_pythons():
    assert seeds.problem() == ""
    assert len({seeds.rng().getrandbits(64) for _ in range(8)}) == 8
    assert seeds.rng(5).random() == random.Random(5).random()


class _Pinned:
    """Review r15's descriptor: every ``seed(...)`` call seeds 0."""
    def __get__(self, obj, cls=None):
        return lambda a=None, version=2: random.Random.__bases__[0].seed(obj, 0)


@pytest.mark.parametrize("patch, says", [
    (lambda mp: mp.setattr(os, "urandom", lambda n: bytes(n)), "os.urandom was replaced"),
    (lambda mp: mp.setattr(os, "urandom", bytes), "os.urandom was replaced"),
    (lambda mp: mp.setattr(random.Random, "seed", lambda self, a=None, version=2: super(random.Random, self).seed(0)),
     "random.Random.seed was replaced"),
    (lambda mp: mp.setattr(random, "Random", type("Random", (random.Random,), {"random": lambda self: 0.0})),
     "random.Random was replaced"),
    # review r15 of lab 03: a descriptor in place of Random.seed has no code of its own
    (lambda mp: mp.setattr(random.Random, "seed", _Pinned()), "random.Random.seed was replaced"),
    (lambda mp: mp.setattr(random.Random, "getrandbits", lambda self, k: 0, raising=False),
     "random.Random.getrandbits was added or removed"),
], ids=["urandom-zeros", "urandom-bytes", "Random.seed", "Random-class", "seed-descriptor", "member-added"])
def test_a_pinned_seed_is_refused_before_grading(monkeypatch, patch, says):
    patch(monkeypatch)
    assert says in seeds.problem()
    with pytest.raises(seeds.Tampered, match=says):
        seeds.rng()
    with pytest.raises(GraderChanged, match=says):
        chapters.check_lab("lab03_checkpoint_budget", {}, show=False)
