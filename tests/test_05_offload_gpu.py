"""Chapter 05 on a GPU: the PCIe rungs (pageable and pinned, both ways) and activation offload
with ``torch.autograd.graph.save_on_cpu``, measured. Skipped without CUDA."""

import pytest
import torch

from gpumem.memory import bandwidth

pytestmark = pytest.mark.gpu


def test_pcie_rungs_pinned_beats_pageable(gpu_record):
    r = bandwidth.cuda_rungs(256 << 20)
    for name, rung in r.items():
        gpu_record(f"ch05.{name}_bytes_per_s", rung["bytes_per_s"], "B/s")
    assert r["h2d_pinned"]["bytes_per_s"] > r["h2d_pageable"]["bytes_per_s"]
    assert r["d2d"]["bytes_per_s"] > r["h2d_pinned"]["bytes_per_s"]
    assert r["h2d_pinned"]["bytes_per_s"] < 70e9          # below PCIe Gen5 x16 per direction


def test_save_on_cpu_moves_saved_activations_off_the_gpu(gpu_record):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4096, 4096, device="cuda") for _ in range(8)]
    x = torch.randn(4096, 4096, device="cuda", requires_grad=True)     # (tokens, d): 64 MiB per activation

    def step(offload: bool):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else torch.enable_grad()
        with ctx:
            h = x
            for layer in layers:
                h = torch.relu(layer(h))
        after_forward = torch.cuda.memory_allocated() - base
        h.sum().backward()
        torch.cuda.synchronize()
        grads = [p.grad.clone() for p in layers[0].parameters()]
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        x.grad = None
        return after_forward, torch.cuda.max_memory_allocated() - base, grads
    kept, peak, g_plain = step(False)
    kept_off, peak_off, g_off = step(True)
    gpu_record("ch05.save_on_cpu_kept_after_forward_plain", kept, "B")
    gpu_record("ch05.save_on_cpu_kept_after_forward_offloaded", kept_off, "B")
    gpu_record("ch05.save_on_cpu_peak_plain", peak, "B")
    gpu_record("ch05.save_on_cpu_peak_offloaded", peak_off, "B")
    assert kept_off < kept / 4                             # the saved inputs went to pinned host memory
    assert all(torch.equal(a, b) for a, b in zip(g_plain, g_off))
