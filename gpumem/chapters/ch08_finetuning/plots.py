"""Chapter 08's figure: one GPU's bytes by role for each fine-tuning recipe, stacked, against the
four cards' usable bytes (log scale: full fine-tuning and QLoRA differ by 25x)."""

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
    """Stacked bars (GB, log scale) per recipe: the role groups and the activations, with each
    card's usable bytes as a horizontal line."""
    cfg = models.get(model)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(scale.RECIPES)
    bottoms = [0.0] * len(names)
    needs = [scale.need(cfg, ft, checkpoint) for ft in scale.RECIPES.values()]
    for label, keys in list(GROUPS.items()) + [("activations (peak)", None)]:
        vals = [(n["activations"] if keys is None else sum(n["roles"][k] for k in keys)) / GB for n in needs]
        ax.bar(names, vals, bottom=bottoms, label=label)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for card, (clabel, _, _) in scale.CARDS.items():
        ax.axhline(scale.usable(card) / GB, color="black", lw=0.8, ls="--")
        ax.text(len(names) - 0.5, scale.usable(card) / GB, f" {clabel}", va="center", fontsize=8)
    ax.set_xlim(-0.5, len(names) + 0.6)
    ax.set_yscale("log")
    ax.set_ylabel("GB on one GPU (10^9 bytes, log scale)")
    ax.set_xlabel("recipe")
    ax.set_title(f"{model}: one GPU's bytes by role, {scale.SEQ} tokens, checkpointing {checkpoint}")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig
