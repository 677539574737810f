"""Chapter 04's claims: the note's score-matrix arithmetic (its section 2 box), its summary row for
FlashAttention and its "compressed state", recomputed for Llama-3-70B.

The note counts one fp32 s x s matrix, 4096^2 x 4 B = 64 MB, then multiplies by 32 layers and a
batch of 16. It leaves out the heads: every query head has its own matrix (64 in Llama-3-70B; GQA
shares only K and V among query heads), and Llama-3-70B has 80 layers. What FlashAttention keeps
instead is the output O (which W_o needs anyway) and one fp32 logsumexp per query head and row.
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import activations, models

SEQ, BATCH, MODEL = 4096, 16, "llama-3-70b"


def scores(seq: int = SEQ, heads: int = 1, layers: int = 1, batch: int = 1, elem: int = 4) -> int:
    """Bytes of the s x s score matrices: one per query head, layer and sequence."""
    return elem * seq * seq * heads * layers * batch


def kept(model: str = MODEL, seq: int = SEQ, batch: int = BATCH) -> dict[str, int]:
    """What one layer's attention core keeps for backward, per kernel and tensor (bf16 step):
    naive: the probabilities P = softmax(S) per query head (the scores S themselves are freed once
    P exists: softmax's backward reads its output); flash: the output and the logsumexp; both: q, k, v."""
    cfg = models.get(model)
    T, e = seq * batch, 2
    return {"q (all query heads)": e * T * cfg.d_model,
            "k and v (key/value heads only: GQA)": 2 * e * T * cfg.kv_dim,
            "k and v if every query head had its own (MHA)": 2 * e * T * cfg.d_model,
            "probabilities P, fp32, per query head (naive fp32)": scores(seq, cfg.n_heads, 1, batch),
            "probabilities P, bf16, per query head (naive bf16)": scores(seq, cfg.n_heads, 1, batch, e),
            "HF eager: fp32 P + bf16 copy, 6 B a score": scores(seq, cfg.n_heads, 1, batch, 6),
            "output O (flash; W_o's input, kept anyway)": e * T * cfg.d_model,
            "logsumexp, fp32, per query head and row (flash)": 4 * T * cfg.n_heads}


def flash_saving(model: str = MODEL, seq: int = SEQ) -> float:
    """How much of a step's activation peak flash attention removes against a naive kernel (%)."""
    cfg = models.get(model)
    naive = activations.activations(cfg, seq, 1, "naive").peak
    return 100 * (1 - activations.activations(cfg, seq, 1, "flash").peak / naive)


def _fmt(v: float) -> str:
    big = v >= 1e9
    return f"{units.fmt(v, 'GB' if big else 'MB', 1)} ({units.fmt(v, 'GiB' if big else 'MiB', 1)})"


def kept_table(model: str = MODEL, seq: int = SEQ, batch: int = BATCH) -> str:
    """One layer's attention tensors for backward at the note's setting, and what GQA changes."""
    cfg = models.get(model)
    rows = kept(model, seq, batch)
    lines = [f"{cfg.name}, s {seq:,}, batch {batch}, one layer ({cfg.n_heads} query heads, "
             f"{cfg.n_kv_heads} key/value heads of {cfg.head_dim})", "-" * 78]
    lines += [f"{name:50s}{_fmt(b):>28s}" for name, b in rows.items()]
    lse, s32 = rows["logsumexp, fp32, per query head and row (flash)"], rows["probabilities P, fp32, per query head (naive fp32)"]
    lines += ["-" * 78, f"flash keeps {s32 // lse:,}x less than the fp32 probabilities beyond O (s = {seq:,} per row: "
              "one number instead of a row of s)",
              f"GQA shrinks k and v {cfg.n_heads // cfg.n_kv_heads}x; the scores and the logsumexp stay per query head"]
    return "\n".join(lines)


_CFG = models.get(MODEL)
CLAIMS = [
    Claim("4a", "one s x s fp32 score matrix at s 4096", 64, lambda: scores() / 1e6,
          lambda: f"4096^2 x 4 B = {scores():,} B = 64 MiB exactly, {units.fmt(scores(), 'MB', 1)}: the note "
                  "writes MiB as MB. That is one matrix: one query head of one layer of one sequence.", unit="MB"),
    Claim("4b", "scores of one Llama-3-70B layer (all query heads), s 4096, one sequence", 64,
          lambda: scores(heads=_CFG.n_heads) / 1e6,
          lambda: f"{_CFG.n_heads} query heads, each its own matrix: {_fmt(scores(heads=_CFG.n_heads))}. "
                  f"GQA's {_CFG.n_kv_heads} key/value heads do not help: each query head scores the keys itself.", unit="MB"),
    Claim("4c", "scores of all layers, s 4096, one sequence", 2e9,
          lambda: scores(heads=_CFG.n_heads, layers=_CFG.n_layers),
          lambda: f"Llama-3-70B has {_CFG.n_layers} layers, not 32: "
                  f"{_fmt(scores(heads=_CFG.n_heads, layers=_CFG.n_layers))}."),
    Claim("4d", "scores of all layers, s 4096, batch 16", 32e9,
          lambda: scores(heads=_CFG.n_heads, layers=_CFG.n_layers, batch=BATCH),
          lambda: f"x 16 sequences: {_fmt(scores(heads=_CFG.n_heads, layers=_CFG.n_layers, batch=BATCH))}, "
                  f"{units.fmt(scores(heads=_CFG.n_heads, layers=_CFG.n_layers, batch=BATCH), 'TiB', 1)}; "
                  "about 160x the note's figure (64 heads x 80/32 layers)."),
    Claim("8b", "summary: FlashAttention saves this share of memory (70B, s 4096, activation peak)", 40,
          flash_saving,
          lambda: f"Chapter 01's count of a step's activations with a naive kernel (bf16 probabilities and a "
                  f"mask per layer) against flash: {flash_saving():.0f} % less at s 4096. The share grows with "
                  f"s ({flash_saving(seq=8192):.0f} % at 8192, {flash_saving(seq=2048):.0f} % at 2048): the "
                  "saving is an s^2 term, not a fixed percentage. FlashAttention's paper states it for attention "
                  "alone: 10x less memory at 2K tokens, 20x at 4K (arXiv:2205.14135, its attention benchmark); the note's "
                  "40 % is neither.", unit="%"),
]
