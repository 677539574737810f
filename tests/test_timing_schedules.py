"""Pipeline schedules (gpumem.timing.schedules): closed forms against the papers' formulas,
hand-drawn timelines, Megatron-LM's documented order, and an independent discrete-event
simulation (gpumem.timing.schedule_sim) of each schedule's order of operations."""
import itertools

import pytest

from gpumem.errors import UsageError
from gpumem.timing import schedule_sim as sim
from gpumem.timing.schedules import (SCHEDULES, interleaved_in_flight, p2p_message_bytes,
                                     p2p_sends_per_rank, schedule)

# ---- the papers' formulas -------------------------------------------------------------------


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 32), (16, 64), (4, 3)])
def test_1f1b_and_gpipe_bubble_fraction_is_p_minus_1_over_m(p, m):
    # Narayanan et al. 2021 (arXiv:2104.04473) s. 2.2.1: t_pb / t_id = (p - 1) / m, the same for
    # GPipe and PipeDream-Flush; the step is (m + p - 1)(t_f + t_b).
    for name in ("gpipe", "1f1b"):
        r = schedule(name, p, m, F=1.5, B=3.0)
        assert r.bubble_fraction == pytest.approx((p - 1) / m)
        assert r.step_time == pytest.approx((m + p - 1) * 4.5)
        # the zero-bubble repository's README table: 1F1B bubble rate (p-1)/(m+p-1)
        assert r.idle_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (8, 16, 4), (2, 6, 3), (16, 64, 5)])
def test_interleaved_bubble_is_one_vth(p, m, v):
    # Narayanan et al. 2021 s. 2.2.2: t_pb^int = (p-1)(t_f+t_b)/v, fraction (1/v)(p-1)/m.
    r = schedule("interleaved", p, m, v, F=1.0, B=2.0)
    assert r.bubble_time == pytest.approx((p - 1) * 3.0 / v)
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize("p,v", [(4, 2), (8, 4), (16, 2), (2, 3)])
def test_interleaved_first_stage_memory_is_korthikanti_factor(p, v):
    # Korthikanti et al. 2022 (arXiv:2205.05198) s. 4.2.3: interleaving multiplies the first
    # stage's p micro-batches of activations by 1 + (p - 1) / (p v).
    assert interleaved_in_flight(p, 4 * p, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert schedule("interleaved", p, 4 * p, v).in_flight_first == pytest.approx(p + (p - 1) / v)


def test_interleaved_sends_v_times_1f1b():
    # s. 2.2.2: "the amount of communication also increases by v"; middle ranks send 2 m v.
    for p, m, v in [(4, 8, 2), (8, 16, 4)]:
        assert schedule("interleaved", p, m, v).p2p_sends == v * schedule("1f1b", p, m).p2p_sends
        assert schedule("interleaved", p, m, v).p2p_sends == 2 * m * v
    assert p2p_sends_per_rank(2, 4) == 4        # two stages: each rank sends one way only
    assert p2p_sends_per_rank(1, 4) == 0


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 24), (4, 100)])
def test_zero_bubble_table_equal_passes(p, m):
    # Qi et al. 2023 (arXiv:2401.10241), equal F, B (input grad) and W: s. 2.1 says ZB-H1's
    # bubble is a third of 1F1B's, s. 2.2 that ZB-H2 has none; peak memory p M_B and (2p-1) M_B.
    one = schedule("1f1b", p, m, F=1.0, B=2.0)             # 1F1B: (p-1)(T_F + T_B + T_W)
    h1 = schedule("zb-h1", p, m, F=1.0, B=2.0, W=1.0)
    h2 = schedule("zb-h2", p, m, F=1.0, B=2.0, W=1.0)
    assert one.bubble_time == pytest.approx(3 * (p - 1))
    assert h1.bubble_time == pytest.approx(one.bubble_time / 3)
    assert h2.bubble_time == 0
    assert (h1.in_flight_first, h2.in_flight_first) == (p, 2 * p - 1)
    assert h1.p2p_sends == h2.p2p_sends == one.p2p_sends   # README table: 1x 1F1B's volume


