"""Chapter 03 at scale: activation bytes per GPU and recompute time for 8B / 70B / 405B.

Bytes come from ``gpumem.memory.recompute_cost`` (proved equal to traces and measurements by
``tests/test_03_*``), and for the tracer's own policies also from fake-tensor traces
(``tracing.trace_fast``, :func:`traced_vs_formula`). Time is FLOPs at a stated share of the
peak of a GPU of ``gpumem.memory.gpus``, re-runs included (hardware, not model, FLOPs). Model states are ZeRO-3's shard on the
GPU count :func:`zero3_gpus` picks.
"""

import textwrap

from gpumem import units
from gpumem.memory import accounting, activations, gpus as gpu_table, models, recompute_cost
from gpumem.timing import compute

MODELS = ("llama-3-8b", "llama-3-70b", "llama-3.1-405b")
PLANS = ("none", "selective", "sac", "every-other", "sqrt", "every-2", "full")
TRACED = ("none", "full", "every-2", "every-other", "selective")
# The two prices of a re-run, by name: recompute_cost.step_flops(..., impl=KEY)
PRICES = recompute_cost.PRICE_NAMES
PRICE_WHO = {"torch": "PyTorch non-reentrant: HF, torchtitan, FSDP",
             "scratch": "DeepSpeed, Megatron, use_reentrant=True, ours"}


def price(model: str = "llama-3-8b", seq: int = 4096, impl: str = "torch", plan: str = "full") -> float:
    """Recompute FLOPs of ``plan`` as a share of forward + backward, priced as ``PRICES[impl]``."""
    return recompute_cost.step_flops(models.get(model), seq, 1, plan, impl)["overhead"]


def price_ranges(names=MODELS, seqs=(4096, 8192), plan: str = "full") -> str:
    """Per model, the lowest and highest share over ``seqs`` under each price, one line each."""
    lines = [f"{plan} recompute, share of forward + backward FLOPs, seq {min(seqs):,}-{max(seqs):,}:"]
    for name in names:
        cells = []
        for impl, label in PRICES.items():
            v = sorted(100 * price(name, s, impl, plan) for s in seqs)
            cells.append(f"{label} {v[0]:.1f}-{v[-1]:.1f} %")
        lines.append(f"  {name:15s} " + ", ".join(cells))
    return "\n".join(lines)


def zero3_gpus(model: str, gpu: str = "h100-80gb", recipe: str = "mixed") -> int:
    """The fewest GPUs, a power of two from 8, on which ZeRO-3's model states and working set take
    at most half of a GPU's usable memory (the other half is for activations)."""
    cfg = models.get(model)
    room = gpu_table.usable(gpu) / 2
    working = int(accounting.zero3_gathered(cfg, recipe))
    n = 8
    while accounting.model_states(cfg.n_params(), recipe, n, 3).total + working > room:
        n *= 2
    return n


def working_set(model: str, recipe: str = "mixed") -> tuple[int, list[tuple[str, int]]]:
    """ZeRO-3's working set (``accounting.zero3_gathered``, defined in chapter 02): its bytes and
    its parts, named as the library names them."""
    ws = accounting.zero3_gathered(models.get(model), recipe)
    return int(ws), list(getattr(ws, "parts", {}).items())


def per_gpu(model: str, seq: int, plan: str, gpu: str = "h100-80gb", gpus: int | None = None,
            mfu: float = compute.MFU) -> dict:
    """One GPU's bytes (ZeRO-3 states + working set + activations) and seconds per sequence."""
    cfg = models.get(model)
    n = gpus or zero3_gpus(model, gpu)
    states = accounting.model_states(cfg.n_params(), "mixed", n, 3).total
    working = int(accounting.zero3_gathered(cfg, "mixed"))
    acts = recompute_cost.activation_bytes(cfg, seq, 1, plan)["peak"]
    fl = recompute_cost.step_flops(cfg, seq, 1, plan)
    total = states + working + acts
    return {"model": model, "seq": seq, "plan": plan, "gpus": n, "states": states, "working": working,
            "activations": acts, "total": total, "usable": gpu_table.usable(gpu),
            "fits": total <= gpu_table.usable(gpu), "overhead": fl["overhead"],
            "step_seconds": compute.seconds(fl["forward"] + fl["backward"], gpu, mfu),
            "recompute_seconds": compute.seconds(fl["recompute"], gpu, mfu) if fl["recompute"] else 0.0}


