"""Chapter 01's quiz: bytes per parameter by recipe, what fits a cluster, and where the s^2 term
of attention comes from. Each attempt draws a model, GPUs, recipe or sequence length; every
expected value is computed by the library (``gpumem.memory``) for the numbers drawn."""

import math

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import (LLAMAS, TRAINING_GPUS, UNIT_MIXUP, fitting_recipes, gpu_numbers,
                                      model_numbers, pick, recipe_numbers)
from gpumem.memory import accounting, activations, models
from gpumem.units import GB, GiB

GPU_COUNTS = {"llama-3-8b": (1, 2), "llama-3-70b": (8, 16), "llama-3.1-405b": (32, 64)}


def _budget(rng) -> dict:
    model = pick(rng, LLAMAS)
    n = model_numbers(model) | gpu_numbers(pick(rng, TRAINING_GPUS)) | {"gpus": pick(rng, GPU_COUNTS[model])}
    ratio = n["gpus"] * n["usable"] / n["n_params"]
    return n | {"ratio": ratio, "fits": fitting_recipes(math.floor(ratio))}


def _states(rng) -> dict:
    return model_numbers(pick(rng, LLAMAS)) | recipe_numbers(pick(rng, accounting.RECIPES))


def _states_gb(n: dict) -> float:
    return accounting.model_states(n["n_params"], n["recipe_name"]).total / GB


def _scores(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, (2048, 4096, 8192))}
    cfg = models.get(n["model_name"])
    probs = activations.layer_parts(cfg, n["seq"], 1, "naive", 2)["probabilities"]
    return n | {"probs_gib": probs / GiB, "kv_gib": probs / GiB * n["kv_heads"] / n["heads"]}


QUIZ = Quiz("01_memory_anatomy", [
    Numeric("states-budget",
            "{model} has {n_params:,} parameters. Suppose its model states (weights, gradients, "
            "optimizer states) could be spread perfectly over {gpus} x {gpu}, each with "
            "{usable:,} bytes usable (what it reports, less the course's reserve), and nothing "
            "else needed memory. What is the largest whole number of bytes per parameter the "
            "states may take?",
            answer=lambda n: math.floor(n["gpus"] * n["usable"] / n["n_params"]), unit="bytes",
            rel_tol=0.0,
            hint="Total usable bytes over all GPUs, divided by the parameter count, then rounded "
                 "so that it still fits.",
            explanation="{gpus} x {usable:,} B / {n_params:,} = {ratio:.2f} B per parameter, so at "
                        "most {answer}: {fits}.",
            traps=((lambda n: math.floor(n["gpus"] * n["capacity"] / n["n_params"]),
                    "you used what the GPU reports; part of it never reaches tensors."),
                   (lambda n: math.floor(n["gpus"] * 80 * GB / n["n_params"]),
                    "that is 80 x 10^9 B per GPU, the name on the box; use the usable bytes given."),
                   (lambda n: n["gpus"] * n["usable"] / n["n_params"],
                    "bytes come in whole numbers, and rounding up would not fit: round down.")),
            draw=_budget),
    Numeric("states-gb",
            "{model} has {n_params:,} parameters. Recipe: {recipe}. How many GB (10^9 B) do its "
            "model states take, in one copy (nothing sharded)?",
            answer=_states_gb, unit="GB", rel_tol=0.005,
            hint="Count the bytes per parameter of every copy the recipe keeps (bf16 is 2 B, fp32 "
                 "4 B; AdamW keeps two moments), then multiply by the parameter count.",
            explanation="{p_bytes} + {g_bytes} + {o_bytes} = {bytes_per_param} B per parameter x "
                        "{n_params:,} = {answer} GB.",
            traps=(UNIT_MIXUP,
                   (lambda n: (n["p_bytes"] + n["g_bytes"] + 4) * n["n_params"] / GB,
                    "AdamW keeps two moments, and mixed precision adds an fp32 master copy: count "
                    "each."),
                   (lambda n: n["o_bytes"] * n["n_params"] / GB,
                    "that is the optimizer's part alone; weights and gradients are model states too.")),
            draw=_states),
    Choice("bf16-saving",
           "Moving a model from fp32 training to bf16 mixed precision (fp32 master weights and "
           "moments kept) shrinks its model states by:",
           ["50 %", "25 %", "0 %", "75 %"], answer=2,
           hint="Write both recipes' bytes per parameter: weights, gradients, and what the "
                "optimizer keeps.",
           explanation="fp32 is 4 + 4 + 8 = 16 B/param; mixed keeps an fp32 master, so 2 + 2 + 12 = "
                       "16. The saving is in activations and speed, not in model states."),
    Numeric("gqa-scores",
            "{model} has {heads} query heads and {kv_heads} key/value heads (GQA). With a naive "
            "attention kernel in bf16, micro-batch 1 and sequence length {seq:,}, how many GiB of "
            "attention probabilities does one layer save for backward?",
            answer=lambda n: n["probs_gib"], unit="GiB", rel_tol=0.01,
            hint="One s x s matrix of probabilities per head that computes its own scores, 2 bytes "
                 "per entry.",
            explanation="{heads} heads x {seq:,}^2 x 2 B = {answer} GiB per layer. GQA lets query "
                        "heads share K and V, which shrinks k and v, but every query head still has "
                        "its own scores: counting the {kv_heads} KV heads would give {kv_gib:.3g} GiB.",
            traps=(UNIT_MIXUP,
                   (lambda n: n["kv_gib"],
                    "GQA shares K and V among query heads; does it share the scores?"),
                   (lambda n: 2 * n["probs_gib"], "bf16 is 2 bytes per entry, not 4.")),
            draw=_scores),
    Choice("flash-backward",
           "Backward through attention needs the softmax probabilities P, an s x s matrix per "
           "head. A FlashAttention kernel saved no s x s tensor in its forward. Where does its "
           "backward get P from?",
           ["From HBM, where the forward wrote it",
            "Recomputed tile by tile from q, k and saved row statistics",
            "Approximated from the attention output",
            "It is not needed: the gradient bypasses the softmax"],
           answer=1,
           hint="Memory per head is O(s), yet backward needs every entry of P: storing is not the "
                "only way to have a value.",
           explanation="Flash keeps the output and one logsumexp per head and row; backward "
                       "recomputes S = qk^T and P block by block in on-chip memory. The s^2 term "
                       "of naive attention comes from the kernel, not from the model."),
])
