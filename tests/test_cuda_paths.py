"""CUDA-only code paths, checked where a CPU can check them (the audit after the first H200 run).

Nothing here measures a GPU: each test runs the placement or bookkeeping logic that decides what
happens on one, with real ranks, real DeepSpeed and real tensors on the CPU.
"""

import contextlib
import gc
import inspect

import torch
import torch.distributed as dist

from gpumem.memory.llama import Llama
from gpumem.runs import launch, training


def test_cpu_ranks_get_deepspeeds_cpu_accelerator_whatever_this_process_says(monkeypatch):
    """Left to itself DeepSpeed picks CUDA wherever a GPU is visible, also in gloo CPU ranks, whose
    engines then land on cuda:<rank> (rank 1 of 2 on a one-GPU machine has no device; a one-rank
    engine meets CPU token ids). A parent whose environment says cuda stands in for that machine:
    the rank must still get DeepSpeed's CPU accelerator."""
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    got = launch.run("gpumem.runs.examples:deepspeed_accelerator", 1, "cpu", progress=False)
    assert got == [{"DS_ACCELERATOR": "cpu", "name": "cpu"}]


def test_the_accelerator_follows_the_ranks_device():
    """CUDA ranks get DeepSpeed's CUDA accelerator even where this process set DS_ACCELERATOR=cpu
    (chapter 03's in-process DeepSpeed run does, and its setting is inherited by later launches)."""
    assert (launch.accelerator("cuda"), launch.accelerator("cpu")) == ("cuda", "cpu")


