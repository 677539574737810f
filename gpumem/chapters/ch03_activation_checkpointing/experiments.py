"""Chapter 03's experiment, the same code for the notebook and ``python -m gpumem run checkpointing``.

Every plan runs one forward and backward of the same Llama under the memory tracer and the FLOP
counter (``gpumem.memory.recompute_trace.measure``): real CPU tensors for the teaching models
(deepened to 8 layers, so that segment plans differ), fake tensors for Llama-3 sizes. Each
result carries its formula (``gpumem.memory.recompute_cost``) beside the measurement. Teaching
models also compare gradients with the plain step, and run one plan three ways: the
from-scratch ``Checkpoint``, PyTorch's non-reentrant checkpoint and DeepSpeed's.

Activation checkpointing is per rank (every data-parallel rank holds its own micro-batch's
activations), so the experiment runs in one process whatever ``ranks`` says.
"""

import os

from gpumem.errors import UsageError
from gpumem.memory import models, recompute_cost, recompute_trace
from gpumem.memory.recompute_plans import plan as make_plan

PLANS = ("none", "full", "every-2", "every-4", "every-other", "sqrt", "selective", "sac")
TEACHING_DEPTH = 8
IMPLS_COMPARED = ("scratch", "torch", "deepspeed")


def config(model: str = "tiny", layers: int | None = None) -> models.ModelConfig:
    """The model the experiment runs: a registry model, teaching models deepened to 8 layers."""
    cfg = models.get(model)
    depth = layers or (TEACHING_DEPTH if cfg.teaching else cfg.n_layers)
    return models.with_layers(cfg, depth) if depth != cfg.n_layers else cfg


def _row(cfg, m: recompute_trace.Measured, grads_plain=None) -> dict:
    p = make_plan(m.plan, cfg.n_layers)
    f_bytes = recompute_cost.activation_bytes(cfg, m.seq, m.micro_batch, p, m.impl)
    f_flops = recompute_cost.step_flops(cfg, m.seq, m.micro_batch, p, m.impl)
    row = m.as_dict() | {"describe": p.describe(), "segments": [list(s) for s in p.segments],
                         "overhead": m.flops["recompute"] / (m.flops["forward"] + m.flops["backward"]),
                         "formula": {"saved": f_bytes["saved"], "peak": f_bytes["peak"],
                                     "layer_peak": f_bytes["layer_peak"],
                                     "flops": {k: f_flops[k] for k in ("forward", "backward", "recompute")}}}
    if grads_plain is not None and m.grads is not None:
        row["grad_max_abs_diff"] = max(float((a.float() - b.float()).abs().max())
                                       for a, b in zip(m.grads, grads_plain))
    return row


def on_gpu(model: str | None = None, plans=PLANS, seq: int = 2048) -> dict:
    """The plans on the current CUDA device: ``torch.cuda.max_memory_allocated`` above the
    parameters, and seconds per forward+backward step (default: a 1.1 B-parameter Llama)."""
    import torch

    from gpumem.memory import recompute_cuda
    if not torch.cuda.is_available():
        raise UsageError("--device cuda needs a CUDA GPU; none is visible here (accepted: --device cpu)")
    cfg = config(model) if model else recompute_cuda.GPU_1B
    rows = {name: recompute_cuda.cuda_step(cfg, name, seq=seq) for name in plans}
    return {"model": cfg.name, "layers": cfg.n_layers, "seq": seq, "micro_batch": 1, "device": "cuda",
            "n_params": cfg.n_params(), "gpu": rows}


def checkpointing(ranks: int = 1, device: str = "cpu", model: str | None = None, progress: bool = True,
                  layers: int | None = None, seq: int | None = None, micro_batch: int | None = None,
                  plans=PLANS, compare_impls: bool = True) -> dict:
    """Per plan: bytes saved for backward, activation peak, FLOPs of forward, backward and
    recompute, the event trace; with the formula's figures beside them (``device="cuda"``:
    :func:`on_gpu`)."""
    if device == "cuda":
        return on_gpu(model, plans)
    cfg = config(model or "tiny", layers)
    seq = seq or (64 if cfg.teaching else 4096)
    micro_batch = micro_batch or (2 if cfg.teaching else 1)
    for name in plans:
        make_plan(name, cfg.n_layers)          # a bad plan name fails before anything runs
    real = cfg.teaching
    plain = recompute_trace.measure(cfg, "none", seq=seq, micro_batch=micro_batch, keep_grads=real)
    out = {"model": cfg.name, "layers": cfg.n_layers, "seq": seq, "micro_batch": micro_batch,
           "tensors": "real (CPU)" if real else "fake (nothing allocated)", "processes": 1,
           "n_params": cfg.n_params(), "plans": {}}
    for name in plans:
        m = plain if name == "none" else recompute_trace.measure(cfg, name, seq=seq, micro_batch=micro_batch,
                                                                  keep_grads=real)
        out["plans"][name] = _row(cfg, m, plain.grads)
    if real and compare_impls:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        out["implementations"] = {}
        for impl in IMPLS_COMPARED:
            m = recompute_trace.measure(cfg, "every-2", impl, seq=seq, micro_batch=micro_batch, keep_grads=True)
            out["implementations"][impl] = _row(cfg, m, plain.grads)
    return out


def gpu_reading(directory=None) -> str:
    """Each committed GPU run of the 1.1 B probe (``recompute_cuda.GPU_1B``, s 2048, micro-batch
    1) beside the formulas: each plan's peak against the larger of its activation peak and the
    bf16 gradients of every parameter (the two moments a step peaks at), its time against the
    FLOP share of the re-run."""
    from gpumem import units
    from gpumem.course import gpu_results
    from gpumem.memory import recompute_cuda
    cfg, grads = recompute_cuda.GPU_1B, 2 * recompute_cuda.GPU_1B.n_params()
    lines = []
    for run, got in gpu_results.values("03", directory):
        plans = [p for p in ("none", "sac", "full") if f"ch03.peak_above_held_bytes_{p}" in got]
        if "none" not in plans:
            continue
        base = got["ch03.seconds_per_step_none"]
        lines.append(f"{run['gpu']} ({run['date']}), gradients {units.fmt(grads, digits=2)}:")
        for p in plans:
            want = max(recompute_cost.activation_bytes(cfg, 2048, 1, p)["peak"], grads)
            peak, share = got[f"ch03.peak_above_held_bytes_{p}"], recompute_cost.step_flops(cfg, 2048, 1, p)["overhead"]
            lines.append(f"  {p:5s} peak {units.fmt(peak, digits=2)} vs max(activations, gradients) "
                         f"{units.fmt(want, digits=2)} ({peak / want - 1:+.1%}); time "
                         f"{got[f'ch03.seconds_per_step_{p}'] / base - 1:+.0%} vs FLOPs {share:+.0%}")
    return "\n".join(lines) or "no GPU run of chapter 03 is committed"
