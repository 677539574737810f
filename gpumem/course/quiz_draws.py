"""What chapter quizzes draw their numbers from: models, GPUs and recipes, described the way a
question needs them, every figure read from the engine (``gpumem.memory``).

Chapters share these so that a question about 70B on 8 H100s uses the same capacity, usable
bytes and parameter count as the chapter's text, whichever chapter asks it.
"""

import random

from ..memory import accounting, gpus, models
from ..units import GB, GiB, MiB

LLAMAS = ("llama-3-8b", "llama-3-70b", "llama-3.1-405b")
TRAINING_GPUS = ("a100-40gb", "a100-80gb", "h100-80gb", "h200")

# How each recipe is said in a question: what it keeps, in which dtype, never its byte count.
RECIPE_WORDS = {
    "pure-bf16": "everything in bf16: weights, gradients and both AdamW moments, no other copy",
    "mixed": "standard mixed precision: bf16 weights and gradients; AdamW keeps fp32 master "
             "weights and fp32 moments",
    "mixed-ds": "mixed precision with fp32 gradients: bf16 weights; gradients, master weights "
                "and AdamW's moments in fp32",
    "fp32": "no mixed precision: weights, gradients and AdamW's moments all in fp32",
}


def label(model: str) -> str:
    """How people write a registry model: ``'llama-3.1-405b'`` -> ``'Llama-3.1-405B'``."""
    return "Llama" + model.removeprefix("llama").upper()


def model_numbers(model: str) -> dict:
    """A registry model's figures for a question: label, parameter count, layers, heads."""
    cfg = models.get(model)
    return {"model_name": model, "model": label(model), "n_params": cfg.n_params(),
            "layers": cfg.n_layers, "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads,
            "d_model": cfg.d_model}


def gpu_numbers(name: str) -> dict:
    """A GPU's figures for a question: label, what it reports (MiB, bytes), usable bytes."""
    g = gpus.get(name)
    usable = gpus.usable(g)
    return {"gpu_name": name, "gpu": g.label, "mib": g.capacity // MiB, "capacity": g.capacity,
            "capacity_gb": g.capacity / GB, "capacity_gib": g.capacity / GiB,
            "usable": usable, "usable_gb": usable / GB, "reserve": gpus.DEFAULT_RESERVE.describe()}


def recipe_numbers(name: str) -> dict:
    """A recipe's words for a question and its bytes per parameter for the explanation."""
    r = accounting.recipe(name)
    return {"recipe_name": name, "recipe": RECIPE_WORDS[name], "bytes_per_param": r.total,
            "p_bytes": r.params, "g_bytes": r.grads, "o_bytes": r.optimizer_bytes}


def pick(rng: random.Random, options):
    """One of ``options``, drawn from the quiz's generator."""
    return rng.choice(list(options))


def fitting_recipes(bytes_per_param: float) -> str:
    """Which recipes' model states fit a budget of bytes per parameter, as a sentence."""
    fit = [f"{n} ({r.total} B)" for n, r in accounting.RECIPE.items() if r.total <= bytes_per_param]
    miss = [f"{n} ({r.total} B)" for n, r in accounting.RECIPE.items() if r.total > bytes_per_param]
    parts = []
    if fit:
        parts.append(", ".join(fit) + (" fits" if len(fit) == 1 else " fit"))
    if miss:
        parts.append(", ".join(miss) + (" does not" if len(miss) == 1 else " do not"))
    return "; ".join(parts)


def _in_the_other_unit(n: dict) -> float:
    sizes = {"GB": GB, "GiB": GiB}
    other = {"GB": "GiB", "GiB": "GB"}.get(n["unit"])
    return n["expected"] * sizes[n["unit"]] / sizes[other] if other else float("nan")


# A trap for a GB/GiB mix-up: the right bytes, written as a number of the other unit.
UNIT_MIXUP = (_in_the_other_unit,
              "that is the right size in the other unit (GB = 10^9 B, GiB = 2^30 B); write the "
              "unit with your number and it is converted.")
