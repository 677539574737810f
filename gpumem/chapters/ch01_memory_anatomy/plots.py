"""Chapter 01's figures: activations against sequence length, a traced step's memory timeline,
and the peak's make-up by category (unsharded, or per GPU under ZeRO-3)."""

from gpumem import units
from gpumem.memory import models
from gpumem.memory.activations import activations
from gpumem.memory.policies import KERNELS
from gpumem.course.drawing import show_figures as show  # noqa: F401  (notebooks call plots.show)

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
    import matplotlib.pyplot as plt
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


def _stack(ax, tl, capacity: int | None = None, usable: int | None = None, shade: bool = True) -> None:
    """Bytes per category over ``tl``'s operators (numbered as in the full step), stacked."""
    x = tl.operators()
    if shade:
        for phase, a, b in tl.spans():
            ax.axvspan(x[a], x[b], color=PHASE_SHADE.get(phase, "white"), zorder=0)
            ax.text((x[a] + x[b]) / 2, 1.0, phase, transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=8)
    cats = list(tl.series)
    ax.stackplot(x, *[[v / units.GB for v in tl.series[c]] for c in cats], labels=cats,
                 colors=[COLOURS.get(c) for c in cats], linewidth=0, zorder=1)
    _limits(ax, capacity, usable)
    ax.set_xlim(x[0], max(x[0] + 1, x[-1]))


def timeline(tl, title: str | None = None, capacity: int | None = None, usable: int | None = None,
             ax=None, zoom_ax=None, points: int = 3000, zoom: str | None = "optimizer"):
    """A stacked area of bytes per category over one step's operators, phases shaded.

    The x axis is the operator's number in the full step; a long step is thinned to about
    ``points`` operators (the fullest of each run kept, so peaks survive). With ``zoom_ax``, the
    ``zoom`` phase is drawn there at full resolution, its y axis cut to that phase's range, so
    that a spike too small for the full scale (the optimizer's workspace) shows.
    """
    import matplotlib.pyplot as plt
    fig = None
    if ax is None:
        fig, (ax, zoom_ax) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    thin = tl.thinned(points) if len(tl) > points else tl
    _stack(ax, thin, capacity, usable)
    ax.set_xlabel("operator number in the step" + (" (thinned: the fullest of each run of "
                                                  f"{-(-len(tl) // points)} drawn)" if thin is not tl else ""))
    ax.set_ylabel("GB (10^9 bytes) held")
    ax.set_title(title or tl.label, pad=14, fontsize=10)
    if zoom_ax is not None and zoom in tl.phases:
        part = tl.window(zoom)
        x = part.operators()
        totals = [part.total(i) / units.GB for i in range(len(part))]
        base = [(part.total(i) - part.series["temporaries"][i]) / units.GB for i in range(len(part))]
        low, high = min(base), max(totals)
        pad = 0.08 * (high - low) or 1.0
        zoom_ax.fill_between(x, low - pad, base, color=COLOURS["optimizer"], linewidth=0, label="states")
        zoom_ax.plot(x, totals, color=COLOURS["temporaries"], linewidth=0.8, label="+ workspace")
        zoom_ax.set_ylim(low - pad, high + pad)
        zoom_ax.set_xlim(x[0], x[-1])
        zoom_ax.set_title(f"{zoom} phase, every operator", fontsize=9)
        zoom_ax.set_xlabel("operator number")
        zoom_ax.set_ylabel("GB held (axis cut)")
        zoom_ax.tick_params(labelsize=7)
        zoom_ax.legend(fontsize=7, loc="upper center")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0) if zoom_ax is None else (0.0, 1.0))
    if fig is not None:
        fig.tight_layout()
    return fig or ax.figure


def timelines(tls: list, title: str, capacity: int | None = None, usable: int | None = None):
    """Several timelines stacked vertically (e.g. without and with checkpointing), each with a
    zoom on its optimizer phase."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(tls), 2, figsize=(12, 3.6 * len(tls)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1]})
    for (ax, zoom_ax), tl in zip(axes, tls):
        timeline(tl, tl.label, capacity, usable, ax=ax, zoom_ax=zoom_ax)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def activations_vs_seq(model: str, seqs=(1024, 2048, 4096, 8192, 16384), policy: str = "none"):
    """Activation peak against sequence length for each attention kernel (log-log), from the
    formula (``activations.activations``), with guide lines proportional to s and to s^2."""
    import matplotlib.pyplot as plt
    cfg = models.get(model)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    curves = {k: [activations(cfg, s, 1, k, policy).peak / units.GB for s in seqs] for k in KERNELS}
    for kernel, ys in curves.items():
        ax.plot(seqs, ys, marker="o", label=f"{kernel} (formula)")
    lo, hi = curves["flash"][0], max(curves["eager"])
    ax.plot(seqs, [lo * s / seqs[0] for s in seqs], color="grey", linestyle="--", linewidth=1,
            label="proportional to s (slope 1)")
    ax.plot(seqs, [hi * (s / seqs[-1]) ** 2 for s in seqs], color="grey", linestyle=":", linewidth=1,
            label="proportional to s^2 (slope 2)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length s, tokens (micro-batch 1; log scale)")
    ax.set_ylabel("activation peak, GB (10^9 bytes; log scale)")
    ax.set_title(f"{model}: activations by attention kernel (checkpoint {policy})")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
