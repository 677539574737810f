"""The overlap table: every framework lists every term with a source, a term a framework does not
overlap is fully exposed, and hand examples of max(0, seconds - share x window). Torch-free."""

import pytest

from gpumem.errors import UsageError
from gpumem.timing import overlap as O

W = {"forward": 1.0, "backward": 2.0, "last_backward": 0.5, "attention": 0.3, "attention_step": 0.02}


@pytest.mark.parametrize("name", sorted(O.FRAMEWORKS))
def test_every_framework_lists_every_term_with_a_source(name):
    table = O.FRAMEWORKS[name]
    assert set(table) == set(O.TERMS)
    for term, o in table.items():
        assert o.window in O.WINDOWS and o.share in (0.0, 1.0), (name, term)
        assert (o.share == 0.0) == (o.window == "none"), (name, term)
        assert ".py" in o.source or o.source.startswith("not performed: "), (name, term)   # file, function


@pytest.mark.parametrize("name,term", [(n, t) for n in sorted(O.FRAMEWORKS) for t in O.TERMS])
def test_a_term_not_overlapped_is_fully_exposed(name, term):
    o = O.overlap(name, term)
    if o.share == 0:
        assert O.exposed(name, term, 1.7, {}) == 1.7          # no window needed, nothing hidden
    else:                                                     # hidden up to its window, no further
        window = O.window_seconds(o.window, W)
        assert O.exposed(name, term, window / 2, W) == 0.0
        assert O.exposed(name, term, window + 1.0, W) == pytest.approx(1.0)


def test_what_the_frameworks_say_by_hand():
    """The claims the table encodes, read from the frameworks' code (sources in the module)."""
    z1, z2, z3 = (O.FRAMEWORKS[f"deepspeed-zero{i}"] for i in (1, 2, 3))
    assert z1["dp_grad_reduce"].window == "last_backward"        # stage 1 reduces at the boundary
    assert z2["dp_grad_reduce"].window == "backward"             # stage 2 every micro-batch
    assert z3["zero3_gather"].window == "forward+backward"       # prefetch
    for z in (z1, z2):
        assert z["dp_param_gather"].share == 0                   # all_gather_dp_groups after the update
    for name, table in O.FRAMEWORKS.items():
        assert table["optimizer_step"].share == 0, name
        assert table["cpu_adam"].share == 0, name
        assert table["nvme_state_swaps"].share == 0, name
    assert z3["nvme_state_swaps"].source.count("swap_") >= 2
    assert O.FRAMEWORKS["megatron"]["tp_collectives"].share == 0
    assert O.FRAMEWORKS["megatron-overlap"]["tp_collectives"].window == "forward+backward"
    assert O.FRAMEWORKS["megatron"]["pp_p2p"].share == 0                 # 1F1B
    assert O.FRAMEWORKS["megatron-overlap"]["pp_p2p"].share == 1.0       # interleaved
    assert O.FRAMEWORKS["megatron-overlap"]["dp_param_gather"].window == "forward"
    assert O.FRAMEWORKS["megatron"]["cp_ring"].window == "attention"
    assert O.FRAMEWORKS["torchtitan"]["cp_ring"].window == "attention_step"
    assert O.FRAMEWORKS["torchtitan"]["tp_collectives"].share == 0
    assert O.FRAMEWORKS["torchtitan-async-tp"]["tp_collectives"].share == 1.0
    assert O.FRAMEWORKS["fsdp2"]["zero3_gather"] == O.FRAMEWORKS["torchtitan"]["zero3_gather"]


def test_exposed_hand_examples():
    # ZeRO-2's reduce-scatters, 2.5 s, behind 2.0 s of backward: 0.5 s left
    assert O.exposed("deepspeed-zero2", "dp_grad_reduce", 2.5, W) == pytest.approx(0.5)
    # ZeRO-1 reduces only during the last backward (0.5 s): 2.5 - 0.5
    assert O.exposed("deepspeed-zero1", "dp_grad_reduce", 2.5, W) == pytest.approx(2.0)
    # ZeRO-3's gathers, 2.5 s, behind forward + backward (1 + 2 s, summed when not given): hidden
    assert O.exposed("deepspeed-zero3", "zero3_gather", 2.5, W) == 0.0
    assert O.exposed("deepspeed-zero3", "zero3_gather", 3.5, W) == pytest.approx(0.5)
    # the parameter all-gather after a ZeRO-1 step: all of it
    assert O.exposed("deepspeed-zero1", "dp_param_gather", 0.8, W) == 0.8
    # Megatron's ring behind 0.3 s of attention
    assert O.exposed("megatron", "cp_ring", 0.25, W) == 0.0
    assert O.exposed("megatron", "cp_ring", 0.45, W) == pytest.approx(0.15)
    # torch's all-gather CP hides only behind one step
    assert O.exposed("torchtitan", "cp_ring", 0.05, W) == pytest.approx(0.03)
    # Megatron's TP collectives: exposed by default, hidden with --tp-comm-overlap
    assert O.exposed("megatron", "tp_collectives", 0.4, W) == 0.4
    assert O.exposed("megatron-overlap", "tp_collectives", 0.4, W) == 0.0


def test_a_share_below_one():
    """The shares are 1.0 by assumption; a measured share, e.g. 0.7, hides 0.7 of the window."""
    o = O.Overlap("backward", 0.7, "assumption")
    saved = O.FRAMEWORKS["deepspeed-zero2"]["dp_grad_reduce"]
    O.FRAMEWORKS["deepspeed-zero2"]["dp_grad_reduce"] = o
    try:
        assert O.exposed("deepspeed-zero2", "dp_grad_reduce", 2.0, W) == pytest.approx(2.0 - 0.7 * 2.0)
    finally:
        O.FRAMEWORKS["deepspeed-zero2"]["dp_grad_reduce"] = saved


@pytest.mark.parametrize("args", [
    ("deepspeed-zero4", "dp_grad_reduce", 1.0, W), ("fsdp2", "grad_reduce", 1.0, W),
    ("fsdp2", "dp_grad_reduce", -1.0, W), ("fsdp2", "dp_grad_reduce", float("nan"), W),
    ("fsdp2", "dp_grad_reduce", 1.0, {"forward": 1.0}), ("fsdp2", "dp_grad_reduce", 1.0, {"backward": -2.0}),
    ("fsdp2", "zero3_gather", 1.0, {"forward": 1.0}),
])
def test_bad_inputs_raise_usage_error(args):
    with pytest.raises(UsageError):
        O.exposed(*args)
