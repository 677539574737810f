"""Chapter 02's figure: the ZeRO-3 gather/release timeline from a recorded run."""

from gpumem.course.drawing import show_figures as show  # noqa: F401  (notebooks call plots.show)

COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "step": "#55a868"}


def gather_timeline(events: list[dict], step: int = 1):
    """Event order on x (not time), parameter on y. An all-gather is a dot coloured by the pass it
    serves (forward blue, backward orange), hollow when it was issued during the other pass (a
    prefetch across the turn from forward to backward); the persistent norms' all-gather after
    the optimizer step is a green square; releases are grey crosses. Shaded bands show which
    pass issued the events."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    rows = [e for e in events if e["step"] == step and e["event"] != "fetch"]
    params = []
    for e in rows:
        for p in e["params"]:
            if p not in params:
                params.append(p)
    fig, ax = plt.subplots(figsize=(11, max(4, 0.24 * len(params))))
    spans: dict[str, list[int]] = {}
    for x, e in enumerate(rows):
        spans.setdefault(e["phase"], []).append(x)
        for p in e["params"]:
            y = params.index(p)
            if e["event"] == "release":
                ax.scatter(x, y, marker="x", color="grey", s=16, linewidths=1)
            elif e["phase"] == "step":
                ax.scatter(x, y, marker="s", s=22, color=COLOURS["step"])
            else:
                serves = max(("forward", "backward"), key=lambda ph: e["serves"][ph])
                hollow = e["phase"] != serves
                ax.scatter(x, y, marker="o", s=24, facecolors="none" if hollow else COLOURS[serves],
                           edgecolors=COLOURS[serves], linewidths=1.2)
    for phase, xs in spans.items():
        ax.axvspan(min(xs) - 0.5, max(xs) + 0.5, color=COLOURS[phase], alpha=0.07, lw=0)
        ax.text((min(xs) + max(xs)) / 2, -1.6, "optimizer step" if phase == "step" else f"issued in {phase}",
                ha="center", va="center", fontsize=9, color=COLOURS[phase])
    ax.set_yticks(range(len(params)), [p.replace(".weight", "") for p in params], fontsize=8)
    ax.tick_params(axis="x", labelsize=9)
    ax.set_ylim(len(params) - 0.5, -2.5)
    ax.set_xlabel("event number within the step (all-gathers and releases in the order rank 0 issued them; "
                  "not time)", fontsize=10)
    ax.set_ylabel("parameter", fontsize=10)
    ax.set_title(f"ZeRO-3 gathers and releases, step {step}", fontsize=12)
    dot = dict(marker="o", linestyle="none", markersize=7)
    handles = [Line2D([], [], color=COLOURS["forward"], label="gathered for forward", **dot),
               Line2D([], [], color=COLOURS["backward"], label="gathered for backward", **dot),
               Line2D([], [], markerfacecolor="none", markeredgecolor="black", color="black",
                      label="hollow: issued in the other pass", **dot),
               Line2D([], [], marker="s", linestyle="none", color=COLOURS["step"], markersize=7,
                      label="norms gathered after the step"),
               Line2D([], [], marker="x", linestyle="none", color="grey", markersize=7, label="released")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    fig.tight_layout()
    return fig
