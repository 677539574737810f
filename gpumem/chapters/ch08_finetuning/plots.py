"""Chapter 08's figure: one GPU's bytes by role for each fine-tuning recipe, side by side (one bar
per role and one for the total, not stacked: on the log axis that full fine-tuning and QLoRA need,
25x apart, a stacked segment's height would not be its size), against the four cards' usable
bytes (horizontal lines, labelled outside the plot)."""

from gpumem.course.drawing import show_figures as show  # noqa: F401  (notebooks call plots.show)
from gpumem.memory import models

from . import scale

GB = 1e9
GROUPS = {"base weights + NF4 constants": ("base_weights", "quant_constants"),
          "gradients": ("grads",), "fp32 master": ("master",),
          "optimizer (moments, scales, steps)": ("optimizer_moments", "optimizer_scales", "step_counters"),
          "adapters": ("adapter_weights",), "dequantised buffer": ("dequant_buffer",)}


def _columns(cfg, checkpoint: str) -> list[tuple[str, dict]]:
    """(label, bytes) per recipe: the GPU-only recipes by role (with the 8-bit no-master run after
    8-bit AdamW), then the rows with the base on the CPU: ``gpu_states`` and ``host``."""
    out = []
    for label, ft in scale.RECIPES.items():
        out.append((label, scale.need(cfg, ft, checkpoint)))
        if label == "full, 8-bit AdamW":
            out.append(("full, 8-bit, no master", scale.need(cfg, scale.NO_MASTER, checkpoint)))
    for label, ft in scale.OFFLOAD.items():
        o = scale.base_offloaded(cfg, ft, checkpoint)
        out.append((label, {"roles": {}, "gpu_states": o["states"], "activations": o["activations"],
                            "total": o["gpu"], "host": o["host"]}))
    return out


def by_role(model: str = "llama-3-70b", checkpoint: str = "full"):
    """Grouped bars (GB, log scale) per recipe: each role group, the activations (peak) and the
    GPU's total, side by side; a role a recipe does not hold has no bar. The rows with the base on
    the CPU show what the GPU keeps (states, activations, total) beside the host RAM they need
    (its own hatch). Each card's usable bytes is a dashed line."""
    import matplotlib.pyplot as plt
    cfg = models.get(model)
    fig, ax = plt.subplots(figsize=(11, 5.2))
    cols = _columns(cfg, checkpoint)
    names = [c[0] for c in cols]
    series = [(label, [sum(n["roles"].get(k, 0) for k in keys) / GB for _, n in cols])
              for label, keys in GROUPS.items()]
    series += [("on the GPU, base on CPU (states)", [n.get("gpu_states", 0) / GB for _, n in cols]),
               ("activations (peak)", [n["activations"] / GB for _, n in cols]),
               ("total on the GPU", [n["total"] / GB for _, n in cols]),
               ("host RAM (base on CPU)", [n.get("host", 0) / GB for _, n in cols])]
    width = 0.9 / len(series)
    hatch = {"total on the GPU": {"color": "none", "edgecolor": "black", "hatch": "//"},
             "host RAM (base on CPU)": {"color": "lightgrey", "edgecolor": "dimgrey", "hatch": ".."}}
    for j, (label, vals) in enumerate(series):
        xs = [i - 0.45 + (j + 0.5) * width for i in range(len(names))]
        kept = [(x, v) for x, v in zip(xs, vals) if v > 0]
        ax.bar([x for x, _ in kept], [v for _, v in kept], width, label=label, **hatch.get(label, {}))
    for card, (clabel, _, _) in scale.CARDS.items():
        y = scale.usable(card) / GB
        ax.axhline(y, color="black", lw=0.8, ls="--")
        ax.annotate(f"{clabel} ({y:.0f} usable)", (1.01, y), xycoords=("axes fraction", "data"),
                    va="center", fontsize=8, annotation_clip=False)
    ax.set_xticks(range(len(names)), [n.replace(", ", ",\n") for n in names], fontsize=8)
    ax.set_xlabel("fine-tuning recipe (one GPU; the last two keep the frozen base in CPU RAM)")
    ax.set_yscale("log")
    ax.set_ylabel("GB (10^9 bytes, log scale)")
    ax.set_title(f"{model}: one GPU's bytes by role, {scale.SEQ} tokens, checkpointing {checkpoint}")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    return fig
