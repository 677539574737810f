"""Lab 01's optional GPU part: one variant layer's forward on CUDA, the memory it leaves allocated
(what autograd saved) and its peak, against the learner's CPU-graded prediction. Skipped, with the
reason, without CUDA. Run on an H200 by ``make gpu-check`` (results/gpu/2026-12-04_nvidia-h200.md:
``lab01.variant_held_bytes_flash`` 291,800,064 B, the solution's prediction within 1,024 B). While
the learner's own ``gpu_held_bytes`` runs, :func:`held_after_forward` refuses (:func:`off`): the
measurement is theirs to write (review r19 of lab 01).

Measured as ``torch.cuda.memory_allocated()`` after the forward, less before it and less the
layer's output; one warm-up forward and backward first, so cuBLAS's workspace is already
allocated. The allocator rounds each block up to 512 B, hence :data:`TOLERANCE`.
"""

import contextlib

# one layer, all three variants at once, big enough that rounding and small buffers vanish
SHAPE = dict(d_model=2048, n_heads=16, n_kv_heads=4, ffn=5632, seq=2048, batch=2)
VARIANT = dict(norm="hf", mlp="gelu-dropout", qkv_bias=True)
KERNELS = ("flash", "eager")
TOLERANCE = 0.02
_OFF: list = []            # not empty while the learner's gpu_held_bytes runs


@contextlib.contextmanager
def off():
    """The course's own measurement refuses inside: the learner's ``gpu_held_bytes`` is graded."""
    _OFF.append(True)
    try:
        yield
    finally:
        _OFF.pop()


def cuda_reason() -> str:
    """'' when CUDA is usable, else why the GPU part is skipped."""
    import torch
    if not torch.cuda.is_available():
        return "no CUDA device here: the GPU part runs only on a GPU machine"
    return ""


def setup(kernel: str, shape: dict = SHAPE, variant: dict = VARIANT):
    """(block, x, cos, sin) on CUDA in bf16, after one warm-up forward and backward (cuBLAS's
    workspace and lazy initialisations are allocated before anything is measured)."""
    import torch

    from . import variants
    cfg = variants.config(shape["d_model"], shape["n_heads"], shape["n_kv_heads"], shape["ffn"])
    torch.manual_seed(0)
    block = variants.VariantBlock(cfg, **variant).to("cuda", torch.bfloat16)
    cos, sin = variants.llama.rope_tables(shape["seq"], cfg.head_dim, cfg.rope_theta, torch.bfloat16, "cuda")
    x = torch.randn(shape["batch"], shape["seq"], cfg.d_model, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    with torch.enable_grad():
        block(x * 1, cos, sin, kernel).sum().backward()
    block.zero_grad(set_to_none=True)
    x.grad = None
    torch.cuda.synchronize()
    return block, x, cos, sin


def held_after_forward(block, x, cos, sin, kernel: str) -> dict:
    """{"held": bytes still allocated after the forward, less its output, "peak": the forward's
    peak above what was allocated before it}. ``x * 1``: a fresh input, freed unless saved."""
    import torch
    if _OFF:
        raise RuntimeError("the course's own measurement is off while your gpu_held_bytes runs: "
                           "measure with torch.cuda.memory_allocated yourself")
    with torch.enable_grad():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = block(x * 1, cos, sin, kernel)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before - out.untyped_storage().nbytes()
        peak = torch.cuda.max_memory_allocated() - before
    del out
    return {"held": held, "peak": peak}


def learners(call, fn, kernel: str):
    """The learner's measurement, ``call(fn, block, x, cos, sin, kernel)``, with the course's own off."""
    args = setup(kernel)
    with off():
        return call(fn, *args, kernel)


def measure_cuda(kernel: str) -> dict:
    """The course's own measurement of :data:`SHAPE` with :data:`VARIANT` under ``kernel``."""
    return held_after_forward(*setup(kernel), kernel)


def measurement_verdict(got, measured: dict) -> tuple[str, str]:
    """(status, detail): the learner's ``{"held", "peak"}`` against the course's measurement."""
    if not (type(got) is dict and all(type(got.get(k)) is int for k in ("held", "peak"))):
        return "wrong", f"expected a dict with int 'held' and 'peak' bytes, got {got!r}"[:200]
    for key in ("held", "peak"):
        if abs(got[key] - measured[key]) > TOLERANCE * measured[key]:
            return "wrong", (f"{key}: you measured {got[key]:,} B, the course {measured[key]:,} B: reset the peak "
                             "and read memory_allocated() just before the forward; leave out its output")
    return "ok", f"held {got['held']:,} B, peak {got['peak']:,} B"


def verdict(predicted, measured: dict, cpu_truth) -> tuple[str, str]:
    """(status, detail): the learner's bytes against what the GPU held; where the GPU's kernels keep
    something the CPU trace does not, a prediction equal to the CPU trace still passes, said so."""
    held, peak = measured["held"], measured["peak"]
    said = f"GPU held {held:,} B after the forward (peak {peak:,} B), you predicted {predicted:,} B"
    if abs(predicted - held) <= TOLERANCE * held:
        return "ok", said
    if predicted == (cpu := cpu_truth()):          # a callable: the CPU trace at this size takes seconds
        return "ok", (f"{said}: your count is the CPU trace's; this GPU's kernels keep {held - cpu:+,} B "
                      "more (a different attention backend or dropout kernel)")
    return "wrong", f"{said} ({(predicted - held) / held:+.1%})"
