"""Checklist item 1: what ZeRO stages 1, 2 and 3 save, and what they cost in communication.

Numbers drawn per attempt: model, recipe, stage, GPU count, GPU and link. Bytes come from
``gpumem.memory.accounting`` (model states per stage), usable memory from ``gpumem.memory.gpus``,
link speeds (line rates) from ``gpumem.timing.zero3_cost.link_bandwidth`` and DeepSpeed's real
gather volume from ``gpumem.timing.zero3_cost.zero3_step_time`` at that rate.
"""

from gpumem.course.checklist import Item
from gpumem.course.quiz import Choice, Numeric
from gpumem.course.quiz_draws import (LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick,
                                      recipe_numbers)
from gpumem.timing import zero3_cost
from gpumem.memory import accounting, gpus, models
from gpumem.units import GB

from . import pointers as P

SHARDED = {1: "the optimizer states", 2: "the gradients and the optimizer states",
           3: "the parameters, gradients and optimizer states"}
LINKS = {"nvlink": "NVLink inside one node", "inter-node": "network ports, one GPU per node with its own NIC",
         "pcie": "PCIe inside one box (these cards have no NVLink)"}
# Physically possible placements (gpumem.timing.zero3_cost.NODE_OF_GPU): SXM boards (A100, H100,
# H200) have NVLink and eight to a node; the PCIe-only L4 sits eight to a box (g2-l4x8), so a PCIe
# ring is one box of L4s, and 8B is the Llama whose ZeRO-3 states fit eight 24 GB cards.
SXM = ("a100-80gb", "h100-80gb", "h200")
FIT_GPUS = ("a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4")


def _whole_sharded(n: dict, stage: int) -> tuple[int, int]:
    """Bytes per parameter a stage keeps whole and bytes it shards."""
    p, g, o = n["p_bytes"], n["g_bytes"], n["o_bytes"]
    return {1: (p + g, o), 2: (p, g + o), 3: (0, p + g + o)}[stage]


def states(n: dict, stage: int, gpus_: int) -> int:
    """Per-GPU model-state bytes for the drawn model and recipe (the library's accounting)."""
    return accounting.model_states(n["n_params"], n["recipe_name"], gpus_, stage).total


def _saving(rng) -> dict:
    stage = pick(rng, (1, 2, 3))
    n = (model_numbers(pick(rng, LLAMAS)) | recipe_numbers(pick(rng, ("pure-bf16", "mixed", "mixed-ds")))
         | {"stage": stage, "gpus": pick(rng, (4, 8, 16, 64)), "sharded": SHARDED[stage]})
    whole, sharded = _whole_sharded(n, stage)
    return n | {"whole": whole, "shard_b": sharded,
                "after": states(n, stage, n["gpus"]) / n["n_params"],
                "limit": (f"stage {stage} can never cut them by more than {n['bytes_per_param']} / {whole} "
                          f"= {n['bytes_per_param'] / whole:.0f}x" if whole else
                          "stage 3 has no such limit: it divides every byte by the GPU count")}


def _limit(rng) -> dict:
    n = recipe_numbers(pick(rng, ("pure-bf16", "mixed", "mixed-ds"))) | {"stage": pick(rng, (1, 2))}
    psi = models.get("llama-3-8b").n_params()
    whole, sharded = _whole_sharded(n, n["stage"])
    plain = accounting.model_states(psi, n["recipe_name"], 1, 0).total
    best = accounting.model_states(psi, n["recipe_name"], psi, n["stage"]).total   # a 1-element shard
    return n | {"whole": whole, "shard_b": sharded, "sharded": SHARDED[n["stage"]],
                "limit_x": round(plain / best, 4)}


def _saving_pct(n: dict) -> float:
    return 100 * (1 - states(n, n["stage"], n["gpus"]) / states(n, 0, n["gpus"]))


def fewest(n: dict, stage: int, limit: int = 4096) -> int | None:
    """The fewest GPUs whose per-GPU model states under ``stage`` fit the usable bytes (None: never)."""
    if states(n, stage, limit) > n["usable"]:
        return None
    lo, hi = 1, limit
    while lo < hi:                       # states shrink as GPUs are added
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if states(n, stage, mid) <= n["usable"] else (mid + 1, hi)
    return lo