def test_zero_bubble_general_formula():
    # table 2 in the paper's notation T_F, T_B (input grad), T_W: ZB-H1 (p-1)(T_F + T_B - T_W),
    # ZB-H2 (p-1)(T_F + T_B - 2 T_W); here B = T_B + T_W.
    tf, tb, tw, p = 1.2, 1.1, 0.7, 8
    assert schedule("zb-h1", p, 32, F=tf, B=tb + tw, W=tw).bubble_time == \
        pytest.approx((p - 1) * (tf + tb - tw))
    assert schedule("zb-h2", p, 32, F=tf, B=tb + tw, W=tw).bubble_time == \
        pytest.approx((p - 1) * (tf + tb - 2 * tw))


# ---- hand-drawn timelines (F = 1, whole backward = 2) ------------------------------------------

def test_1f1b_p2_m4_by_hand():
    # 1F1B, p = 2, m = 4, F = 1, B = 2. Stage 0 runs p - 1 = 1 warm-up forward, then F1 and waits
    # for B0 to come back; stage 1 alternates from the start. Counted slot by slot:
    #   t:        0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
    #   stage 0: F0 F1 .. .. B0 B0 F2 B1 B1 F3 B2 B2 .. B3 B3
    #   stage 1: .. F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 .. ..
    # 15 slots = (m + p - 1)(F + B); stage 0 idles 3 = (p - 1)(F + B); holds at most F0, F1 = 2.
    drawn = ("stage 0: F0 F1 .. .. B0 B0 F2 B1 B1 F3 B2 B2 .. B3 B3\n"
             "stage 1: .. F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 .. ..")
    events = sim.simulate("1f1b", 2, 4, F=1, B=2)
    assert sim.draw(events) == drawn
    r = schedule("1f1b", 2, 4, F=1, B=2)
    assert (r.step_time, r.bubble_time, r.in_flight_first) == (15, 3, 2)
    assert sim.peak_in_flight(events) == 2
    assert schedule("gpipe", 2, 4, F=1, B=2).in_flight_first == 4   # GPipe: all four forwards


def test_zb_h1_p2_m4_by_hand():
    # ZB-H1, p = 2, m = 4, F = B_input = W = 1 (whole backward 2). B0 on stage 0 needs only B0 of
    # stage 1 (not its W), so stage 0 waits one slot instead of two; stage 1 keeps one W pending
    # and finishes with it, filling the tail:
    #   t:        0  1  2  3  4  5  6  7  8  9 10 11 12
    #   stage 0: F0 F1 .. B0 W0 F2 B1 W1 F3 B2 W2 B3 W3
    #   stage 1: .. F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3
    # 13 slots = m (F + B) + (p - 1)(F + B_input - W) = 12 + 1.
    drawn = ("stage 0: F0 F1 .. B0 W0 F2 B1 W1 F3 B2 W2 B3 W3\n"
             "stage 1: .. F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3")
    assert sim.draw(sim.simulate("zb-h1", 2, 4, F=1, B=2, W=1)) == drawn
    assert schedule("zb-h1", 2, 4, F=1, B=2, W=1).step_time == 13


def test_interleaved_order_is_megatrons_documented_one():
    # megatron/core/model_parallel_config.py, microbatch_group_size_per_vp_stage docstring:
    # PP=2, VP=2, group 2 (= p, the default), 4 micro-batches: rank 0 runs forwards 0 1 0 1 2 3 2 3.
    for rank in (0, 1):
        fwd = [mb for op, mb, _ in sim.orders("interleaved", 2, 4, 2)[rank] if op == "F"]
        assert fwd == [0, 1, 0, 1, 2, 3, 2, 3]


# ---- closed forms against the simulation -------------------------------------------------------

CASES = [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 4, 8, 12) if m >= 1]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_closed_form_matches_simulation_plain(name):
    for (p, m), (F, B) in itertools.product(CASES, [(1.0, 2.0), (0.7, 1.9)]):
        r = schedule(name, p, m, F=F, B=B)
        events = sim.simulate(name, p, m, F=F, B=B)
        assert sim.step_time(events) == pytest.approx(r.step_time), (p, m)
        assert sim.peak_in_flight(events) == r.in_flight_first, (p, m)
        assert max(sim.sends(events, p)) == r.p2p_sends


