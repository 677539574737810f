"""Chapter 01's figures: activations against sequence length, a traced step's memory timeline,
and the peak's make-up by category (unsharded, or per GPU under ZeRO-3)."""

import matplotlib.pyplot as plt

from gpumem import units
from gpumem.memory import models
from gpumem.memory.activations import activations
from gpumem.memory.policies import KERNELS

COLOURS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868",
           "activations": "#c44e52", "temporaries": "#8172b3", "gathered": "#937860"}
PHASE_SHADE = {"forward": "#f2f2f2", "backward": "#e0e0e0", "optimizer": "#cccccc"}


def _limits(ax, capacity: int | None, usable: int | None) -> None:
    if capacity:
        ax.axhline(capacity / units.GB, color="black", linestyle="--", linewidth=1,
                   label=f"capacity {units.fmt(capacity)}")
    if usable:
        ax.axhline(usable / units.GB, color="black", linestyle=":", linewidth=1,
                   label=f"usable {units.fmt(usable)}")


def peak_bars(breakdowns: dict[str, dict[str, int]], title: str, capacity: int | None = None,
              usable: int | None = None):
    """Stacked bars: bytes per category at each case's peak, in GB, against capacity and usable."""
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = list(breakdowns)
    cats = list(dict.fromkeys(c for b in breakdowns.values() for c in b))
    bottoms = [0.0] * len(labels)
    for cat in cats:
        values = [breakdowns[k].get(cat, 0) / units.GB for k in labels]
        ax.bar(labels, values, bottom=bottoms, color=COLOURS.get(cat), label=cat)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    _limits(ax, capacity, usable)
    ax.set_ylabel("GB (10^9 bytes) at the step's peak")
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def trace_bars(traces: dict, title: str, capacity: int | None = None, usable: int | None = None):
    """:func:`peak_bars` of traced steps: each trace's categories at its total-peak moment."""
    return peak_bars({k: tr.at_total_peak for k, tr in traces.items()}, title, capacity, usable)


def timeline(tl, title: str | None = None, capacity: int | None = None, usable: int | None = None,
             ax=None):
    """A stacked area of bytes per category over one step's operators, phases shaded."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4))
    x = list(range(len(tl)))
    for phase, a, b in tl.spans():
        ax.axvspan(a, b, color=PHASE_SHADE.get(phase, "white"), zorder=0)
        ax.text((a + b) / 2, 1.0, phase, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                fontsize=8)
    cats = list(tl.series)
    ax.stackplot(x, *[[v / units.GB for v in tl.series[c]] for c in cats], labels=cats,
                 colors=[COLOURS.get(c) for c in cats], linewidth=0, zorder=1)
    _limits(ax, capacity, usable)
    ax.set_xlim(0, max(1, len(tl) - 1))
    ax.set_xlabel("operator (in execution order)" + (" - thinned, peaks kept" if len(tl.notes) else ""))
    ax.set_ylabel("GB (10^9 bytes) held")
    ax.set_title(title or tl.label, pad=14)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if fig is not None:
        fig.tight_layout()
    return fig or ax.figure


def timelines(tls: list, title: str, capacity: int | None = None, usable: int | None = None):
    """Several timelines stacked vertically, on one figure (e.g. without and with checkpointing)."""
    fig, axes = plt.subplots(len(tls), 1, figsize=(10, 3.3 * len(tls)), sharex=False)
    for ax, tl in zip(axes if len(tls) > 1 else [axes], tls):
        timeline(tl, tl.label, capacity, usable, ax=ax)
    fig.suptitle(title)
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
    ax.set_xlabel("sequence length s, tokens (micro-batch 1)")
    ax.set_ylabel("activation peak, GB (10^9 bytes)")
    ax.set_title(f"{model}: activations by attention kernel (checkpoint {policy})")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
