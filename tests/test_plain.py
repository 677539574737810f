"""gpumem.course.plain: a learner's answer rebuilt from the built-in types' own slots (review r9:
lying int/float/str subclasses and a dict that fills itself when first read passed labs 05 and 06)."""

import pytest

from gpumem.course.plain import NotPlain, plain
from gpumem.memory.finetune import Finetune
from gpumem.planner.layout import Layout


class Liar(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False
    __hash__ = int.__hash__


class Zero(float):
    def __sub__(self, other):
        return 0.0

    def __rsub__(self, other):
        return 0.0


class Anything(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__


def test_lying_numbers_and_strings_become_what_they_hold():
    got = plain({"a": Liar(3), "b": [Zero(2.5), (Anything("zero3"), True, None)]})
    assert got == {"a": 3, "b": [2.5, ("zero3", True, None)]}
    assert type(got["a"]) is int and type(got["b"][0]) is float and type(got["b"][1][0]) is str
    assert got["a"] != 4 and got["b"][0] - 1.0 == 1.5 and got["b"][1][0] != "zero2"


def test_a_dict_that_fills_when_read_is_read_now():
    reads = []

    class Lazy(dict):
        def __contains__(self, key):
            reads.append(key)
            self["x"] = 1
            return True

        def keys(self):
            reads.append("keys")
            return ["x"]
    assert plain(Lazy()) == {} and reads == []        # dict.items: none of its methods ran


def test_course_dataclasses_are_rebuilt_as_the_course_class():
    class Mine(Finetune):
        def __eq__(self, other):
            return True
    ft = Mine(adapter="lora", lora_rank=8)
    got = plain((ft, "full"))
    assert type(got[0]) is Finetune and got[0] == Finetune(adapter="lora", lora_rank=8)
    assert got[0] != Finetune(adapter="lora", lora_rank=16)
    lay = Layout("mixed", 3, "full", "flash", "none", "cpu", 1, 1, 1, 8, 4, vp=2)
    assert plain(lay) == lay and type(plain(lay)) is Layout and plain(lay) is not lay


def test_other_objects_are_refused_with_what_is_accepted():
    class Always:
        def __eq__(self, other):
            return True
    with pytest.raises(NotPlain, match="return plain values"):
        plain([Always()])
    with pytest.raises(NotPlain, match="nested"):
        deep = []
        for _ in range(20):
            deep = [deep]
        plain(deep)


def test_numpy_scalars_are_their_python_values_and_a_numpy_subclass_is_not_trusted():
    import numpy as np

    class Fake(np.int64):
        def item(self):
            return 7
    got = plain({"n": np.int64(5), "x": np.float32(0.5), "b": np.bool_(True)})
    assert got == {"n": 5, "x": 0.5, "b": True} and type(got["n"]) is int and type(got["b"]) is bool
    with pytest.raises(NotPlain, match="Fake"):
        plain(Fake(5))