def _fewest(rng) -> dict:
    while True:
        n = (model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, FIT_GPUS))
             | recipe_numbers(pick(rng, ("pure-bf16", "mixed", "mixed-ds"))) | {"stage": pick(rng, (1, 2))})
        got = fewest(n, n["stage"])
        if got is not None and got > 1:
            whole, sharded = _whole_sharded(n, n["stage"])
            return n | {"fewest": got, "whole": whole, "shard_b": sharded, "sharded": SHARDED[n["stage"]],
                        "whole_gb": whole * n["n_params"] / GB, "shard_gb": sharded * n["n_params"] / GB,
                        "z3": fewest(n, 3)}


def _comm(rng) -> dict:
    while True:                          # a run whose ZeRO-3 states fit: 16 B / param over the GPUs
        link = pick(rng, tuple(LINKS))
        gpu = "l4" if link == "pcie" else pick(rng, SXM)
        n = model_numbers("llama-3-8b" if link == "pcie" else pick(rng, LLAMAS)) | gpu_numbers(gpu)
        n |= {"gpus": 8 if link in ("nvlink", "pcie") else pick(rng, (8, 16, 32, 64)), "link": link,
              "tokens": pick(rng, (4096, 8192, 16384))}
        if states(n | recipe_numbers("mixed"), 3, n["gpus"]) < n["usable"]:
            break
    bw = zero3_cost.link_bandwidth(gpus.get(n["gpu_name"]), n["link"])
    ring = (n["gpus"] - 1) / n["gpus"]
    ds = zero3_cost.zero3_step_time(n["model_name"], n["gpus"], n["gpu_name"], bw)   # at the stated rate
    return n | {"link_words": LINKS[n["link"]], "bw_gb": bw / GB, "ring": ring,
                "zero2_s": 2 * 2 * n["n_params"] * ring / bw, "ds_s": ds["comm_s"],
                "ds_psi": ds["gathered_psi"] + 1}


def _comm_seconds(n: dict) -> float:
    bw = zero3_cost.link_bandwidth(gpus.get(n["gpu_name"]), n["link"])
    return 3 * 2 * n["n_params"] * (n["gpus"] - 1) / n["gpus"] / bw


