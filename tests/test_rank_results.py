"""A rank's result read as plain data (gpumem.runs.rank_results): review r17 of lab 02 ran code in the
grading process through the unpickling of a rank's result."""

import pytest
import torch

from gpumem.runs import rank_results

RAN: list = []


def ran(what: str) -> None:
    RAN.append(what)


class Reduced:
    """Unpickled, it calls a function of its choosing (as r17's tensor subclass called cProfile.run)."""
    def __reduce__(self):
        return (ran, ("unpickled",))


def test_tensors_and_plain_values_come_back():
    result = [{"shards": [torch.arange(4.0)], "held": [1, 2.5], "note": "ok", "pair": (1, None)}]
    got = rank_results.load(rank_results.dump(result, "plain"), "plain")
    assert torch.equal(got[0]["shards"][0], torch.arange(4.0)) and got[0]["held"] == [1, 2.5]
    assert got[0]["pair"] == (1, None)


def test_an_object_that_runs_code_when_read_is_refused():
    data = rank_results.dump([Reduced()], "plain")
    with pytest.raises(rank_results.NotPlain, match="other than tensors and plain values"):
        rank_results.load(data, "plain")
    assert RAN == []
    rank_results.load(rank_results.dump([Reduced()], "any"), "any")          # the default trusts its ranks
    assert RAN == ["unpickled"]
