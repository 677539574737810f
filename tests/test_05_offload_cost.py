"""Chapter 05's cost model: bytes per link counted by hand, seconds from round bandwidths."""

import pytest

from gpumem.errors import UsageError
from gpumem.memory import offload_cost as oc
from gpumem.timing import offload_time as ot
from gpumem.timing.compute import KERNEL_SHARE
from gpumem.timing.offload_time import Links

ROUND = Links(h2d=10e9, d2h=20e9, nvme_read=2e9, nvme_write=1e9, cpu_adam=1e9, source="test")


def test_gradient_trip_follows_the_stage_as_deepspeed_runs_it():
    # 7e9 params on 8 ranks: each rank's shard is 875,000,000 params.
    # ZeRO-1/2 (stage_1_and_2.py): the slice is widened to fp32 on the GPU, then copied: 4 B down;
    # the updated bf16 shard comes up: 2 B.
    s = 875_000_000
    for zero in (1, 2):
        t = oc.offload_traffic(7_000_000_000, "mixed", zero, 8, "optimizer", "cpu")
        assert t == {"h2d": 2 * s, "d2h": 4 * s, "nvme_read": 0, "nvme_write": 0}
    # ZeRO-3 (stage3.py partition_grads): bf16 partition copied into the host buffer (2 B down,
    # L2025), brought back to the GPU (2 B up, L2028), widened there and copied down (4 B, L1457);
    # then the updated bf16 shard comes up after the step (2 B): 6 B down, 4 B up
    t = oc.offload_traffic(7_000_000_000, "mixed", 3, 8, "optimizer", "cpu")
    assert t == {"h2d": (2 + 2) * s, "d2h": (2 + 4) * s, "nvme_read": 0, "nvme_write": 0}
    assert oc.gradient_trip("mixed", 3) == {"down": 6, "up": 2}
    # each later micro-batch: up to the GPU, add, back down (L2031-2039): + 2 B each way
    assert oc.gradient_trip("mixed", 3, micro_batches=4) == {"down": 6 + 3 * 2, "up": 2 + 3 * 2}
    t4 = oc.offload_traffic(7_000_000_000, "mixed", 3, 8, "optimizer", "cpu", micro_batches=4)
    assert (t4["d2h"], t4["h2d"]) == (12 * s, (8 + 2) * s)
    # the ZeRO-Offload paper's design sends 16-bit gradients once at every stage
    for zero in (2, 3):
        t = oc.offload_traffic(7_000_000_000, "mixed", zero, 8, "optimizer", "cpu", grads="paper")
        assert (t["d2h"], t["h2d"]) == (2 * s, 2 * s)
    # pure bf16 has no fp32 master: its optimizer reads bf16 gradients, 2 B down at ZeRO-2
    assert oc.offload_traffic(7_000_000_000, "pure-bf16", 2, 8, "optimizer", "cpu")["d2h"] == 2 * s
    assert oc.gradient_trip("pure-bf16", 3) == {"down": 2 + 2, "up": 2}
    # the fp32 recipe has 4-byte parameters and gradients on the GPU
    t = oc.offload_traffic(7_000_000_000, "fp32", 1, 8, "optimizer", "cpu")
    assert t["h2d"] == t["d2h"] == 4 * s
    with pytest.raises(UsageError):
        oc.offload_traffic(7_000_000_000, "mixed", 2, 8, "optimizer", "cpu", grads="fp8")
    with pytest.raises(UsageError):
        oc.gradient_trip("mixed", 3, micro_batches=0)


def test_gradient_trip_matches_deepspeed_source_lines():
    # the copies the cost model counts are on the lines offload_cost's docstring cites, in the
    # installed DeepSpeed 0.19.8 (read as text: no import)
    import importlib.util
    from pathlib import Path
    root = Path(importlib.util.find_spec("deepspeed").origin).parent
    lines = (root / "runtime" / "zero" / "stage3.py").read_text().splitlines()
    assert "grad_buffer.copy_(grad_partition, non_blocking=True)" in lines[2025 - 1]
    assert "grad_buffer = grad_buffer.to(grad_partition.device, non_blocking=True)" in lines[2028 - 1]
    assert "cuda_grad_buffer = grad_buffer.to(grad_partition.device" in lines[2034 - 1]
    assert "fp32_grad_tensor.copy_(grad_buffer.to(dtype=self.master_weights_and_grads_dtype)" in lines[1457 - 1]
    assert "reduce_and_partition_stream" in lines[1669 - 1] and "partition_grads(" in lines[1686 - 1]
    assert "OffloadDeviceEnum.cpu" in lines[333 - 1]
    # the step swaps the states sub-group by sub-group; only parameter partitions are prefetched
    assert "_prepare_sub_group(sub_group_id" in lines[2913 - 1] and "_release_sub_group(" in lines[2927 - 1]
    coord = (root / "runtime" / "zero" / "partitioned_param_coordinator.py").read_text().splitlines()
    assert "swap_in(swap_in_params, async_op=True)" in coord[690 - 1]