QUESTIONS = [
    Numeric("zero-saving",
            "{model} ({n_params:,} parameters) trains with {recipe}, data parallel over {gpus} GPUs. "
            "ZeRO-{stage} shards {sharded} over the GPUs. By what percentage does one GPU's "
            "model-state memory (weights, gradients, optimizer states) shrink compared with plain "
            "data parallelism, where every GPU holds everything?",
            answer=_saving_pct, unit="%", rel_tol=0.002, abs_tol=0.05,
            hint="Count the bytes per parameter of each part. Which of them does stage {stage} "
                 "divide by {gpus}, and which stay whole on every GPU?",
            explanation="Every GPU of plain data parallelism keeps {p_bytes} + {g_bytes} + {o_bytes} = "
                        "{bytes_per_param} B per parameter. ZeRO-{stage} keeps {whole} B whole and "
                        "{shard_b}/{gpus} B of a shard: {after:.3f} B, {answer} % less. However many GPUs "
                        "are added, {limit}.",
            traps=((lambda n: 100 * (1 - 1 / n["gpus"]), "that is 1 - 1/N, ZeRO-3's saving: only stage 3 "
                                                         "divides every byte by the GPU count."),),
            draw=_saving),
    Numeric("zero-fewest",
            "{model} ({n_params:,} parameters) trains with {recipe}, under ZeRO-{stage}, which shards "
            "{sharded}. Each {gpu} has {usable:,} bytes usable. What is the fewest GPUs with which "
            "every GPU's model states fit (activations aside)?",
            answer=lambda n: n["fewest"], unit="GPUs", rel_tol=0.0,
            hint="Some bytes per parameter are not divided by the GPU count at stage {stage}. Subtract "
                 "them from the usable bytes first; then see how many GPUs the rest needs.",
            explanation="{whole} B per parameter stay whole: {whole_gb:.1f} GB on every GPU. The "
                        "{shard_b} B per parameter that are sharded ({shard_gb:.1f} GB in all) must fit "
                        "in what is left, {usable_gb:.1f} - {whole_gb:.1f} GB, so {answer} GPUs. ZeRO-3, "
                        "which divides everything, would need {z3}.",
            traps=((lambda n: n["z3"], "that divides every byte by the GPU count, which only ZeRO-3 "
                                       "does. At stage {stage} the whole part stays on each GPU."),),
            draw=_fewest),
    Numeric("zero3-comm-seconds",
            "{model} ({n_params:,} parameters) trains with standard mixed precision (bf16 weights "
            "and gradients, fp32 master weights and AdamW moments) under ZeRO-3 on {gpus} {gpu}s, "
            "{tokens:,} tokens per GPU per step, no gradient accumulation. The GPUs form one NCCL "
            "ring over {link_words}, {bw_gb:.1f} GB/s per direction. How many seconds per step does "
            "one GPU spend sending ZeRO-3's collectives, if none of it overlaps with compute?",
            answer=_comm_seconds, unit="s", rel_tol=0.01,
            hint="How many times per step does every weight (or its gradient) cross the ring under "
                 "stage 3, and what share of each collective does one GPU send?",
            explanation="3 x 2 B x {n_params:,} x {ring:.4f} / {bw_gb:.1f} GB/s = {answer} s. ZeRO-1 "
                        "and ZeRO-2 move what plain data parallelism moves, a reduce-scatter and an "
                        "all-gather ({zero2_s:.3f} s): ZeRO-3 adds the second gather, 1.5x. DeepSpeed's "
                        "real schedule keeps a few weights whole ({ds_psi:.3f} psi per step): "
                        "{ds_s:.3f} s.",
            traps=((lambda n: n["zero2_s"], "that is two collectives, ZeRO-2's traffic. ZeRO-3 freed "
                                            "the weights after forward and must gather them again."),
                   (lambda n: n["expected"] / n["ring"], "each GPU sends (N-1)/N of a collective's "
                                                         "bytes in a ring, not all of them."),
                   (lambda n: n["expected"] * 8 / 6, "the reduce-scatter carries the bf16 gradients; "
                                                     "the fp32 copies stay with each GPU's shard."),
                   (lambda n: n["expected"] * 16 / 6, "the optimizer states never travel: each GPU "
                                                      "updates its own shard.")),
            draw=_comm),
    Choice("zero1-vs-zero2",
           "Two runs train the same model with the same recipe on the same 8 GPUs; one uses ZeRO-1, "
           "the other ZeRO-2. Which statement is true?",
           ["ZeRO-2 sends about half the bytes per step that ZeRO-1 sends",
            "ZeRO-2 adds an all-gather of the gradients to every step",
            "Backward's memory peak is the same under both stages",
            "ZeRO-2 holds less gradient memory during backward"],
           answer=3,
           hint="Where does each stage reduce-scatter the gradients: at the optimizer step, or "
                "during backward as each bucket fills?",
           explanation="ZeRO-1 reduce-scatters at the optimizer step, so every full gradient exists "
                       "at the end of backward; ZeRO-2 reduce-scatters bucket by bucket during "
                       "backward and keeps only its shard. Both issue one reduce-scatter and one "
                       "all-gather of the weights per step: the same bytes as DDP's all-reduce."),
    Numeric("zero-limit",
            "A model trains with {recipe}, under ZeRO-{stage}, which shards {sharded}. However many "
            "GPUs are added, at most by what factor can ZeRO-{stage} divide one GPU's model states "
            "(against plain data parallelism)?",
            answer=lambda n: n["limit_x"], unit="x", rel_tol=0.001,
            hint="As the GPU count grows, the sharded part of each GPU's bytes goes to nothing. What "
                 "is left?",
            explanation="Plain data parallelism keeps {p_bytes} + {g_bytes} + {o_bytes} = "
                        "{bytes_per_param} B per parameter on every GPU. ZeRO-{stage} keeps {whole} B of "
                        "them whole, and the shard of the other {shard_b} B shrinks towards zero: "
                        "{bytes_per_param} / {whole} = {answer}x at best. Only ZeRO-3 divides by the "
                        "GPU count itself.",
            traps=((lambda n: n["bytes_per_param"] / (n["p_bytes"] + n["g_bytes"]) if n["stage"] == 2
                    else n["bytes_per_param"] / n["p_bytes"],
                    "that is the other stage's limit: ZeRO-{stage} shards {sharded}."),),
            draw=_limit),
]

ITEM = Item("zero", "What ZeRO-1, -2 and -3 save, and what they cost in communication", QUESTIONS, {
    "zero-saving": (P.WHO_HOLDS,),
    "zero-fewest": (P.ZERO_PROBLEM, P.WHO_HOLDS),
    "zero3-comm-seconds": (P.COLLECTIVES, P.ZERO3_TIME),
    "zero1-vs-zero2": (P.ZERO12_PEAK,),
    "zero-limit": (P.WHO_HOLDS, P.RECIPES),
})
