"""Lab 04's bf16 grading of ``flash_backward`` (the cases ``labcases.BF16``, ``BF16_DQ``).

FlashAttention-2 takes bf16 Q, K, V, dO, O and an fp32 logsumexp, computes its tiles in fp32,
keeps dK and dV of a key block in fp32 registers and writes them once in bf16, and adds every key
block's share of dQ into an fp32 buffer (``dq_accum``, allocated ``opts.dtype(at::kFloat)`` in
``mha_bwd`` of flash-attention's ``csrc/flash_attn/flash_api.cpp``), cast to bf16 once at the end.
The expected gradients are fp64 of exactly what the kernel is given
(:func:`.labref.kernel_grads`): a kernel that keeps dQ's sum in fp32 gives that dQ rounded once
to bf16, within rounding; one that rounds each ``dq_part`` to bf16 does not (review r22).
"""

import torch

# Measured (tools: the solution; a kernel whose dK, dV accumulators are bf16; one whose dQ sum is
# bf16), relative error (norm) on BF16: dk 0.0017 vs 0.0058, dv 0.0017 vs 0.0059
BF16_TOL = 2.0 ** -8         # bf16's unit roundoff, between the two
# dq against the exact dQ (labref.kernel_grads) rounded once to bf16, seeds 100-109 on BF16 and
# BF16_DQ: at most 0.00005 with dq_part in fp32 and an fp32 sum; 0.0025-0.0029 with each dq_part
# rounded to bf16 and summed in fp32; 0.0034-0.0064 with the sum in bf16 too (review r22)
DQ_TOL = 2.0 ** -11
FP32_DQ = ("dQ's partial sums stay in fp32 (FlashAttention-2 adds every key block's share into an fp32 "
           "buffer, dq_accum in flash_api.cpp, and casts dQ once, at the end)")


def wrong(got, want, calls) -> str:
    """'' or the first of dq, dk, dv whose dtype is not bf16, a dq_part in less than fp32, or the
    first of dq, dk, dv whose relative error (norm) is over its tolerance: dk, dv against the exact
    gradients at :data:`BF16_TOL`; dq against the exact dQ rounded once to bf16 at :data:`DQ_TOL`."""
    for name, t, w in zip(("dq", "dk", "dv"), got, want):
        if not isinstance(t, torch.Tensor) or t.shape != w.shape or t.dtype != torch.bfloat16:
            return f"{name}: expected a bf16 tensor of shape {tuple(w.shape)} (like the inputs)"
    low = next((p[0].dtype for _, p in calls if isinstance(p, tuple) and p and isinstance(p[0], torch.Tensor)
                and p[0].dtype in (torch.bfloat16, torch.float16)), None)
    if low is not None:
        return (f"key_block_backward returned dq_part in {str(low)[6:]}: {FP32_DQ}; return dq_part in fp32, "
                f"dk_blk and dv_blk in the inputs' dtype")
    for name, t, w in zip(("dq", "dk", "dv"), got, want):
        tol, w = (DQ_TOL, w.bfloat16().double()) if name == "dq" else (BF16_TOL, w)
        err = float((t.double() - w).norm() / w.norm())
        if err > tol and name == "dq":
            return (f"dq: relative error {err:.5f} (norm) against the exact dQ rounded once to bf16, above "
                    f"2^-11 = {DQ_TOL:.5f}: {FP32_DQ}; keep D and the tiles in fp32 too")
        if err > tol:
            return (f"{name}: relative error {err:.4f} (norm) with bf16 inputs, above 2^-8 = {BF16_TOL:.4f}; "
                    f"keep the tiles and every sum across blocks (dQ over key blocks, dK and dV over "
                    f"query blocks) in fp32, and cast once at the end")
    return ""
