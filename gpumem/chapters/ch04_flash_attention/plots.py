"""Chapter 04's figure: measured attention memory against s on log axes, with the s^2 and s laws
and chapter 01's formula for the saved bytes overlaid."""

from gpumem.course.drawing import show_figures

COLOURS = {"naive": "#c44e52", "sdpa": "#4c72b0", "tiled": "#55a868"}
PANELS = (("peak_forward", "peak during forward"), ("peak_backward", "peak during backward"),
          ("saved", "saved for backward"))


def memory_vs_seq(result: dict):
    """Three panels (forward peak, backward peak, saved bytes) against s, one line per method;
    dotted: the s^2 and s laws through each method's last point; x: chapter 01's formula."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), sharey=True)
    for ax, (key, title) in zip(axes, PANELS):
        for method in result["methods"]:
            rows = [r for r in result["rows"] if r["method"] == method]
            s = [r["seq"] for r in rows]
            y = [r[key] / 2**20 for r in rows]
            ax.plot(s, y, "o-", color=COLOURS[method], label=method)
            power = 2 if method == "naive" else 1
            ax.plot(s, [y[-1] * (x / s[-1]) ** power for x in s], ":", color=COLOURS[method],
                    label=f"{method}: s^{power} law" if key == "saved" else None)
            if key == "saved":
                ax.plot(s, [r["formula_saved"] / 2**20 for r in rows], "x", color="black", markersize=8,
                        label="chapter 01 formula" if method == result["methods"][0] else None)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length s (tokens)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("bytes (MiB, log scale)")
    axes[-1].legend(fontsize=8, loc="upper left")
    sh = result["shape"]
    fig.suptitle(f"attention core on the CPU, fp32, {sh['heads']} heads of {sh['head_dim']}, batch 1: "
                 "naive grows as s^2, SDPA and tiled as s", y=1.0)
    fig.tight_layout()
    return fig


def show(fig, alt: str) -> None:
    """Display ``fig`` as a PNG with ``alt`` as its text form (``course.drawing.show_figures``)."""
    show_figures(fig, alt=alt)
