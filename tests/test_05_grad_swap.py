"""Backward's fp32 gradient write to NVMe (gpumem.timing.grad_swap): the wait rule checked against
DeepSpeed's own AsyncTensorSwapper writing real files through libaio, the seconds against hand
traces."""

import os

import pytest
import torch

from gpumem.memory import bandwidth
from gpumem.runs import dsops
from gpumem.timing import grad_swap, offload_time as ot


def _deepspeed_waits(count: int, buffer_count: int, tmp_path) -> list[bool]:
    """Fill ``count`` buffers one tensor each through DeepSpeed 0.19.8's AsyncTensorSwapper (real
    pinned buffers, real aio writes) and note after which buffer it waited for every write."""
    from deepspeed.runtime.swap_tensor.async_swapper import AsyncTensorSwapper
    handle = bandwidth.aio_handle(dsops.libaio_present())
    if handle is None:
        pytest.skip("DeepSpeed's async_io op did not load (libaio-dev missing)")
    log: list = []

    class Seen(AsyncTensorSwapper):              # records, then runs DeepSpeed's own method
        def _wait_for_swap_complete(self):
            log.append("wait")
            super()._wait_for_swap_complete()

    numel = 4096
    swapper = Seen(handle, numel_alignment=1024, timers=None)
    swapper.add_buffers([handle.new_cpu_locked_tensor(numel, torch.empty(0, dtype=torch.float32))
                         for _ in range(buffer_count)])
    for i in range(count):
        swapper.swap_out_tensors([torch.full((numel,), float(i))], [str(tmp_path / f"g{i}.swp")])
        log.append(i)                            # buffer i is full once the next gradient arrives
    swapper._flush_buffers_until_complete()      # what the step's swap-in does (release_buffers)
    assert sorted(os.listdir(tmp_path)) == sorted(f"g{i}.swp" for i in range(count))
    assert all(os.path.getsize(tmp_path / f"g{i}.swp") == numel * 4 for i in range(count))
    # a wait logged while gradient i + 1 is inserted happened once buffer i was full
    done = [i for i in log if i != "wait"]
    waited = [log[k - 1] for k, e in enumerate(log) if e == "wait" and k > 0 and log[k - 1] != "wait"]
    assert log[-1] == "wait" and done == list(range(count))
    return [i < count - 1 and i in waited for i in range(count)]    # the last: the step's flush


@pytest.mark.parametrize("count,buffer_count", [(9, 4), (5, 2), (3, 1), (1, 4), (6, 8)])
def test_the_wait_rule_is_deepspeeds(count, buffer_count, tmp_path):
    waits = _deepspeed_waits(count, buffer_count, tmp_path)
    assert waits == grad_swap.waits(count, buffer_count)
    # by hand: every buffer_count-th buffer but the last
    assert waits == [i < count - 1 and i % buffer_count == buffer_count - 1 for i in range(count)]


def test_a_shard_that_fits_one_buffer_is_written_after_backward():
    # 5e8 elements <= sub_group_size: one buffer, written at the step: the whole 2e9 B at 1 GB/s
    assert grad_swap.buffers(500_000_000) == [500_000_000]
    assert grad_swap.exposed_seconds(500_000_000, 4, 1e9, backward_s=30.0) == pytest.approx(2.0)


def test_70b_on_8_ranks_by_hand():
    # s = 8,819,213,312 elements: 8 buffers of 1e9 and one of 819,213,312; 4 B each at 5.6 GB/s;
    # backward 10 s x 2/3 fills 1e9 elements in 6.667 x 1e9 / s = 0.7559 s; writes one in 0.7143 s
    s, w, back = 8_819_213_312, 5.6e9, 10.0 * 2 / 3
    fill, write = back * 1e9 / s, 4e9 / w
    assert grad_swap.buffers(s) == [10**9] * 8 + [819_213_312]
    # buffers 1-4 written as they fill (the drive keeps up: write < fill); full at 4 x fill, the 4th
    # write ends at 4 x fill + write, and backward waits for it; the same for buffers 5-8
    t = 4 * fill + write
    t = t + 4 * fill + write
    last = 819_213_312
    t += back * last / s                            # the last buffer fills ...
    end = t + last * 4 / w                          # ... and is written at the step
    assert grad_swap.exposed_seconds(s, 4, w, back) == pytest.approx(end - back)
    assert 2.00 < end - back < 2.03                  # 2.01 s of the 6.30 s write