@contextlib.contextmanager
def _one_rank_group():
    """A real gloo process group of one rank in this process (ZeroAdamW asks it its rank), with the
    garbage collector off, so that only reference counting frees what a stage leaves."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{launch.free_port()}", rank=0, world_size=1)
    was = gc.isenabled()
    gc.collect()             # earlier tests' cyclic garbage (models among it) goes now, not inside the count
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        dist.destroy_process_group()


def _live_models():
    """The Llamas alive now, weakly held: a later count takes only models made since (an earlier
    test's model that something else lets go of meanwhile does not count: the full suite once saw
    two such go during reset_peak's collection, -2)."""
    import weakref
    return weakref.WeakSet(o for o in gc.get_objects() if type(o) is Llama)


def _new_models(before) -> int:
    return sum(type(o) is Llama and o not in before for o in gc.get_objects())


def test_a_from_scratch_stage_leaves_no_model_behind():
    """On the H200 the from-scratch stages' CUDA peaks grew stage by stage by about one model's
    weights and moments (mini: +10.6, +9.8, +12.7 MB; 3 x 3.35 MB is 10.0): every earlier stage's
    model was still allocated. The GradMeter's and ZeroAdamW's gradient hooks held them; autograd
    keeps tensor hooks where Python's collector cannot see them, so that cycle was never freed,
    not even by gc.collect(). Stages 0-2 must now be freed by reference counting alone."""
    from gpumem.chapters.ch02_zero import scratch_ranks
    with _one_rank_group():
        before = _live_models()
        scratch_ranks.from_scratch_stages(0, 1, stages=(0, 1, 2), model="tiny", steps=1, seq=8)
        assert _new_models(before) == 0


def test_reset_peak_frees_a_stage_3_model_before_the_next_peak():
    """ZeRO-3's module hooks (a Python cycle: module -> hook -> optimizer -> model) wait for the
    collector; reset_peak, where a rank function starts a CUDA peak, collects them first."""
    from gpumem.chapters.ch02_zero import scratch_ranks
    with _one_rank_group():
        before = _live_models()
        scratch_ranks.from_scratch_stages(0, 1, stages=(3,), model="tiny", steps=1, seq=8)
        left = _new_models(before)
        training.reset_peak(torch.device("cpu"))
        assert (left, _new_models(before)) == (1, 0)


def test_deepspeed_stages_start_each_peak_with_reset_peak():
    """Each ZeRO stage's engine is re-created in the same rank: its CUDA peak must start after the
    previous engine is collected (a static check of the rank function's source)."""
    from gpumem.chapters.ch02_zero import ds_ranks
    src = inspect.getsource(ds_ranks.deepspeed_stages)
    assert "reset_peak(device)" in src and "reset_peak_memory_stats" not in src


def test_offload_configs_pin_host_buffers_only_for_cuda_ranks():
    """Page-locked host buffers serve a GPU's copy engine only. The config used to pin wherever the
    calling process saw a GPU: CPU ranks on a GPU machine, and chapter 05's printed config (an
    output-checked cell that says "pin_memory": false), changed with the machine."""
    from gpumem.runs import ds_offload
    for name in ("zero2+cpu", "zero3+nvme"):
        pins = {dev: [v["pin_memory"] for k, v in ds_offload.offload_config(name, "/swap", 2, device=dev)
                      ["zero_optimization"].items() if k.startswith("offload_")] for dev in ("cpu", "cuda")}
        assert pins == {"cpu": [False] * len(pins["cuda"]), "cuda": [True] * len(pins["cuda"])}
    assert ds_offload.offload_config("zero3+nvme", "/swap", 2) == ds_offload.offload_config("zero3+nvme", "/swap", 2,
                                                                                          device="cpu")


def test_the_offload_rank_asks_for_its_own_device():
    """The rank function passes the device it trains on (static: the ranks need a process group)."""
    from gpumem.runs import ds_offload_ranks
    assert "device=device_of_rank(rank).type" in inspect.getsource(ds_offload_ranks._one_config)


def test_prepare_builds_the_cpu_ranks_ops_even_where_deepspeed_picked_cuda():
    """On a GPU machine DeepSpeed's accelerator is CUDA's, which has no builder for the CPU ranks'
    shared-memory op: prepare() (make setup) called None.load() there. The course's ops come from
    DeepSpeed's CPU builders, the ones CPU ranks load, whatever this process's accelerator."""
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    from gpumem.runs import dsops
    assert CUDA_Accelerator().create_op_builder(dsops.OPS["deepspeed_shm_comm"][0]) is None   # the premise
    for name, (cls, _) in dsops.OPS.items():
        b = dsops.host_builder(name)
        assert (type(b).__name__, type(b).__module__.rsplit(".", 1)[0]) == (cls, "deepspeed.ops.op_builder.cpu")
    src = inspect.getsource(dsops.prepare)
    assert "host_builder(name).load(" in src and "create_op_builder" not in src


def test_the_ladders_aio_handle_is_the_cpu_ranks_flavour():
    """The ladder loads async_io in this process; built with CUDA's flags here and the CPU ranks'
    flags there, the shared cache would rebuild it at each switch (static: needs libaio to load)."""
    from gpumem.memory import bandwidth
    assert "from deepspeed.ops.op_builder.cpu import AsyncIOBuilder" in inspect.getsource(bandwidth.aio_handle)


def test_cpu_ranks_offload_is_priced_with_host_copies_on_a_gpu_machine(tmp_path):
    """On a GPU machine the ladder also has PCIe rungs (the H200 run measured them, results/gpu/);
    the cost model used them for CPU ranks too, whose "device" is host memory: chapter 05's
    prediction of a CPU-rank run priced RAM copies at PCIe's rate. The CPU rungs here are measured
    on this machine, the PCIe ones are the H200's."""
    import json
    from pathlib import Path

    from gpumem.chapters.ch05_offload import experiments
    from gpumem.memory import bandwidth
    from gpumem.units import MiB
    h200 = {m["key"]: m["value"] for m in json.loads((Path(__file__).parents[1] / "results" / "gpu" /
                                                     "2026-12-04_nvidia-h200.json").read_text())["measurements"]}
    rungs = {"ram_copy": bandwidth.ram_copy(8 * MiB, 2), **bandwidth.disk(tmp_path, 4 * MiB, 2, use_aio=False)}
    for rung in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable", "d2d"):
        rungs[rung] = {"bytes_per_s": h200[f"ch05.{rung}_bytes_per_s"]}
    lad = {"rungs": rungs, "cpu_adam": None, "machine": "test", "date": "today"}
    ram = rungs["ram_copy"]["bytes_per_s"]
    cpu, cuda = experiments.ladder_links(lad, "cpu"), experiments.ladder_links(lad, "cuda")
    assert (cpu.h2d, cpu.d2h) == (ram, ram)
    assert (cuda.h2d, cuda.d2h) == (h200["ch05.h2d_pinned_bytes_per_s"], h200["ch05.d2h_pinned_bytes_per_s"])
    assert cpu.nvme_read == cuda.nvme_read == rungs["disk_read"]["bytes_per_s"]
