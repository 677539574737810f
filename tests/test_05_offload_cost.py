"""Chapter 05's cost model: bytes per link counted by hand, seconds from round bandwidths."""

import pytest

from gpumem.errors import UsageError
from gpumem.memory import offload_cost as oc
from gpumem.memory.offload_cost import Links

ROUND = Links(h2d=10e9, d2h=20e9, nvme_read=2e9, nvme_write=1e9, cpu_adam=1e9, source="test")


def test_gradient_trip_follows_the_stage_as_deepspeed_runs_it():
    # 7e9 params on 8 ranks: each rank's shard is 875,000,000 params.
    # ZeRO-1/2 (stage_1_and_2.py): the slice is widened to fp32 on the GPU, then copied: 4 B down;
    # the updated bf16 shard comes up: 2 B.
    for zero in (1, 2):
        t = oc.offload_traffic(7_000_000_000, "mixed", zero, 8, "optimizer", "cpu")
        assert t == {"h2d": 2 * 875_000_000, "d2h": 4 * 875_000_000, "nvme_read": 0, "nvme_write": 0}
    # ZeRO-3 (stage3.py): the bf16 partition is copied into host memory and widened there: 2 B down
    t = oc.offload_traffic(7_000_000_000, "mixed", 3, 8, "optimizer", "cpu")
    assert t == {"h2d": 2 * 875_000_000, "d2h": 2 * 875_000_000, "nvme_read": 0, "nvme_write": 0}
    # the ZeRO-Offload paper's design sends 16-bit gradients at every stage
    t = oc.offload_traffic(7_000_000_000, "mixed", 2, 8, "optimizer", "cpu", grads="paper")
    assert t["d2h"] == 2 * 875_000_000
    # pure bf16 has no fp32 master: its optimizer reads bf16 gradients, 2 B down at ZeRO-2
    assert oc.offload_traffic(7_000_000_000, "pure-bf16", 2, 8, "optimizer", "cpu")["d2h"] == 2 * 875_000_000
    # the fp32 recipe has 4-byte parameters and gradients on the GPU
    t = oc.offload_traffic(7_000_000_000, "fp32", 1, 8, "optimizer", "cpu")
    assert t["h2d"] == t["d2h"] == 4 * 875_000_000
    with pytest.raises(UsageError):
        oc.offload_traffic(7_000_000_000, "mixed", 2, 8, "optimizer", "cpu", grads="fp8")


def test_uneven_shard_rounds_up():
    t = oc.offload_traffic(10, "mixed", 3, 4, "optimizer", "cpu")
    assert t["d2h"] == 2 * 3      # ceil(10 / 4) = 3 elements, bf16 at ZeRO-3
    assert oc.offload_traffic(10, "mixed", 2, 4, "optimizer", "cpu")["d2h"] == 4 * 3   # fp32 at ZeRO-2


def test_no_offload_moves_nothing():
    assert set(oc.offload_traffic(1000, "mixed", 3, 2, "none", "cpu").values()) == {0}


def test_zero_infinity_reads_params_twice_and_everything_once():
    # on the drive (DeepSpeed 0.19.8): fp32 master, m, v 12 B + the optimizer's fp32 gradient 4 B +
    # the bf16 parameter shard 2 B; the bf16 gradient partition waits in host memory. Params are
    # fetched in forward and backward.
    s = 500_000_000
    for recipe in ("mixed", "mixed-ds"):        # offloaded, both recipes describe the same run
        t = oc.offload_traffic(1_000_000_000, recipe, 3, 2, "optimizer+params", "nvme")
        assert t == {"h2d": 2 * 2 * s, "d2h": 2 * s, "nvme_read": (12 + 4 + 2) * s + 2 * s,
                     "nvme_write": (12 + 4 + 2) * s}
    # optimizer only on the drive: 12 B + the fp32 gradient; params stay on the GPU and go up once
    t = oc.offload_traffic(1_000_000_000, "mixed", 3, 2, "optimizer", "nvme")
    assert t == {"h2d": 2 * s, "d2h": 2 * s, "nvme_read": 16 * s, "nvme_write": 16 * s}