def test_a_fast_drive_with_buffers_to_spare_shows_only_the_last_buffer():
    s = 10 * 10**9
    # 10 buffers, 20 in hand: no waits; each written in 0.04 s, filled in 0.1 s: only the last shows
    assert grad_swap.exposed_seconds(s, 4, 100e9, 1.0, buffer_count=20) == pytest.approx(4e9 / 100e9)


def test_a_slow_drive_sets_the_pace():
    s = 4 * 10**9
    # 4 buffers, all in hand but the last waits; filled at 0.25 s each, written in 4 s each:
    # the drive starts at 0.25 s and writes all 16e9 B back to back: ends at 16.25 s
    assert grad_swap.exposed_seconds(s, 4, 1e9, 1.0, buffer_count=8) == pytest.approx(16.25 - 1.0)


def test_step_time_charges_only_the_exposed_write():
    links = ot.datasheet_links("h100-80gb", "gen4")
    n, s = 70_553_706_496, 8_819_213_312
    r = ot.step_time(n, "mixed", 3, 8, "optimizer", "nvme", 10.0, links)
    assert r["nvme_grad"] == pytest.approx(4 * s / 5.6e9)
    assert r["nvme_grad_exposed"] == pytest.approx(grad_swap.exposed_seconds(s, 4, 5.6e9, 10.0 * 2 / 3))
    # read: 12 B states + 4 B gradient; written in the step: 12 B states
    assert r["nvme_states"] == pytest.approx(16 * s / 6.8e9 + 12 * s / 5.6e9)
    assert r["stock"] == pytest.approx(max(10.0, r["grad_trip"], r["h2d"] - r["h2d_after"])
                                       + r["nvme_grad_exposed"] + r["nvme_states"] + r["cpu_adam"]
                                       + r["h2d_after"])
    # micro-batches: only the last one's backward writes, so the window shrinks
    r4 = ot.step_time(n, "mixed", 3, 8, "optimizer", "nvme", 10.0, links, micro_batches=4)
    assert r4["nvme_grad_exposed"] == pytest.approx(grad_swap.exposed_seconds(s, 4, 5.6e9, 10.0 * 2 / 3 / 4))
    # the CPU rungs write nothing
    assert ot.step_time(n, "mixed", 3, 8, "optimizer", "cpu", 10.0, links)["nvme_grad_exposed"] == 0.0


def test_a_transfer_slower_than_compute_stretches_backward():
    """Review r22 of lab 05: backward lasts as long as the slowest thing in it. ZeRO-Infinity at 2 s
    of compute: the drive reads the bf16 shard twice, 4 s / 6.8 GB/s = 5.19 s, half in backward
    (2.59 s), longer than backward's compute (1.33 s), the gradient stream (2 + 2 + 4 B over 63 GB/s,
    1.12 s) and its uploads (2 B back up + half of 4 B fetched, 0.56 s)."""
    links = ot.datasheet_links("h100-80gb", "gen4")
    n, s = 70_553_706_496, 8_819_213_312
    back = max(2.0 * 2 / 3, 8 * s / 63e9, 4 * s / 63e9, 4 * s / 6.8e9 / 2)
    assert back == pytest.approx(4 * s / 6.8e9 / 2) and 2.59 < back < 2.60
    r = ot.step_time(n, "mixed", 3, 8, "optimizer+params", "nvme", 2.0, links)
    assert r["nvme_grad_exposed"] == pytest.approx(grad_swap.exposed_seconds(s, 4, 5.6e9, back))
    assert grad_swap.backward_seconds(2.0, 8 * s / 63e9, 4 * s / 63e9, 4 * s / 6.8e9, 2) == pytest.approx(back / 2)
    assert r["backward"] == pytest.approx(back)              # the window step_time timed the buffers on
