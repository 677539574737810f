"""Lab 03's optional GPU part: the learner's placement at a budget on a ~1.1 B-parameter Llama, run
with the learner's checkpoint on CUDA, its measured peak against the CPU-graded prediction.

Skipped, with the reason, without CUDA. Run once on a GPU by the course's authors (one H200,
torch 2.11, 2026-12-04, results/gpu/): the solution's placement peaked at 1,606,034,432 B against
a prediction of 1,537,867,784 B, +4.4 %, inside the tolerance below.

The model is ``recompute_cuda.GPU_1B`` (Llama-3.2-1B's widths, 16 layers, vocabulary 32,000) in
bf16 at sequence 2,048, micro-batch 1: a layer keeps about 180 MiB, a checkpoint 8 MiB. The budget
is set, as on the CPU, halfway between the best placement of :data:`COUNT` layers and the best of
fewer (``labplace``). Measured: ``torch.cuda.max_memory_allocated()`` during one forward and
backward, less what was allocated before it (parameters), after one warm-up step (cuBLAS and
attention workspaces already allocated). Parameter gradients are dropped as soon as each is
accumulated (``register_post_accumulate_grad_hook``), as the lab's budget leaves them out, so only
activations and short-lived backward temporaries remain.
"""

SEQ, BATCH = 2048, 1
COUNT = 12           # the optimum at the budget below: two segments of six layers
# Backward temporaries (a layer's weight gradient before its hook drops it, up to 2*F*h bytes =
# 32 MiB; the embedding's and the head's, 125 MiB each; attention workspaces) on top of the
# prediction: +4.4 % measured on one H200 (2026-12-04); 15 % leaves room for other GPUs' workspaces.
TOLERANCE = 0.15


def cuda_reason() -> str:
    """'' when CUDA is usable, else why the GPU part is skipped."""
    import torch
    if not torch.cuda.is_available():
        return "no CUDA device here: the GPU part runs only on a GPU machine"
    return ""


def setting() -> dict:
    """The model, the numbers ``place_checkpoints`` is given, and the budget."""
    from gpumem.memory.recompute_cuda import GPU_1B

    from . import labplace
    return {"cfg": GPU_1B, "numbers": labplace.numbers(GPU_1B, SEQ, BATCH),
            "budget": labplace.budget_for(GPU_1B, COUNT, SEQ, BATCH)}


def measure_cuda(segments, checkpoint) -> int:
    """Peak bytes above the parameters during one step of ``GPU_1B`` with ``segments`` checkpointed
    by ``checkpoint(run, *args)`` on CUDA (module docstring)."""
    import torch

    from gpumem.memory import recompute, tracing
    from gpumem.memory.llama import Llama
    from gpumem.memory.recompute_plans import from_segments
    cfg = setting()["cfg"]
    plan = from_segments(segments, cfg.n_layers, "yours")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(tracing.param_dtype("mixed"))
    try:
        with torch.device("cuda"):
            net = Llama(cfg)
    finally:
        torch.set_default_dtype(old)
    for p in net.parameters():
        p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    tokens = torch.randint(0, cfg.vocab, (BATCH, SEQ + 1), device="cuda")
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)
    try:
        recompute.loss_of(net, inputs, targets, "flash", plan, checkpoint).backward()   # warm-up
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        recompute.loss_of(net, inputs, targets, "flash", plan, checkpoint).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - held
    finally:
        del net
        torch.cuda.empty_cache()


def verdict(segments, measured: int, predicted: int, budget: int) -> tuple[str, str]:
    """(status, detail): the measured peak against the CPU-graded prediction (the course's formula,
    which the CPU tracer matches) and the budget."""
    said = (f"{len(segments)} segment(s), {sum(map(len, segments))} layers: measured {measured / 2**20:,.0f} MiB,"
            f" predicted on the CPU {predicted / 2**20:,.0f} MiB, budget {budget / 2**20:,.0f} MiB")
    off = (measured - predicted) / predicted if predicted else float("inf")
    if abs(off) > TOLERANCE:
        return "wrong", f"{said}: {off:+.0%} off the prediction (more than {TOLERANCE:.0%})"
    return "ok", f"{said} ({off:+.1%})"
