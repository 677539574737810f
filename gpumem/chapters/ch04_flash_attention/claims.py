"""Chapter 04's claims: the note's score-matrix arithmetic (its section 2 box), its summary row for
FlashAttention and its "compressed state", recomputed.

The note counts one fp32 s x s matrix, 4096^2 x 4 B = 64 MB (64 MiB), then multiplies by 32 layers
and a batch of 16. Its 32 layers are Llama-3-8B's, the model of the note's next box, so the ledger
reads the claim as 8B (as chapter 03's ledger does, its row [4]): the note leaves out the heads,
since every query head has its own matrix (32 in Llama-3-8B; GQA shares only K and V among query
heads). Chapter 04's section 1 shows the same count once at the scenario's Llama-3-70B. What
FlashAttention keeps instead is the output O (which W_o needs anyway) and one fp32 logsumexp per
query head and row.
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.course.quiz_draws import label
from gpumem.memory import activations, models

SEQ, BATCH, MODEL = 4096, 16, "llama-3-70b"
NOTE_MODEL = "llama-3-8b"       # the model whose 32 layers the note multiplies by


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
    lines += ["-" * 78, f"flash keeps {s32 // lse:,}x less than the fp32 probabilities beyond O",
              f"  (one number per row instead of a row of s = {seq:,})",
              f"GQA shrinks k and v {cfg.n_heads // cfg.n_kv_heads}x; the scores and the logsumexp stay per query head"]
    return "\n".join(lines)


def note_ratio(model: str = MODEL, seq: int = SEQ, batch: int = BATCH) -> float:
    """How many times the note's 32 "GB" (one 64 MiB matrix x 32 layers x 16: 32 GiB) the batch's fp32
    probabilities of ``model`` are, in the same (binary) units on both sides."""
    cfg = models.get(model)
    return scores(seq, cfg.n_heads, cfg.n_layers, batch) / scores(seq, 1, 32, batch)


def gpus_filled(total: int, capacity: int) -> int:
    """Whole GPUs of ``capacity`` bytes needed to hold ``total`` bytes (rounded up: 64.3 needs 65)."""
    return -(-total // capacity)


def where_forty() -> list[tuple[str, int, float]]:
    """(model, s, % saved) where the note's "~40 %" holds: 8B at 2,048 tokens and 70B at 1,536."""
    return [(name, s, flash_saving(name, s)) for name, s in (("llama-3-8b", 2048), ("llama-3-70b", 1536))]


def _forty_text() -> str:
    return " and ".join(f"{label(m)} at s {s:,} saves {pct:.1f} %" for m, s, pct in where_forty())


_CFG, _8B = models.get(MODEL), models.get(NOTE_MODEL)
_H8, _L8 = _8B.n_heads, _8B.n_layers
CLAIMS = [
    Claim("4a", "one s x s fp32 score matrix at s 4096", 64, lambda: scores() / 1e6,
          lambda: f"4096^2 x 4 B = {scores():,} B = 64 MiB exactly, {units.fmt(scores(), 'MB', 1)}: the note "
                  "writes MiB as MB. That is one matrix: one query head of one layer of one sequence.", unit="MB"),
    Claim("4b", "scores of one 8B layer (32 query heads), s 4096", 64,
          lambda: scores(heads=_H8) / 1e6,
          lambda: f"The note's 32 layers are {label(NOTE_MODEL)}'s (the model of its next box), so the ledger reads the "
                  f"box as 8B, as chapter 03's ledger does (its row [4]). {_H8} query heads, each its own "
                  f"matrix: {_fmt(scores(heads=_H8))}. GQA's {_8B.n_kv_heads} key/value heads do not help: each "
                  "query head scores the keys itself.", unit="MB"),
    Claim("4c", "scores of all 32 layers (8B), s 4096, one sequence", 2e9,
          lambda: scores(heads=_H8, layers=_L8),
          lambda: f"{label(NOTE_MODEL)} has {_L8} layers, as the note says; the heads it leaves out multiply every "
                  f"layer: {_fmt(scores(heads=_H8, layers=_L8))}."),
    Claim("4d", "scores of all 32 layers (8B), s 4096, batch 16", 32e9,
          lambda: scores(heads=_H8, layers=_L8, batch=BATCH),
          lambda: f"x 16 sequences: {_fmt(scores(heads=_H8, layers=_L8, batch=BATCH))}, "
                  f"{units.fmt(scores(heads=_H8, layers=_L8, batch=BATCH), 'TiB', 1)}: "
                  f"{note_ratio(NOTE_MODEL):.0f}x the note's figure, in GiB on both sides (its '32 GB' is "
                  "64 MiB x 32 x 16 = 32 GiB); the factor is the heads. At the scenario's Llama-3-70B "
                  "(64 query heads, 80 layers) the same count is section 1's box: "
                  f"{units.fmt(scores(heads=_CFG.n_heads, layers=_CFG.n_layers, batch=BATCH), 'GiB', 0)}, "
                  f"{note_ratio(MODEL):.0f}x."),
    Claim("8b", "summary: FlashAttention saves ~40 % (70B, s 4096)", 40,
          flash_saving,
          lambda: f"Chapter 01's count of a step's activations with a naive kernel (bf16 probabilities and a "
                  f"mask per layer) against flash, for the scenario's {label(MODEL)}: {flash_saving():.1f} % less at "
                  f"s 4,096. The note's ~40 % holds near 2k tokens: {_forty_text()} (the same count). The share "
                  f"grows with s ({flash_saving(seq=2048):.0f} % at 2,048, {flash_saving(seq=8192):.0f} % at "
                  "8,192 for 70B): the saving is an s^2 term, not a fixed percentage. In every Llama-3 (head "
                  "dim 128) the bf16 probabilities are s/64 bytes per token and hidden unit in each layer "
                  "(2*a*s/h), beside about 40 for the rest of the layer. FlashAttention's paper states it for "
                  "attention alone: 10x less memory at 2K tokens, 20x at 4K (arXiv:2205.14135, its attention "
                  "benchmark).", unit="%"),
]
