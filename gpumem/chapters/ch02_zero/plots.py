"""Chapter 02's figure: the ZeRO-3 gather/release timeline from a recorded run."""

import matplotlib.pyplot as plt

COLOURS = {"forward": "#4c72b0", "backward": "#dd8452"}


def gather_timeline(events: list[dict], step: int = 1):
    """Event order on x, parameter on y: each all-gather coloured by the phase it serves (forward
    blue, backward orange; hollow when issued in another phase, i.e. prefetched across the turn),
    releases as grey crosses."""
    rows = [e for e in events if e["step"] == step and e["event"] != "fetch"]
    params = []
    for e in rows:
        for p in e["params"]:
            if p not in params:
                params.append(p)
    fig, ax = plt.subplots(figsize=(10, max(3, 0.18 * len(params))))
    for x, e in enumerate(rows):
        for p in e["params"]:
            y = params.index(p)
            if e["event"] == "release":
                ax.scatter(x, y, marker="x", color="grey", s=14)
                continue
            serves = max(("forward", "backward"), key=lambda ph: e["serves"][ph])
            hollow = e["phase"] != serves
            ax.scatter(x, y, marker="o", s=18, facecolors="none" if hollow else COLOURS[serves],
                       edgecolors=COLOURS[serves])
    ax.set_yticks(range(len(params)), [p.replace(".weight", "") for p in params], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("event order in the step (all-gathers and releases, rank 0)")
    ax.set_ylabel("parameter")
    ax.set_title(f"ZeRO-3, step {step}: gathered for forward (blue) or backward (orange); "
                 "hollow = prefetched in the other phase; x = released")
    fig.tight_layout()
    return fig