def test_uneven_shard_rounds_up():
    t = oc.offload_traffic(10, "mixed", 3, 4, "optimizer", "cpu")
    assert t["d2h"] == (2 + 4) * 3      # ceil(10 / 4) = 3 elements: bf16, then fp32, at ZeRO-3
    assert oc.offload_traffic(10, "mixed", 2, 4, "optimizer", "cpu")["d2h"] == 4 * 3   # fp32 at ZeRO-2


def test_no_offload_moves_nothing():
    assert set(oc.offload_traffic(1000, "mixed", 3, 2, "none", "cpu").values()) == {0}


def test_zero_infinity_reads_params_twice_and_everything_once():
    # on the drive (DeepSpeed 0.19.8): fp32 master, m, v 12 B + the optimizer's fp32 gradient 4 B +
    # the bf16 parameter shard 2 B; the bf16 gradient partition waits in host memory. Params are
    # fetched in forward and backward (2 x 2 B up, read twice from the drive); the gradient trip
    # adds 2 B up and 6 B down.
    s = 500_000_000
    for recipe in ("mixed", "mixed-ds"):        # offloaded, both recipes describe the same run
        t = oc.offload_traffic(1_000_000_000, recipe, 3, 2, "optimizer+params", "nvme")
        assert t == {"h2d": (2 * 2 + 2) * s, "d2h": 6 * s, "nvme_read": (12 + 4 + 2) * s + 2 * s,
                     "nvme_write": (12 + 4 + 2) * s}
        p = oc.traffic_parts(1_000_000_000, recipe, 3, 2, "optimizer+params", "nvme")
        assert (p["nvme_param_read"], p["nvme_state_read"]) == (2 * 2 * s, (12 + 4) * s)
    # optimizer only on the drive: 12 B + the fp32 gradient; params stay on the GPU and go up once
    t = oc.offload_traffic(1_000_000_000, "mixed", 3, 2, "optimizer", "nvme")
    assert t == {"h2d": (2 + 2) * s, "d2h": 6 * s, "nvme_read": 16 * s, "nvme_write": 16 * s}
    # two micro-batches: the parameters are fetched (and read) for each forward and backward
    p = oc.traffic_parts(1_000_000_000, "mixed", 3, 2, "optimizer+params", "nvme", micro_batches=2)
    assert p["param_fetch"] == p["nvme_param_read"] == 2 * 2 * 2 * s


