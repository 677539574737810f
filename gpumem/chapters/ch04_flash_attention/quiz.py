"""Chapter 04's quiz: what a naive kernel keeps, what FlashAttention keeps instead, how each grows
with s, and what the recomputation costs. Each attempt draws a model, sequence length and batch;
every expected value is computed by the library (``claims``, ``gpumem.memory.attention_flops``)."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, UNIT_MIXUP, model_numbers, pick
from gpumem.memory import attention_flops, models
from gpumem.units import GB

from . import claims

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
    n = {"s1": pick(rng, (1024, 2048)), "k": pick(rng, (2, 4, 8)), "naive_mib": pick(rng, (40, 72, 136)),
         "tiled_mib": pick(rng, (6, 10, 18))}
    n["s2"] = n["s1"] * n["k"]
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
    Numeric("naive-scores",
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
    Numeric("doubling-law",
            "Measured on a CPU: at s = {s1:,} one forward and backward of naive attention peaks at {naive_mib} MiB "
            "above its inputs, and the tiled kernel at {tiled_mib} MiB, both almost all from terms that grow with "
            "s. Predict the naive kernel's peak at s = {s2:,}, in MiB.",
            answer=lambda n: n["naive_mib"] * n["k"] ** 2, unit="MiB", rel_tol=0.02,
            hint="Which tensor dominates the naive kernel's peak, and how does its size depend on s?",
            explanation="The scores and probabilities are s x s: {k}x the length is {k}^2 the bytes, "
                        "{answer} MiB. The tiled kernel's peak grows {k}x, to about {tiled_mib} x {k} MiB.",
            traps=((lambda n: n["naive_mib"] * n["k"], "that is linear growth, the tiled kernel's law; the "
                                                       "naive kernel keeps s x s matrices."),),
            draw=_growth),
    Numeric("recompute-flops",
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
    Choice("which-backend",
           "On a GPU, PyTorch's scaled_dot_product_attention runs inside "
           "sdpa_kernel(SDPBackend.MATH). What does backward keep per query head?",
           ["the s x s probabilities, as naive code does", "the output and one logsumexp per row",
            "only q, k and v", "nothing: the math backend recomputes everything"],
           0, "The math backend is PyTorch ops: matmul, softmax, matmul. Autograd saves the softmax's output.",
           hint="Which backends are fused kernels, and which is made of ordinary operators?"),
])