def test_closed_form_matches_simulation_interleaved():
    for p, k, v in itertools.product((2, 3, 4, 8), (1, 2, 3), (2, 3, 4)):
        m = k * p
        r = schedule("interleaved", p, m, v, F=1.0, B=2.0)
        events = sim.simulate("interleaved", p, m, v, F=1.0, B=2.0)
        assert sim.step_time(events) == pytest.approx(r.step_time), (p, m, v)
        assert sim.peak_in_flight(events, 0, v) == pytest.approx(r.in_flight_first), (p, m, v)
        assert max(sim.sends(events, p, v)) == r.p2p_sends


def test_closed_form_matches_simulation_zero_bubble():
    # F, input-grad and W times with W <= F and W <= B - W, where the module accepts them;
    # the last set is an unequal one of realistic proportion (W about half of F; an assumption,
    # not a published measurement).
    times = [(1, 1, 1), (1, 1.5, 0.5), (1.2, 1.2, 0.8), (1, 2, 1), (2, 1, 0.25),
             (18522, 18086, 9337)]
    for (F, bi, W), (p, m) in itertools.product(times, [(2, 6), (3, 9), (4, 8), (8, 24)]):
        for name in ("zb-h1", "zb-h2"):
            r = schedule(name, p, m, F=F, B=bi + W, W=W)
            events = sim.simulate(name, p, m, F=F, B=bi + W, W=W)
            span = sim.period(events) if name == "zb-h2" else sim.step_time(events)
            assert span == pytest.approx(r.step_time), (name, F, bi, W, p, m)
            assert sim.step_time(events) == pytest.approx(r.step_time_synced), (name, p, m)
            assert sim.peak_in_flight(events) == r.in_flight_first, (name, p, m)


# ---- message size and bad inputs ---------------------------------------------------------------

def test_p2p_message_bytes_by_hand():
    # Llama-2-70B-like: seq 4096, micro-batch 1, hidden 8192, bf16: 4096 * 8192 * 2 = 64 MiB.
    assert p2p_message_bytes(4096, 1, 8192) == 64 * 2**20
    assert p2p_message_bytes(4096, 1, 8192, tp=8, sequence_parallel=True) == 8 * 2**20
    assert p2p_message_bytes(4096, 1, 8192, tp=8) == 64 * 2**20      # no SP: whole sequence
    assert p2p_message_bytes(4096, 2, 8192, cp=2) == 64 * 2**20
    r = schedule("1f1b", 4, 8, message_bytes=p2p_message_bytes(4096, 1, 8192))
    assert r.p2p_bytes == 16 * 64 * 2**20


@pytest.mark.parametrize("args,kwargs,needle", [
    (("1f1b", 0, 8), {}, "p (pipeline stages) must be an integer >= 1, got 0"),
    (("1f1b", 4, 0), {}, "m (micro-batches) must be an integer >= 1, got 0"),
    (("1f1b", True, 4), {}, "got True"),
    (("1f1b", 4, 8, 2), {}, "v must be 1, got v=2"),
    (("gpipe", 4, 8, 3), {}, "v must be 1, got v=3"),
    (("interleaved", 4, 6, 2), {}, "m a multiple of p"),
    (("interleaved", 4, 8, 1), {}, "v >= 2"),
    (("zb-h1", 4, 3), {"W": 1.0}, "m >= p = 4"),
    (("zb-h2", 4, 6), {"W": 1.0}, "m >= 2p-1 = 7"),
    (("zb-h1", 4, 8), {"F": 0.5, "B": 2.0, "W": 1.0}, "W <= F"),
    (("1f1b", 4, 8), {"W": 1.0}, "W must be 0"),
    (("1f1b", 4, 8), {"F": -1.0}, "F must be a finite time >= 0, got -1.0"),
    (("1f1b", 4, 8), {"B": float("nan")}, "B must be a finite time"),
    (("1f1b", 4, 8), {"B": 1.0, "W": 2.0}, "W must be <= B"),
    (("1f1b", 4, 8), {"message_bytes": -1}, "message_bytes must be an integer >= 0"),
    (("pipedream", 4, 8), {}, "unknown pipeline schedule 'pipedream'"),
])
def test_bad_inputs_are_one_line(args, kwargs, needle):
    with pytest.raises(UsageError) as err:
        schedule(*args, **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_every_schedule_has_a_source():
    for name in SCHEDULES:
        assert "arXiv" in schedule(name, 4, 8, 2 if name == "interleaved" else 1,
                                   W=1.0 if name.startswith("zb") else 0.0).source