def test_zero_infinity_70b_nvme_seconds_at_datasheet_speeds():
    # 70B on 8 GPUs, shard s; the drive reads 20 s and writes 18 s. The cost model's drive is the
    # datacenter Micron 7450 PRO (6.8 GB/s read, 5.6 GB/s write, ServeTheHome's launch report); the
    # consumer Samsung 990 PRO's rated burst (7.45 / 6.9 GB/s, its datasheet) is the labelled second entry
    n = 70_553_706_496
    s = -(-n // 8)
    links = ot.datasheet_links("h100-80gb", "gen4")
    r = ot.step_time(n, "mixed", 3, 8, "optimizer+params", "nvme", 0.0, links)
    assert r["nvme"] == pytest.approx(20 * s / 6.8e9 + 18 * s / 5.6e9)
    assert 54.2 < r["nvme"] < 54.4
    burst = ot.step_time(n, "mixed", 3, 8, "optimizer+params", "nvme", 0.0, ot.datasheet_links("h100-80gb", "gen4-consumer"))
    assert burst["nvme"] == pytest.approx(20 * s / 7.45e9 + 18 * s / 6.9e9) and 46.6 < burst["nvme"] < 46.8


def test_default_drive_is_the_datacenter_one_and_consumer_drives_are_labelled():
    assert ot.datasheet_links() == ot.datasheet_links("h100-80gb", "gen4")
    dc = ot.NVME_DRIVES["gen4"]
    assert (dc.read, dc.write, dc.name) == (6.8e9, 5.6e9, "Micron 7450 PRO")
    assert dc.source.startswith("datacenter") and "ServeTheHome" in dc.source
    for key, drive in ot.DRIVES.items():
        assert drive.source.split()[0] in ("datacenter", "consumer") and drive.name in drive.source, key
    assert ot.DRIVES["gen4-consumer"].source.startswith("consumer") and "SLC" in ot.DRIVES["gen4-consumer"].source
    with pytest.raises(UsageError, match="gen4-consumer"):
        ot.datasheet_links("h100-80gb", "gen6")


def test_step_time_terms_from_round_bandwidths():
    # 1e9 params on 2 ranks, s = 5e8; up 6 B x s = 3e9 B, down 6 B x s = 3e9 B
    r = ot.step_time(1_000_000_000, "mixed", 3, 2, "optimizer+params", "nvme", 1.0, ROUND, overlap=False)
    assert r["h2d"] == pytest.approx(3e9 / 10e9)
    assert r["d2h"] == pytest.approx(3e9 / 20e9)
    assert r["nvme"] == pytest.approx(10e9 / 2e9 + 9e9 / 1e9)   # (18 + 2) B x 5e8 read, 18 B x 5e8 written
    assert r["nvme_params"] == pytest.approx(2e9 / 2e9)          # 2 x 2 B x 5e8 read for the passes
    # the fp32 gradient, 4 B x 5e8 written during backward, fits one buffer (5e8 <= sub_group_size
    # 1e9): written whole at the step; the rest of the states in the step
    assert r["nvme_grad"] == r["nvme_grad_exposed"] == pytest.approx(2e9 / 1e9)
    assert r["nvme_states"] == pytest.approx(8e9 / 2e9 + 7e9 / 1e9)
    # the gradient copies on one stream: 2 B down, 2 B up, 4 B down in turn
    assert r["grad_trip"] == pytest.approx(3e9 / 20e9 + 1e9 / 10e9)
    assert r["cpu_adam"] == pytest.approx(5e8 / 1e9)
    assert r["total"] == pytest.approx(1.0 + 0.3 + 0.15 + 14.0 + 0.5)
    assert r["bound"] == "nvme"
    r = ot.step_time(1_000_000_000, "mixed", 3, 2, "optimizer+params", "nvme", 1.0, ROUND, overlap=True)
    # the best schedule: the gradient write (2 s) and parameter reads (1.0 s) beside compute (1.0 s),
    # then the state swaps (11 s)
    assert r["total"] == pytest.approx(2.0 + 11.0)
    # stock: max(compute, gradient stream, fetches, reads) + the gradient write + swaps + Adam; no
    # upload after the step
    assert r["stock"] == pytest.approx(max(1.0, 0.25, 0.3, 1.0) + 2.0 + 11.0 + 0.5)


def test_nvme_state_swaps_are_never_hidden_but_cpu_offload_is():
    links = ot.datasheet_links("h100-80gb", "gen4")
    n = 70_553_706_496
    s = -(-n // 8)
    for tokens in (4096, 10**6):
        c = ot.compute_seconds(n, tokens, 989e12)          # at KERNEL_SHARE, the default
        assert c == pytest.approx(6 * n * tokens / (KERNEL_SHARE * 989e12))
        r = ot.step_time(n, "mixed", 3, 8, "optimizer+params", "nvme", c, links)
        swaps = 16 * s / 6.8e9 + 14 * s / 5.6e9       # states + gradient read; states + 16-bit shard written
        assert r["nvme_states"] == pytest.approx(swaps)
        # beside compute: the parameter reads, CPU Adam (the paper's 10e9 / 2.57 per node over 8
        # ranks) and, at best, the whole gradient write
        assert r["total"] == pytest.approx(max(c, 4 * s / 6.8e9, s / (10e9 / 2.57 / 8), 4 * s / 5.6e9) + swaps)
    assert ot.break_even_tokens(n, "mixed", 3, 8, "optimizer+params", "nvme", links, 989e12) is None
    assert ot.break_even_tokens(n, "mixed", 3, 8, "optimizer", "nvme", links, 989e12) is None
    assert ot.break_even_tokens(n, "mixed", 3, 8, "optimizer", "cpu", links, 989e12) > 0


def test_stock_schedule_hides_only_the_gradient_copies():
    # ZeRO-2, 1e9 params on 2 ranks: s = 5e8; fp32 grads down 2e9 B / 20e9 = 0.1 s (inside backward's
    # 1.0 s), Adam 5e8 / 1e9 = 0.5 s after backward, bf16 params up 1e9 B / 10e9 = 0.1 s after Adam
    r = ot.step_time(1_000_000_000, "mixed", 2, 2, "optimizer", "cpu", 1.0, ROUND)
    assert r["stock"] == pytest.approx(1.0 + 0.5 + 0.1)
    assert r["total"] == pytest.approx(1.0)          # the ideal overlap (delayed update)
    # a bare dict of the five terms (the quiz's) reads as: gradients during backward, the rest after
    terms = {"compute": 0.4, "d2h": 0.06, "cpu_adam": 0.25, "h2d": 0.03, "nvme": 0}
    assert ot.stock_schedule(terms) == pytest.approx(0.4 + 0.25 + 0.03)


def test_compute_bound_when_compute_covers_the_transfers():
    r = ot.step_time(1_000_000_000, "mixed", 2, 2, "optimizer", "cpu", 5.0, ROUND)
    assert r["bound"] == "compute" and r["total"] == 5.0


def test_note_example_sums_to_155_ms_and_overlap_hides_the_rest():
    assert ot.note_example(overlap=False)["total"] == pytest.approx(0.155)
    assert ot.note_example(overlap=True)["total"] == pytest.approx(0.100)


def test_datasheet_links_use_the_gpu_table_and_stated_drive():
    links = ot.datasheet_links("a100-80gb", "gen4")
    assert links.h2d == links.d2h == pytest.approx(16e9 * 16 * 128 / 130 / 8, rel=1e-3)   # Gen4 x16
    assert (links.nvme_read, links.nvme_write) == (6.8e9, 5.6e9) and "Micron 7450 PRO" in links.source
    # CPU Adam at the ZeRO-Offload paper's achieved rate (Table 4: 10 B parameters in 2.57 s on a
    # DGX-2 host) over the 8 ranks on the node; the DRAM bound (2 sockets x 8 channels x 8 B x
    # 4.8 GT/s / 30 B a parameter) is only the ceiling, and the source says both
    assert links.cpu_adam == pytest.approx(10e9 / 2.57 / 8)
    assert "0.49 G params/s per rank" in links.source and "Table 4" in links.source
    assert f"ceiling {2 * 8 * 8 * 4.8e9 / 30 / 1e9:.2f} G params/s per node" in links.source
    half = ot.datasheet_links("a100-80gb", "gen4", adam_rate=10e9 / 2.57 / 2)
    assert half.cpu_adam == pytest.approx(links.cpu_adam / 2) and "(given)" in half.source
    with pytest.raises(UsageError):
        ot.datasheet_links(adam_rate=0)


def test_break_even_tokens_make_compute_cover_the_slowest_link():
    links = ot.datasheet_links("h100-80gb", "gen4")
    n = 70_000_000_000
    tok = ot.break_even_tokens(n, "mixed", 3, 8, "optimizer", "cpu", links, 989e12)
    # CPU Adam binds: the 1/8 shard at the paper's 10e9 / 2.57 params/s per node over 8 ranks,
    # covered by 6 n T FLOPs at KERNEL_SHARE (the default: the compute window) of 989 TFLOP/s
    adam = -(-n // 8) / (10e9 / 2.57 / 8)
    assert tok == pytest.approx(adam * KERNEL_SHARE * 989e12 / (6 * n), abs=1)
    assert ot.break_even_tokens(n, "mixed", 3, 8, "optimizer", "cpu", links, 989e12, 0.4) == pytest.approx(
        adam * 0.4 * 989e12 / (6 * n), abs=1)                                           # a stated share
    compute = ot.compute_seconds(n, tok, 989e12)
    r = ot.step_time(n, "mixed", 3, 8, "optimizer", "cpu", compute, links)
    assert r["bound"] == "compute"
    r = ot.step_time(n, "mixed", 3, 8, "optimizer", "cpu", ot.compute_seconds(n, tok - 2, 989e12), links)
    assert r["bound"] != "compute"


@pytest.mark.parametrize("args", [(100, "mixed", 0, 2, "optimizer", "cpu"),
                                  (100, "mixed", 2, 2, "optimizer", "nvme"),
                                  (100, "mixed", 2, 2, "optimizer+params", "cpu"),
                                  (100, "bogus", 3, 2, "none", "cpu"),
                                  (0, "mixed", 3, 2, "none", "cpu")])
def test_combinations_deepspeed_lacks_are_refused(args):
    with pytest.raises(UsageError):
        oc.offload_traffic(*args)


def test_zero2_accumulation_round_trips_as_deepspeed_runs_them():
    """stage_1_and_2.py (0.19.8), CPU offload, m micro-batches: async_accumulate_grad_in_cpu_via_gpu
    copies the 16-bit gradient down after every backward and, from the second on, brings the
    accumulated one up first (micro_step_id > 0); at the boundary the fp32 copy goes down
    (async_inplace_copy_grad_to_fp32_buffer_from_gpu). Mixed precision (bf16 grads, fp32 widened):
    m = 1: 4 down, 0 up; m = 4: 4 x 2 + 4 = 12 down, 3 x 2 = 6 up."""
    assert oc.gradient_trip("mixed", 2, micro_batches=1) == {"down": 4, "up": 0}
    assert oc.gradient_trip("mixed", 2, micro_batches=4) == {"down": 12, "up": 6}
    assert oc.gradient_trip("mixed", 1, micro_batches=4) == {"down": 12, "up": 6}
