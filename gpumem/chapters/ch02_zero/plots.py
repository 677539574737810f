"""Chapter 02's figure: the ZeRO-3 gather/release timeline from a recorded run."""

import matplotlib.pyplot as plt


def gather_timeline(events: list[dict], step: int = 0):
    """Event order on x, parameter on y: gathers (forward blue, backward orange), releases (grey)."""
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
            else:
                ax.scatter(x, y, marker="o", s=18, color="#4c72b0" if e["phase"] == "forward" else "#dd8452")
    ax.set_yticks(range(len(params)), [p.replace(".weight", "") for p in params], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("event order (all-gathers and releases)")
    ax.set_title(f"ZeRO-3, step {step}: gather forward (blue), gather backward (orange), release (x)")
    fig.tight_layout()
    return fig
