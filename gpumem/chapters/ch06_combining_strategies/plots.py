"""Chapter 06's figures: the ranked plans' per-GPU memory as stacked bars against the usable
bytes, and their step time by term. Both take a ``planner.Result``.

Figures are built with matplotlib's object API (``matplotlib.figure.Figure``), never pyplot: a
pyplot figure sits in pyplot's global registry, where the inline backend's end-of-execution flush
finds it, renders it and closes it. In JupyterLab the planner widget's callbacks and that flush
can run on different kernel threads (ipykernel's subshells), so the flush rendered a figure the
widget was still drawing: bars without axes, title or legend (issue 24, item 1). A ``Figure`` of
our own is seen by nobody else."""

from gpumem.course.drawing import show_figures as show  # noqa: F401  (notebooks call plots.show)

from .diagrams import MEMORY_PARTS, TIME_PARTS


def _short(plan) -> str:
    lay = plan.layout
    off = "" if lay.offload == "none" else f"\noffload {lay.offload}->{lay.device}"
    return f"{lay.recipe} Z{lay.zero} tp{lay.tp} pp{lay.pp} mb{lay.micro_batch}\nckpt {lay.checkpoint} · {lay.attention}{off}"


def memory_bars(result, top: int = 6, ax=None):
    """Stacked horizontal bars: each distinct plan's per-GPU bytes by part (GB), the usable line."""
    from matplotlib.figure import Figure
    plans = result.distinct(top)
    if ax is None:
        ax = Figure(figsize=(9, 0.8 + 0.75 * max(len(plans), 1))).subplots()
    if not plans:
        ax.text(0.5, 0.5, "nothing fits", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("per-GPU memory (GB = 10^9 bytes)")
        return ax.figure
    labels = [_short(p) for p in plans][::-1]
    left = [0.0] * len(plans)
    for part in MEMORY_PARTS:
        vals = [p.memory[part] / 1e9 for p in plans][::-1]
        if any(vals):   # only the parts some bar shows get a legend entry
            ax.barh(labels, vals, left=left, label=part)
            left = [a + b for a, b in zip(left, vals)]
    usable = result.question["usable"] / 1e9
    ax.axvline(usable, color="black", linestyle="--", label=f"usable {usable:.1f} GB")
    ax.set_xlabel("per-GPU memory (GB = 10^9 bytes)")
    ax.set_title(f"{result.question['model']} on {result.question['gpus']} x {result.question['gpu']}: "
                 "fastest plans first (top)")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.figure.tight_layout()
    return ax.figure


def time_bars(result, top: int = 6, ax=None):
    """Stacked horizontal bars: each distinct plan's step time by term (seconds)."""
    from matplotlib.figure import Figure
    plans = result.distinct(top)
    if ax is None:
        ax = Figure(figsize=(9, 0.8 + 0.75 * max(len(plans), 1))).subplots()
    labels = [_short(p) for p in plans][::-1]
    left = [0.0] * len(plans)
    for part in TIME_PARTS:
        vals = [p.time[part] for p in plans][::-1]
        if any(vals):
            ax.barh(labels, vals, left=left, label=part)
            left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel("estimated step time (s)")
    q = result.question
    ax.set_title(f"{q['model']} on {q['gpus']} x {q['gpu']}: where each plan's step time goes")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.figure.tight_layout()
    return ax.figure


FAMILY_MARKERS = {"Megatron-LM": "s", "NeMo": "o", "torchtitan": "^", "Meta": "D"}


def validation_scatter(rows, band: tuple[float, float] | None = None, ax=None):
    """Predicted against published tokens/s of the priced published runs (``planner.validate``
    rows), log-log, with y = x and the band ``band`` (default ``validate.BAND``) around it; one
    marker per framework family; the calibration run ringed. Runs out of scope have no prediction
    and are left out."""
    from matplotlib.figure import Figure
    from gpumem.planner.validate import BAND, CALIBRATION
    band = band or BAND
    if ax is None:
        ax = Figure(figsize=(7.5, 6)).subplots()
    priced = [r for r in rows if r.predicted is not None]
    lo = min(min(r.published, r.predicted) for r in priced) / 2
    hi = max(max(r.published, r.predicted) for r in priced) * 2
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x (prediction = published)")
    ax.fill_between([lo, hi], [lo * band[0], hi * band[0]], [lo * band[1], hi * band[1]], color="grey",
                    alpha=0.25, label=f"{band[0]:.2f}-{band[1]:.2f} x published")
    for fam, marker in FAMILY_MARKERS.items():
        pts = [r for r in priced if r.run.framework.split(" ")[0] == fam]
        if not pts:
            continue
        line = ax.scatter([r.published for r in pts], [r.predicted for r in pts], marker=marker, s=45,
                          label=fam, zorder=3)
        for r in pts:
            if r.run.key == CALIBRATION:
                ax.scatter([r.published], [r.predicted], marker=marker, s=160, facecolors="none",
                           edgecolors=line.get_facecolor(), zorder=3)
                ax.annotate("calibration", (r.published, r.predicted), textcoords="offset points",
                            xytext=(8, -12), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("published tokens/s (whole job)")
    ax.set_ylabel("predicted tokens/s (plan --layout)")
    left_out = len(rows) - len(priced)
    ax.set_title(f"{len(priced)} published runs priced ({left_out} out of scope not shown)")
    ax.legend(fontsize=8, loc="upper left")
    ax.figure.tight_layout()
    return ax.figure
