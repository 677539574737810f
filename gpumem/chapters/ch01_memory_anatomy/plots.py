"""Chapter 01's figures: activations against sequence length, a traced step's peak by category."""

import matplotlib.pyplot as plt

from gpumem import units
from gpumem.memory import models
from gpumem.memory.activations import activations
from gpumem.memory.policies import KERNELS
from gpumem.memory.tracing import CATEGORIES

COLOURS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868",
           "activations": "#c44e52", "temporaries": "#8172b3"}


def trace_bars(traces: dict, title: str, gpu_total: int | None = None):
    """Stacked bars: each trace's categories at its total-peak moment, in GB."""
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = list(traces)
    bottoms = [0.0] * len(labels)
    for cat in CATEGORIES:
        values = [traces[k].at_total_peak[cat] / units.GB for k in labels]
        ax.bar(labels, values, bottom=bottoms, color=COLOURS[cat], label=cat)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    if gpu_total:
        ax.axhline(gpu_total / units.GB, color="black", linestyle="--", label=f"{units.fmt(gpu_total, digits=0)} available")
    ax.set_ylabel("GB (10^9 bytes) at the step's peak")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def activations_vs_seq(model: str, seqs=(1024, 2048, 4096, 8192, 16384), policy: str = "none"):
    """Activation peak against sequence length for each attention kernel (log-log)."""
    cfg = models.get(model)
    fig, ax = plt.subplots(figsize=(7, 4))
    for kernel in KERNELS:
        ax.plot(seqs, [activations(cfg, s, 1, kernel, policy).peak / units.GB for s in seqs],
                marker="o", label=kernel)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (micro-batch 1)")
    ax.set_ylabel("activation peak, GB")
    ax.set_title(f"{model}: activations by attention kernel (checkpoint {policy})")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
