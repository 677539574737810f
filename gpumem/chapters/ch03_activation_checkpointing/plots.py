"""Chapter 03's figures: the recorded event timeline, memory timelines per plan, and the
memory-vs-recompute frontier with the formula's curve over the measured points."""

from gpumem import units
from gpumem.memory import models, recompute_cost
from gpumem.memory.recompute_plans import Plan, first_layers, segments_of
from gpumem.course.drawing import show_figures as show  # noqa: F401  (notebooks call plots.show)

PHASE_COLOURS = {"forward": "#4c72b0", "recompute": "#55a868", "backward": "#dd8452"}
CAT_COLOURS = {"activations": "#c44e52", "temporaries": "#8172b3", "grads": "#dd8452"}


def _y(part: str, n_layers: int) -> float:
    if part.startswith("L") and part[1:].isdigit():
        return int(part[1:])
    return -1 if part == "embed" else n_layers


def event_timeline(result: dict, plans=None):
    """One row per plan: which part runs (y) as FLOPs accumulate (x, time at a fixed share of peak); blue
    forward, green re-run, orange backward. Zero-FLOP re-runs (SAC's pointwise ops) are ticks."""
    import matplotlib.pyplot as plt
    n = result["layers"]
    names = [p for p in result["plans"] if not plans or p in plans]
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.5 * len(names) + 0.6), sharex=True)
    axes = axes if len(names) > 1 else [axes]
    for ax, name in zip(axes, names):
        x = 0.0
        for e in result["plans"][name]["events"]:
            y, w = _y(e["part"], n), e["flops"] / 1e9
            colour = PHASE_COLOURS[e["phase"]]
            if w:
                ax.broken_barh([(x, w)], (y - 0.4, 0.8), color=colour)
            elif e["phase"] == "recompute":
                ax.plot([x, x], [y - 0.4, y + 0.4], color=colour, linewidth=2)
            x += w
        ax.set_yticks([-1, 0, n - 1, n], ["embed", "L0", f"L{n - 1}", "head"], fontsize=7)
        ax.set_ylim(-1.6, n + 0.6)
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=9)
    axes[-1].set_xlabel("GFLOP done so far in the step (time, at a constant FLOP rate)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLOURS.values()]
    axes[0].legend(handles, list(PHASE_COLOURS), ncol=3, fontsize=8, loc="lower right",
                   bbox_to_anchor=(1.0, 1.02))
    fig.suptitle(f"{result['model']}: forward, re-run and backward of each part, in order", y=0.995)
    fig.tight_layout()
    return fig


def memory_timelines(measured: list, title: str):
    """Activation and temporary bytes after every operator of one step, one row per plan."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(measured), 1, figsize=(10, 2.2 * len(measured) + 0.5), sharey=True)
    axes = axes if len(measured) > 1 else [axes]
    for ax, m in zip(axes, measured):
        tl = m.timeline.thinned(2000)
        x = list(range(len(tl)))
        cats = ("activations", "temporaries")
        ax.stackplot(x, *[[v / units.GB for v in tl.series[c]] for c in cats], labels=cats,
                     colors=[CAT_COLOURS[c] for c in cats], linewidth=0)
        for phase, a, b in tl.spans():
            if phase == "recompute":
                ax.axvspan(a, b, color=PHASE_COLOURS["recompute"], alpha=0.15, linewidth=0)
        ax.set_xlim(0, max(1, len(tl) - 1))
        fwd_end = next((b for phase, _, b in tl.spans() if phase == "forward"), 0)
        total = [sum(tl.series[c][i] for c in cats) for i in range(fwd_end + 1)]
        if total:        # the spike at the end of the forward: the loss's logits and their copies
            top = max(range(len(total)), key=total.__getitem__)
            ax.annotate("loss: logits, fp32 copy, log-softmax", (top, total[top] / units.GB),
                        xytext=(-8, -4), textcoords="offset points", ha="right", va="top", fontsize=7,
                        arrowprops={"arrowstyle": "->", "lw": 0.6})
        ax.set_ylabel("GB", fontsize=8)
        ax.set_title(f"checkpoint {m.plan}: activation peak {units.fmt(m.peak)}", fontsize=9, loc="left")
    axes[0].legend(fontsize=7, loc="upper right")
    thinned = "; thinned, the fullest kept" if measured and len(measured[0].timeline) > 2000 else ""
    axes[-1].set_xlabel(f"PyTorch operations in the order they ran: forward, then backward (green: re-runs){thinned}")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _curve(cfg: models.ModelConfig, seq: int, batch: int, plans: list[Plan], scale: float):
    pts = [(100 * recompute_cost.step_flops(cfg, seq, batch, p)["overhead"],
            recompute_cost.activation_bytes(cfg, seq, batch, p)["peak"] / scale) for p in plans]
    return zip(*sorted(pts))


def frontier_panel(ax, cfg: models.ModelConfig, seq: int, batch: int, points: dict, unit: str, title: str):
    """Measured or traced points (plan -> (overhead share, peak bytes)) over the formula's two
    families: segments of K layers (K = 1..n) and the first c layers checkpointed (c = 0..n)."""
    scale = units.UNITS[unit]
    n = cfg.n_layers
    seg = [Plan(f"every-{k}", n, segments_of(k, n)) for k in range(1, n + 1)]
    first = [first_layers(c, n) for c in range(n + 1)]
    ax.plot(*_curve(cfg, seq, batch, first, scale), color="grey", linestyle="--", linewidth=1,
            label="formula: first c layers checkpointed")
    ax.plot(*_curve(cfg, seq, batch, seg, scale), color="black", linestyle=":", linewidth=1,
            label="formula: segments of K layers")
    for name, (share, peak) in points.items():
        ax.scatter(100 * share, peak / scale, s=30, zorder=3)
        ax.annotate(name, (100 * share, peak / scale), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("recompute FLOPs, % of forward + backward")
    ax.set_ylabel(f"activation peak, {unit}")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def frontier(small: tuple, large: tuple):
    """Two panels, each ``(cfg, seq, batch, points, unit, title)``: peak activation memory against
    recompute FLOPs for every plan, with the formula's curves."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, panel in zip(axes, (small, large)):
        frontier_panel(ax, *panel)
    fig.suptitle("What each plan buys: activation peak against recompute (lower left is better)")
    fig.tight_layout()
    return fig
