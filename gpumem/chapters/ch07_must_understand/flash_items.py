"""Checklist item 4: why FlashAttention saves memory (it never keeps the s x s scores; it keeps
the output and one statistic per row, and recomputes the scores in backward).

Numbers drawn per attempt: model, sequence length and micro-batch. What each kernel keeps per
layer comes from ``gpumem.memory.activations.layer_parts`` (the naive kernel's bf16
probabilities and bool mask, flash's fp32 logsumexp), the same count a test compares with a
fake-tensor trace.
"""

from gpumem.course.checklist import Item
from gpumem.course.quiz import Choice, Numeric
from gpumem.course.quiz_draws import LLAMAS, model_numbers, pick
from gpumem.memory import models
from gpumem.memory.activations import layer_parts
from gpumem.units import GB, GiB

from . import pointers as P

QUADRATIC = ("causal mask (bool)", "probabilities")     # the naive kernel's s x s tensors


def _parts(model: str, seq: int, mb: int, kernel: str) -> dict:
    return layer_parts(models.get(model), seq, mb, kernel, 2)


def _probs(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, (2048, 4096, 8192, 16384)), "mb": pick(rng, (1, 2))}
    probs = _parts(n["model_name"], n["seq"], n["mb"], "naive")["probabilities"]
    return n | {"layer_gib": probs / GiB, "all_gib": n["layers"] * probs / GiB}


def _stats(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, (1024, 2048, 4096, 8192, 32768)), "mb": 1}
    naive, flash = (_parts(n["model_name"], n["seq"], 1, k) for k in ("naive", "flash"))
    return n | {"probs_mb": naive["probabilities"] / 2**20, "lse_mb": flash["logsumexp (fp32)"] / 2**20,
                "ratio": naive["probabilities"] / flash["logsumexp (fp32)"]}


def _growth(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, (1024, 2048, 4096)), "mb": 1,
                                            "factor": pick(rng, (2, 4, 8))}
    naive = _parts(n["model_name"], n["seq"], 1, "naive")
    longer = _parts(n["model_name"], n["factor"] * n["seq"], 1, "naive")
    quad = sum(naive[k] for k in QUADRATIC)
    flash = sum(_parts(n["model_name"], n["seq"], 1, "flash").values())
    flash_long = sum(_parts(n["model_name"], n["factor"] * n["seq"], 1, "flash").values())
    return n | {"long_seq": n["factor"] * n["seq"], "lin_gb": (sum(naive.values()) - quad) / GB,
                "quad_gb": quad / GB, "growth": sum(longer.values()) / sum(naive.values()),
                "flash_growth": flash_long / flash, "long_gb": sum(longer.values()) / GB}


