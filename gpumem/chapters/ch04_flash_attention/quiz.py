"""Chapter 04's quiz: what a naive kernel keeps, what FlashAttention keeps instead, how each grows
with s, and what the recomputation costs. Each attempt draws a model, sequence length and batch;
every expected value is computed by the library (``claims``, ``diagrams.online_step``,
``gpumem.memory.attention_flops``, ``gpumem.timing.attention_time``)."""

import math

from gpumem.course.quiz import Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, UNIT_MIXUP, model_numbers, pick
from gpumem.memory import attention_flops, gpus, models
from gpumem.timing import attention_time, compute
from gpumem.units import GB

from . import claims, diagrams

SEQS = (2048, 4096, 8192, 16384)


def _scores(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS), "batch": pick(rng, (1, 2, 4, 8))}
    n["expected"] = claims.scores(n["seq"], n["heads"], n["layers"], n["batch"], 2) / GB
    n["unit"] = "GB"
    return n


def _lse(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS), "batch": pick(rng, (1, 4, 16))}
    n["lse_mb"] = 4 * n["seq"] * n["heads"] * n["batch"] / 1e6
    n["probs_mb"] = claims.scores(n["seq"], n["heads"], 1, n["batch"], 2) / 1e6
    return n


def _growth(rng) -> dict:
    n = {"s1": pick(rng, (1024, 2048)), "k": pick(rng, (2, 4, 8)), "naive_mib": pick(rng, (40, 72, 136, 98)),
         "tiled_mib": pick(rng, (6, 10, 18, 24))}
    n["s2"] = n["s1"] * n["k"]
    return n


def _step(rng) -> dict:
    m = pick(rng, (1, 2, 3, 4))
    n = {"m": m, "l": pick(rng, (1.5, 2.0, 2.5, 3.2)),
         "block": [float(m + d) for d in (pick(rng, (-2, -1, 0)), pick(rng, (1, 2)), pick(rng, (-3, -1)))]}
    n["m_new"], n["l_new"] = diagrams.online_step(n["m"], n["l"], n["block"])
    n["block_text"] = ", ".join(f"{x:g}" for x in n["block"])
    return n


def _dropout(rng) -> dict:
    n = {"seq": pick(rng, (2048, 4096, 8192)), "heads": pick(rng, (2, 4, 8))}
    n["probs_mib"] = claims.scores(n["seq"], n["heads"]) / 2**20
    n["lse_mib"] = 4 * n["seq"] * n["heads"] / 2**20
    return n


def _time(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, (4096, 8192, 16384)), "hfu_pct": pick(rng, (35, 40, 50))}
    cfg = models.get(n["model_name"])
    r = attention_time.roofline("tiled", n["seq"], cfg.n_heads, cfg.head_dim, 1, "h100-80gb", 2, 128,
                                 n["hfu_pct"] / 100)
    g = gpus.get("h100-80gb")
    n |= {"head_dim": cfg.head_dim, "tflops": g.bf16_flops / 1e12, "ms": r["mfu_s"] * 1e3,
          "tflop": r["flops"] / 1e12, "matmul_ms": compute.seconds(6 * cfg.layer_params() * n["seq"], g,
                                                                 n["hfu_pct"] / 100) * 1e3}
    return n


def _recompute(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS)}
    cfg = models.get(n["model_name"])
    naive = attention_flops.attention_flops("naive", n["seq"], cfg.n_heads, cfg.head_dim)
    tiled = attention_flops.attention_flops("tiled", n["seq"], cfg.n_heads, cfg.head_dim)
    n["head_dim"] = cfg.head_dim
    n["extra_t"] = (sum(tiled.values()) - sum(naive.values())) / 1e12
    n["pct"] = 100 * (sum(tiled.values()) / sum(naive.values()) - 1)
    return n


