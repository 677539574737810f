"""GPU checks of chapter 01 (skipped without CUDA; `make gpu-check` on a GPU box)."""

import pytest

from gpumem.memory import measure, tracing


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["none", "full"])
def test_cuda_step_peak_is_near_the_trace(policy, gpu_record):
    measured = measure.cuda_step_peak(measure.GPU_PROBE, "mixed", "flash", policy, seq=1024)
    traced = tracing.trace_step(measure.GPU_PROBE, "mixed", "flash", policy, seq=1024)
    gpu_record(f"ch01.step_peak_bytes_{policy}", measured["peak"], "B")
    gpu_record(f"ch01.traced_peak_bytes_{policy}", traced.total_peak, "B")
    # allocator rounding, cuBLAS workspaces and the CUDA flash kernel's own saved tensors differ
    assert abs(measured["peak"] / traced.total_peak - 1) < 0.10, (measured, traced.total_peak)




@pytest.mark.gpu
def test_gpu_table_capacity_is_what_nvidia_smi_reports(gpu_record):
    """On a GPU the table lists, nvidia-smi's memory.total equals the table's capacity in MiB, and
    what CUDA lets PyTorch see is no more than that."""
    import shutil
    import subprocess

    import torch
    from gpumem.memory import gpus
    name = torch.cuda.get_device_name()
    gpu = gpus.of_device(name)
    if gpu is None or shutil.which("nvidia-smi") is None:
        pytest.skip(f"{name} is not in the GPU table (or nvidia-smi is missing)")
    mib = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, check=True).stdout.strip())
    gpu_record("ch01.nvidia_smi_memory_total_mib", mib, "MiB")
    gpu_record("ch01.torch_total_memory_bytes", torch.cuda.get_device_properties(0).total_memory, "B")
    assert mib * 2**20 == gpu.capacity
    assert torch.cuda.get_device_properties(0).total_memory <= gpu.capacity
