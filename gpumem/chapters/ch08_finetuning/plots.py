"""Chapter 08's figure: one GPU's bytes by role for each fine-tuning recipe, side by side (one bar
per role and one for the total, not stacked: on the log axis that full fine-tuning and QLoRA need,
25x apart, a stacked segment's height would not be its size), against the four cards' usable
bytes (horizontal lines, labelled outside the plot)."""

import matplotlib.pyplot as plt

from gpumem.course.drawing import show_figures as show  # noqa: F401  (notebooks call plots.show)
from gpumem.memory import models

from . import scale

GB = 1e9
GROUPS = {"base weights + NF4 constants": ("base_weights", "quant_constants"),
          "gradients": ("grads",), "fp32 master": ("master",),
          "optimizer (moments, scales, steps)": ("optimizer_moments", "optimizer_scales", "step_counters"),
          "adapters": ("adapter_weights",), "dequantised buffer": ("dequant_buffer",)}


def by_role(model: str = "llama-3-70b", checkpoint: str = "full"):
    """Grouped bars (GB, log scale) per recipe: each role group, the activations (peak) and the
    total, side by side; a role a recipe does not hold has no bar. Each card's usable bytes is a
    dashed line."""
    cfg = models.get(model)
    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    names = list(scale.RECIPES)
    needs = [scale.need(cfg, ft, checkpoint) for ft in scale.RECIPES.values()]
    series = [(label, [sum(n["roles"][k] for k in keys) / GB for n in needs]) for label, keys in GROUPS.items()]
    series += [("activations (peak)", [n["activations"] / GB for n in needs]),
               ("total", [n["total"] / GB for n in needs])]
    width = 0.9 / len(series)
    for j, (label, vals) in enumerate(series):
        xs = [i - 0.45 + (j + 0.5) * width for i in range(len(names))]
        kept = [(x, v) for x, v in zip(xs, vals) if v > 0]
        ax.bar([x for x, _ in kept], [v for _, v in kept], width, label=label,
               **({"color": "none", "edgecolor": "black", "hatch": "//"} if label == "total" else {}))
    for card, (clabel, _, _) in scale.CARDS.items():
        y = scale.usable(card) / GB
        ax.axhline(y, color="black", lw=0.8, ls="--")
        ax.annotate(f"{clabel} ({y:.0f} usable)", (1.01, y), xycoords=("axes fraction", "data"),
                    va="center", fontsize=8, annotation_clip=False)
    ax.set_xticks(range(len(names)), [n.replace(", ", ",\n") for n in names], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("GB on one GPU (10^9 bytes, log scale)")
    ax.set_title(f"{model}: one GPU's bytes by role, {scale.SEQ} tokens, checkpointing {checkpoint}")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    return fig