QUIZ = Quiz("04_flash_attention", [
    Numeric("probs-all-layers",
            "{model} ({layers} layers, {heads} query heads, {kv_heads} key/value heads) trains on {batch} "
            "sequence(s) of {seq:,} tokens with a naive attention kernel that keeps the bf16 softmax "
            "probabilities of every layer for backward. How many bytes do those probabilities take in all?",
            answer=lambda n: n["expected"], unit="GB", rel_tol=0.01,
            hint="One s x s matrix per query head, per layer, per sequence, 2 bytes an element. Which "
                 "heads count: the query heads or the key/value heads?",
            explanation="2 x {seq:,}^2 x {heads} x {layers} x {batch} = {answer} GB. Grouped-query attention "
                        "shares K and V among query heads, but each of the {heads} query heads still scores "
                        "every key itself.",
            traps=((lambda n: n["expected"] * n["kv_heads"] / n["heads"],
                    "that counts the key/value heads; every query head has its own scores."),
                   (lambda n: n["expected"] / n["layers"], "that is one layer; every layer keeps its own."),
                   UNIT_MIXUP),
            draw=_scores),
    Numeric("lse-bytes",
            "With FlashAttention, one layer of {model} ({heads} query heads, {kv_heads} key/value heads) keeps "
            "for backward q, k, v, the output, and one more tensor. At {seq:,} tokens and batch {batch}, how "
            "many MB is that extra tensor?",
            answer=lambda n: n["lse_mb"], unit="MB", rel_tol=0.01,
            hint="It replaces the probabilities: what does the backward need, per row, to rebuild "
                 "exp(s - max) / sum exactly? It is kept in fp32.",
            explanation="The logsumexp of each row, fp32, per query head: 4 x {seq:,} x {heads} x {batch} = "
                        "{answer} MB, where the bf16 probabilities would take {probs_mb:,.0f} MB.",
            traps=((lambda n: n["lse_mb"] * n["kv_heads"] / n["heads"],
                    "that is per key/value head; the statistics belong to the query rows of every query head."),
                   (lambda n: n["lse_mb"] * 2, "that keeps the max and the sum separately; one number per row "
                                               "suffices, m + log(l).")),
            draw=_lse),
    Numeric("naive-growth",
            "A naive attention kernel's forward + backward peaks at {naive_mib} MiB above its inputs at s = "
            "{s1:,}, nearly all of it in tensors of s x s elements per head (terms that grow with s^2). "
            "Assuming those terms dominate, predict its peak at s = {s2:,}, in MiB.",
            answer=lambda n: n["naive_mib"] * n["k"] ** 2, unit="MiB", rel_tol=0.02,
            hint="Which tensor dominates the naive kernel's peak, and how does its size depend on s?",
            explanation="The scores and probabilities are s x s: {k}x the length is {k}^2 the bytes, "
                        "{answer} MiB (a little less in a measurement, where the linear terms grow only {k}x). "
                        "A tiled kernel's peak grows {k}x instead.",
            traps=((lambda n: n["naive_mib"] * n["k"], "that is linear growth, the tiled kernel's law; the "
                                                       "naive kernel keeps s x s matrices."),),
            draw=_growth),
    Numeric("recompute-tflop",
            "{model} has {heads} query heads of {head_dim}. A tiled attention kernel's backward rebuilds "
            "S = QK^T from q, k and the logsumexp, where a naive kernel's backward reads the kept "
            "probabilities. At s = {seq:,}, batch 1, no causal mask, how many TFLOP does that add per layer "
            "(a matmul of m x n by n x p is 2mnp FLOPs)?",
            answer=lambda n: n["extra_t"], unit="TFLOP", rel_tol=0.01,
            hint="One matmul per query head: (s x {head_dim}) by ({head_dim} x s).",
            explanation="2 x {seq:,}^2 x {head_dim} x {heads} = {answer} TFLOP, {pct:.1f} % more than the naive "
                        "kernel's forward + backward matmuls (4 + 8 units against 4 + 10). It is faster anyway on a "
                        "GPU: it never writes or reads the s x s matrices in HBM.",
            traps=((lambda n: 2 * n["extra_t"], "that recomputes the whole forward (QK^T and PV); the backward "
                                                "needs P, not the output."),),
            draw=_recompute),
    Numeric("cpu-dropout",
            "On a CPU you train through F.scaled_dot_product_attention with dropout_p = 0.1, {heads} heads, "
            "s = {seq:,}, batch 1, fp32. Work out which backend PyTorch runs, then how many MiB the softmax "
            "output it keeps for backward takes (leave out q, k, v, the dropout mask and the output).",
            answer=lambda n: n["probs_mib"], unit="MiB", rel_tol=0.01,
            hint="Does PyTorch's fused CPU kernel accept dropout? If not, what is the fallback made of, and "
                 "what does autograd save for a softmax?",
            explanation="Any dropout_p > 0 sends SDPA on a CPU to the math backend: matmul, softmax, dropout, "
                        "matmul in ordinary operators. The softmax's output is kept, one fp32 s x s matrix per "
                        "head: 4 x {seq:,}^2 x {heads} B = {answer} MiB (the fused kernel would keep "
                        "{lse_mib:.2f} MiB of logsumexp instead).",
            traps=((lambda n: n["lse_mib"], "that is the fused kernel's logsumexp; with dropout the fused CPU "
                                            "kernel does not run."),
                   (lambda n: n["probs_mib"] / n["heads"], "that is one head; every head keeps its own.")),
            draw=_dropout),
    Numeric("online-step",
            "One query row's online softmax so far: running max m = {m}, running sum l = {l} "
            "(l = sum of exp(x - m) over the scores seen). The next key block brings the scores "
            "{block_text}. What is l after this block?",
            answer=lambda n: n["l_new"], rel_tol=0.005,
            hint="First the new max. Then rescale the old sum by exp(m_old - m_new) and add the block's "
                 "exp(x - m_new).",
            explanation="m_new = {m_new:g}; l = {l} x exp({m} - {m_new:g}) + the sum of exp(x - {m_new:g}) over "
                        "the block = {answer}.",
            traps=((lambda n: n["l"] + sum(math.exp(x - n["m_new"]) for x in n["block"]),
                    "the old sum was taken against the old max: rescale it by exp(m_old - m_new) first."),),
            draw=_step),
    Numeric("core-time-hfu",
            "{model} ({heads} query heads of {head_dim}) at s = {seq:,}, batch 1, no mask: how many ms does one "
            "layer's tiled attention core (forward + backward, including the backward's recompute of S) take "
            "on an H100 ({tflops:.0f} TFLOP/s dense bf16) at {hfu_pct} % HFU (hardware FLOPs utilisation: the "
            "share of the peak achieved on every FLOP the GPU runs, the recompute included)?",
            answer=lambda n: n["ms"], unit="ms", rel_tol=0.02,
            hint="Count the matmul FLOPs per head: 4 s^2 d forward, 10 s^2 d backward; then divide by the "
                 "achieved FLOP/s.",
            explanation="14 x {seq:,}^2 x {head_dim} x {heads} = {tflop:.2f} TFLOP, at {hfu_pct} % of {tflops:.0f} "
                        "TFLOP/s: {answer} ms, beside {matmul_ms:.1f} ms for the layer's weight matmuls at the same "
                        "share of the peak. That share is HFU, not MFU: MFU counts only the model's FLOPs (12 units "
                        "of the 14, without the recompute), so the same run's MFU is 12/14 of its HFU.",
            traps=((lambda n: n["ms"] * 12 / 14, "that leaves out the backward's recompute of S = QK^T."),
                   (lambda n: n["ms"] * n["hfu_pct"] / 100, "that is at the full peak; divide by the HFU too.")),
            draw=_time),
])
