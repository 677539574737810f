"""Attention's time on a GPU: the roofline bound on the FLOPs and HBM bytes that
:mod:`gpumem.memory.attention_flops` counts (torch-free).

Time on a GPU is at least max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) per kernel (a roofline
bound, not a prediction). GPU figures come from ``gpumem.memory.gpus``; the stated utilisation
from :data:`gpumem.timing.compute.MFU`.
"""

from ..memory import gpus as gpu_table
from ..memory.attention_flops import attention_flops, hbm_bytes
from .compute import MFU


def ridge(gpu: str = "h100-80gb") -> float:
    """FLOPs per byte at which ``gpu``'s dense bf16 peak and its HBM bandwidth take equal time."""
    g = gpu_table.get(gpu)
    return (g.bf16_flops or g.fp16_flops) / g.hbm


def roofline(method: str, seq: int, heads: int, head_dim: int, batch: int = 1, gpu: str = "h100-80gb",
             elem: int = 2, block: int = 128, mfu: float = MFU) -> dict:
    """FLOPs, bytes, arithmetic intensity and the roofline lower bound on seconds (forward +
    backward) of one attention call on ``gpu`` at its dense bf16 peak and full HBM bandwidth;
    ``mfu_s`` is the FLOPs' time at ``mfu`` of the peak instead (a stated utilisation)."""
    g = gpu_table.get(gpu)
    f = attention_flops(method, seq, heads, head_dim, batch, False, block)
    b = hbm_bytes(method, seq, heads, head_dim, batch, elem, block)
    flops, moved = f["forward"] + f["backward"], b["forward"] + b["backward"]
    compute, memory = flops / (g.bf16_flops or g.fp16_flops), moved / g.hbm
    return {"method": method, "gpu": g.label, "flops": flops, "bytes": moved, "intensity": flops / moved,
            "compute_s": compute, "memory_s": memory, "mfu_s": compute / mfu, "bound_s": max(compute, memory),
            "bound_by": "compute" if compute >= memory else "memory"}
