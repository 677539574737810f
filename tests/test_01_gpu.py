"""GPU checks of chapter 01 (skipped without CUDA; `make gpu-check` on a GPU box)."""

import pytest

from gpumem.memory import measure, tracing


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["none", "full"])
def test_cuda_step_peak_is_near_the_trace(policy):
    measured = measure.cuda_step_peak(measure.GPU_PROBE, "mixed", "flash", policy, seq=1024)
    traced = tracing.trace_step(measure.GPU_PROBE, "mixed", "flash", policy, seq=1024)
    # allocator rounding, cuBLAS workspaces and the CUDA flash kernel's own saved tensors differ
    assert abs(measured["peak"] / traced.total_peak - 1) < 0.10, (measured, traced.total_peak)