def scale_table(names=MODELS, seqs=(4096, 8192), plans=PLANS, gpu: str = "h100-80gb",
                mfu: float = compute.MFU) -> str:
    """Per model, sequence and plan: activation bytes and the GPU's total against what it can
    use, and the seconds one sequence's forward + backward and its recomputation take."""
    g = gpu_table.get(gpu)
    lines = [f"{'model':15s} {'seq':>5s} {'plan':12s} {'activations':>12s} {'per GPU':>10s}  "
             f"{'fits?':7s} {'+FLOPs':>7s} {'fwd+bwd s':>9s} {'recompute s':>11s}"]
    for name in names:
        n = zero3_gpus(name, gpu)
        first = per_gpu(name, seqs[0], plans[0], gpu)
        lines.append(f"{name}: ZeRO-3 over {n} GPUs, states {units.fmt(first['states'])} + working set "
                     f"{units.fmt(first['working'])} per GPU")
        for seq in seqs:
            for plan in plans:
                r = per_gpu(name, seq, plan, gpu, n, mfu)
                lines.append(f"{'':15s} {seq:>5d} {plan:12s} {units.fmt(r['activations']):>12s} "
                             f"{units.fmt(r['total']):>10s}  {'yes' if r['fits'] else 'no':7s} "
                             f"{100 * r['overhead']:>6.1f}% {r['step_seconds']:>9.2f} {r['recompute_seconds']:>11.2f}")
    lines += textwrap.wrap(
        f"micro-batch 1 per GPU, flash attention, bf16; fits: against {units.fmt(gpu_table.usable(g))} "
        f"usable on a {g.label}; working set: what a ZeRO-3 rank holds beyond its shards while it "
        "computes (gathered parameters and a module's full gradient, chapter 02); "
        "fwd+bwd s: one sequence's forward + backward without recompute; "
        f"seconds at {mfu:.0%} of the peak {g.bf16_flops / 1e12:.0f} TFLOP/s, counting every FLOP "
        "run, re-runs included (hardware FLOPs; MFU counts model FLOPs only); +FLOPs priced as the "
        f"{PRICES['torch']} (PyTorch's non-reentrant checkpoint); causal attention counted in full", 100,
        break_on_hyphens=False)
    return "\n".join(lines)


def traced_vs_formula(model: str = "llama-3-8b", seq: int = 4096, policies=TRACED) -> list[dict]:
    """The tracer's policies traced on fake tensors (chapter 01's engine) beside the formula."""
    from gpumem.memory import tracing
    cfg = models.get(model)
    rows = []
    for policy in policies:
        tr = tracing.trace_fast(cfg, "mixed", "flash", policy, seq, 1)
        f = recompute_cost.activation_bytes(cfg, seq, 1, policy)
        rows.append({"policy": policy, "traced": tr.peaks["activations"], "formula": f["peak"],
                     "at": str(tr.peak_moments["activations"]), "layer_peak": f["layer_peak"]})
    return rows


def traced_table(rows: list[dict], model: str = "llama-3-8b", seq: int = 4096) -> str:
    """:func:`traced_vs_formula` as a table, with the layers' share (the peak without the loss)."""
    lines = [f"{model}, seq {seq}: activation peak, traced (fake tensors) and by formula",
             f"{'policy':12s} {'traced':>10s} {'formula':>10s}  {'traced at':28s} {'without the loss':>16s}"]
    for r in rows:
        lines.append(f"{r['policy']:12s} {units.fmt(r['traced'], 'GB', 2):>10s} {units.fmt(r['formula'], 'GB', 2):>10s}  "
                     f"{r['at'][:28]:28s} {units.fmt(r['layer_peak'], 'GB', 2):>16s}")
    return "\n".join(lines)


def selective_table(model: str = "llama-3-8b", seqs=(2048, 8192, 32768)) -> str:
    """What Megatron's selective recomputation buys: the s^2 scores a naive kernel keeps, against
    flash attention, which keeps none; and what re-running the core costs."""
    cfg = models.get(model)
    lines = [f"{model}, micro-batch 1: activation peak by kernel and policy",
             f"{'seq':>6s} {'naive':>10s} {'naive+selective':>16s} {'flash':>10s} {'flash+selective':>16s}"
             f" {'core re-run':>12s}"]
    for seq in seqs:
        v = {(k, p): activations.activations(cfg, seq, 1, k, p).peak
             for k in ("naive", "flash") for p in ("none", "selective")}
        fl = recompute_cost.step_flops(cfg, seq, 1, "selective")
        lines.append(f"{seq:>6d} {units.fmt(v['naive', 'none']):>10s} {units.fmt(v['naive', 'selective']):>16s} "
                     f"{units.fmt(v['flash', 'none']):>10s} {units.fmt(v['flash', 'selective']):>16s} "
                     f"{100 * fl['overhead']:>11.1f}%")
    lines.append("core re-run: attention's QK^T and PV once more, as a share of forward + backward FLOPs")
    return "\n".join(lines)