QUESTIONS = [
    Numeric("flash-probs",
            "{model} ({layers} layers, d_model {d_model:,}, {heads} query heads and {kv_heads} "
            "key/value heads) trains in bf16 on sequences of {seq:,} tokens, micro-batch {mb}. A "
            "naive attention kernel keeps the softmax probabilities (one per query, key and head) in "
            "bf16 for backward. How many GiB do they take, summed over all layers?",
            answer=lambda n: n["all_gib"], unit="GiB", rel_tol=0.01,
            hint="One probability per pair of positions, for every query head and sequence; 2 bytes "
                 "each; then all the layers.",
            explanation="{heads} x {seq:,}^2 x {mb} x 2 B = {layer_gib:.2f} GiB per layer, x {layers} = "
                        "{answer} GiB. Grouped-query attention shares K and V between query heads, but "
                        "every query head has its own scores. A flash kernel keeps none of this.",
            traps=((lambda n: n["all_gib"] * n["kv_heads"] / n["heads"],
                    "that counts key/value heads. Each of the {heads} query heads has its own scores."),
                   (lambda n: 2 * n["all_gib"], "the probabilities are kept in bf16 here, 2 bytes each."),
                   (lambda n: n["layer_gib"], "that is one layer; every layer keeps its own.")),
            draw=_probs),
    Numeric("flash-stats",
            "{model} ({heads} query heads) at sequence {seq:,}, micro-batch 1. A naive kernel keeps "
            "each layer's bf16 softmax probabilities for backward. FlashAttention keeps instead, per "
            "query position and head, one fp32 number: the log of the row's softmax denominator. How "
            "many times fewer bytes is that?",
            answer=lambda n: n["ratio"], unit="x", rel_tol=0.001,
            hint="For one head, how many numbers does each keep as the sequence grows: one per pair "
                 "of positions, or one per position? Then mind the bytes each number takes.",
            explanation="Per layer {probs_mb:,.1f} MiB of probabilities against {lse_mb:,.2f} MiB of "
                        "statistics: s^2 x 2 B against s x 4 B, a factor s / 2 = {answer}. The first "
                        "grows with the square of the sequence, the second linearly. Backward "
                        "recomputes the scores block by block from Q, K and these statistics.",
            traps=((lambda n: 2 * n["ratio"], "the statistic is fp32 (4 bytes), the probabilities bf16 "
                                              "(2 bytes)."),),
            draw=_stats),
    Numeric("flash-growth",
            "{model}, micro-batch 1, naive attention, bf16. At sequence {seq:,} one layer keeps "
            "{lin_gb:.4f} GB that grows in proportion to the sequence (inputs, q, k, v, MLP tensors) "
            "and {quad_gb:.4f} GB that grows with its square (the probabilities and the causal "
            "mask). By what factor does one layer's saved memory grow at sequence {long_seq:,}?",
            answer=lambda n: n["growth"], unit="x", rel_tol=0.005,
            hint="Scale each part by its own power of {factor}, add them, and divide by today's total.",
            explanation="({factor} x {lin_gb:.4f} + {factor}^2 x {quad_gb:.4f}) / ({lin_gb:.4f} + "
                        "{quad_gb:.4f}) = {answer}x, to {long_gb:.2f} GB per layer. With a flash kernel "
                        "nothing is quadratic and the same layer grows {flash_growth:.2f}x.",
            traps=((lambda n: n["factor"], "that is the flash kernel's growth. Here part of the memory "
                                           "grows with the square of the sequence."),
                   (lambda n: n["factor"] ** 2, "only part of the layer is quadratic; the rest grows "
                                                "linearly.")),
            draw=_growth),
    Choice("flash-kept",
           "Which tensors does FlashAttention's forward save for its backward pass, per layer?",
           ["Q, K, V, the output and every tile's probabilities in fp8",
            "Q, K, V and the scores of the tiles on the diagonal",
            "Q, K and the output; V is rebuilt from the layer input",
            "Q, K, V, the output and one fp32 number per row and head"],
           answer=3,
           hint="Backward must rebuild the probabilities tile by tile. What is the least it needs "
                "to do that exactly?",
           explanation="With Q and K it recomputes the scores of a tile, and with the saved per-row "
                       "log-sum-exp it turns them into exact probabilities without a second pass over "
                       "the row; V and the output give the gradients. Nothing s x s is stored, "
                       "compressed or not, and V is kept: the extra memory is O(s) per head, the fp32 "
                       "log-sum-exp of each query row."),
    Choice("flash-faster",
           "For non-causal attention (no mask), FlashAttention's backward does more FLOPs than a "
           "naive kernel's, since it recomputes the scores, yet the attention step usually runs "
           "faster. What explains it?",
           ["It runs the softmax on the tensor cores with the matmuls",
            "It skips the tiles that a causal mask would zero",
            "It moves far fewer bytes between HBM and the chip",
            "It fuses forward and backward into one kernel launch"],
           answer=2,
           hint="What limits a kernel that writes and reads an s x s matrix per head several times?",
           explanation="A naive kernel writes the scores to HBM, reads them for the softmax, writes "
                       "the probabilities, and reads them for P V and again in backward: traffic "
                       "growing with s^2 that keeps the GPU waiting on memory. FlashAttention keeps "
                       "each tile in on-chip SRAM and writes only the output, so it is bound by "
                       "compute instead, and its softmax is exact. The softmax's exponentials run on the "
                       "ordinary cores, not the tensor cores, and forward and backward are separate "
                       "kernels. With a causal mask, as in Llama, it also skips the tiles above the "
                       "diagonal, about half, but this question has no mask."),
]

ITEM = Item("flash", "Why FlashAttention saves memory: no s x s tensor is kept", QUESTIONS, {
    "flash-probs": (P.FLASH_PROBLEM, P.FLASH_SCALE),
    "flash-stats": (P.FLASH_IDEA, P.FLASH_SCALE),
    "flash-growth": (P.FLASH_MEASURED, P.ACTIVATIONS),
    "flash-kept": (P.FLASH_IDEA, P.FLASH_MECHANISM),
    "flash-faster": (P.FLASH_TIME,),
})