def test_zero_infinity_70b_nvme_seconds_at_datasheet_speeds():
    # 70B on 8 GPUs, shard s; the drive reads 20 s and writes 18 s. The cost model's drive is the
    # datacenter Micron 7450 PRO (6.8 GB/s read, 5.6 GB/s write, ServeTheHome's launch report); the
    # consumer Samsung 990 PRO's rated burst (7.45 / 6.9 GB/s, its datasheet) is the labelled second entry
    n = 70_553_706_496
    s = -(-n // 8)
    links = oc.datasheet_links("h100-80gb", "gen4")
    r = oc.step_time(n, "mixed", 3, 8, "optimizer+params", "nvme", 0.0, links)
    assert r["nvme"] == pytest.approx(20 * s / 6.8e9 + 18 * s / 5.6e9)
    assert 54.2 < r["nvme"] < 54.4
    burst = oc.step_time(n, "mixed", 3, 8, "optimizer+params", "nvme", 0.0, oc.datasheet_links("h100-80gb", "gen4-consumer"))
    assert burst["nvme"] == pytest.approx(20 * s / 7.45e9 + 18 * s / 6.9e9) and 46.6 < burst["nvme"] < 46.8


def test_default_drive_is_the_datacenter_one_and_consumer_drives_are_labelled():
    assert oc.datasheet_links() == oc.datasheet_links("h100-80gb", "gen4")
    dc = oc.NVME_DRIVES["gen4"]
    assert (dc.read, dc.write, dc.name) == (6.8e9, 5.6e9, "Micron 7450 PRO")
    assert dc.source.startswith("datacenter") and "ServeTheHome" in dc.source
    for key, drive in oc.DRIVES.items():
        assert drive.source.split()[0] in ("datacenter", "consumer") and drive.name in drive.source, key
    assert oc.DRIVES["gen4-consumer"].source.startswith("consumer") and "SLC" in oc.DRIVES["gen4-consumer"].source
    with pytest.raises(UsageError, match="gen4-consumer"):
        oc.datasheet_links("h100-80gb", "gen6")


def test_step_time_terms_from_round_bandwidths():
    r = oc.step_time(1_000_000_000, "mixed", 3, 2, "optimizer+params", "nvme", 1.0, ROUND, overlap=False)
    assert r["h2d"] == pytest.approx(2e9 / 10e9)
    assert r["d2h"] == pytest.approx(1e9 / 20e9)
    assert r["nvme"] == pytest.approx(10e9 / 2e9 + 9e9 / 1e9)   # (18 + 2) B x 5e8 read, 18 B x 5e8 written
    assert r["cpu_adam"] == pytest.approx(5e8 / 1e9)
    assert r["total"] == pytest.approx(1.0 + 0.2 + 0.05 + 14.0 + 0.5)
    assert r["bound"] == "nvme"
    r = oc.step_time(1_000_000_000, "mixed", 3, 2, "optimizer+params", "nvme", 1.0, ROUND, overlap=True)
    assert r["total"] == pytest.approx(14.0)


def test_stock_schedule_hides_only_the_gradient_copies():
    # ZeRO-2, 1e9 params on 2 ranks: s = 5e8; fp32 grads down 2e9 B / 20e9 = 0.1 s (inside backward's
    # 1.0 s), Adam 5e8 / 1e9 = 0.5 s after backward, bf16 params up 1e9 B / 10e9 = 0.1 s after Adam
    r = oc.step_time(1_000_000_000, "mixed", 2, 2, "optimizer", "cpu", 1.0, ROUND)
    assert r["stock"] == pytest.approx(1.0 + 0.5 + 0.1)
    assert r["total"] == pytest.approx(1.0)          # the ideal overlap (delayed update)


def test_compute_bound_when_compute_covers_the_transfers():
    r = oc.step_time(1_000_000_000, "mixed", 2, 2, "optimizer", "cpu", 5.0, ROUND)
    assert r["bound"] == "compute" and r["total"] == 5.0


def test_note_example_sums_to_155_ms_and_overlap_hides_the_rest():
    assert oc.note_example(overlap=False)["total"] == pytest.approx(0.155)
    assert oc.note_example(overlap=True)["total"] == pytest.approx(0.100)


def test_datasheet_links_use_the_gpu_table_and_stated_drive():
    links = oc.datasheet_links("a100-80gb", "gen4")
    assert links.h2d == links.d2h == pytest.approx(16e9 * 16 * 128 / 130 / 8, rel=1e-3)   # Gen4 x16
    assert (links.nvme_read, links.nvme_write) == (6.8e9, 5.6e9) and "Micron 7450 PRO" in links.source
    # memory-bound Adam: 2 sockets x 8 channels x 8 B x 4.8 GT/s over 8 ranks, 30 B per parameter
    assert links.cpu_adam == pytest.approx(2 * 8 * 8 * 4.8e9 / 8 / 30)


def test_break_even_tokens_make_compute_cover_the_slowest_link():
    links = oc.datasheet_links("h100-80gb", "gen4")
    n = 70_000_000_000
    tok = oc.break_even_tokens(n, "mixed", 3, 8, "optimizer", "cpu", links, 989e12, 0.4)
    compute = oc.compute_seconds(n, tok, 989e12, 0.4)
    r = oc.step_time(n, "mixed", 3, 8, "optimizer", "cpu", compute, links)
    assert r["bound"] == "compute"
    r = oc.step_time(n, "mixed", 3, 8, "optimizer", "cpu", oc.compute_seconds(n, tok - 2, 989e12, 0.4), links)
    assert r["bound"] != "compute"


@pytest.mark.parametrize("args", [(100, "mixed", 0, 2, "optimizer", "cpu"),
                                  (100, "mixed", 2, 2, "optimizer", "nvme"),
                                  (100, "mixed", 2, 2, "optimizer+params", "cpu"),
                                  (100, "bogus", 3, 2, "none", "cpu"),
                                  (0, "mixed", 3, 2, "none", "cpu")])
def test_combinations_deepspeed_lacks_are_refused(args):
    with pytest.raises(UsageError):
        oc.offload_traffic(*args)
