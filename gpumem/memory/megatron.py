"""Megatron's activation formula beside Llama's count, tensor by tensor.

Korthikanti et al. (arXiv:2205.05198, section 4.1) count what one GPT layer saves for backward in
16-bit with dropout: 34*s*b*h + 5*a*s^2*b bytes. Their layer is a LayerNorm, multi-head attention
with a materialised softmax and dropout, and a 4h GeLU MLP. Llama-3 with flash attention differs
in four ways, and each row below names which: no dropout anywhere (no masks, no dropout
outputs); flash attention keeps no s x s tensor (the same effect as Korthikanti's selective
recomputation); GQA makes K and V kv_dim wide instead of h; and SwiGLU keeps four F-wide tensors
(gate, up, silu(gate), their product) with F = 3.5h, instead of two 4h-wide ones.

The Llama column is written out here from the config, independently of ``activations``; a test
checks that its total equals ``activations.layer_parts`` for the flash kernel.
"""

from dataclasses import dataclass

from .. import units
from .models import ModelConfig


@dataclass(frozen=True)
class Row:
    """One tensor (or tensor group) of a layer: bytes saved in Megatron's count and in Llama's."""
    tensor: str
    megatron: int
    llama: int
    why: str


def korthikanti_layer(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """Korthikanti et al.'s bytes per layer, 34*s*b*h + 5*a*s^2*b, applied to ``cfg``'s h and a."""
    s, b, h, a = seq, batch, cfg.d_model, cfg.n_heads
    return 34 * s * b * h + 5 * a * s * s * b


def reconcile(cfg: ModelConfig, seq: int, batch: int = 1) -> list[Row]:
    """The two counts side by side for one layer of ``cfg`` (16-bit activations, 1-byte masks)."""
    s, b, h, a, k, F = seq, batch, cfg.d_model, cfg.n_heads, cfg.kv_dim, cfg.ffn
    T = s * b
    sbh, scores = T * h, a * s * s * b
    return [
        Row("attention norm input", 2 * sbh, 2 * sbh, "same"),
        Row("Q/K/V projection input", 2 * sbh, 2 * sbh, "same"),
        Row("Q", 2 * sbh, 2 * sbh, "same"),
        Row("K", 2 * sbh, 2 * T * k, f"GQA: {cfg.n_kv_heads} of {a} heads"),
        Row("V", 2 * sbh, 2 * T * k, f"GQA: {cfg.n_kv_heads} of {a} heads"),
        Row("softmax output (s x s per head)", 2 * scores, 0, "flash recomputes it in backward"),
        Row("softmax dropout mask", scores, 0, "no dropout"),
        Row("softmax dropout output", 2 * scores, 0, "no dropout; flash"),
        Row("logsumexp per head and row (fp32)", 0, 4 * a * T, "flash keeps it instead"),
        Row("attention output = W_o input", 2 * sbh, 2 * sbh, "same"),
        Row("attention dropout mask", sbh, 0, "no dropout"),
        Row("MLP norm input", 2 * sbh, 2 * sbh, "same"),
        Row("MLP input", 2 * sbh, 2 * sbh, "same"),
        Row("first projection output: GeLU input | gate, up", 8 * sbh, 2 * 2 * T * F,
            f"SwiGLU: two outputs {F / h:g}h wide, not one 4h"),
        Row("activation output: GeLU(x) | silu(gate), product", 8 * sbh, 2 * 2 * T * F,
            "SwiGLU: two tensors again"),
        Row("MLP dropout mask", sbh, 0, "no dropout"),
        Row("1/rms per token, two norms (fp32)", 0, 2 * 4 * T, "Megatron leaves LayerNorm's statistics out"),
    ]


def table(cfg: ModelConfig, seq: int, batch: int = 1) -> str:
    """:func:`reconcile` rendered: bytes in MB (10^6) and in units of s*b*h, with totals."""
    rows = reconcile(cfg, seq, batch)
    sbh = seq * batch * cfg.d_model
    head = (f"{'one layer, ' + cfg.name + f', s={seq}, b={batch}':50s}{'Megatron':>10s}{'Llama':>10s}"
            f"  {'in units of s*b*h':>15s}  why they differ")
    lines = [head, "-" * (len(head) + 14)]
    for r in rows:
        lines.append(f"{r.tensor:50s}{units.fmt(r.megatron, 'MB', 0):>10s}{units.fmt(r.llama, 'MB', 0):>10s}"
                     f"  {r.megatron / sbh:>7.2f} {r.llama / sbh:>7.2f}  {r.why}")
    m, l = sum(r.megatron for r in rows), sum(r.llama for r in rows)
    lines.append("-" * (len(head) + 14))
    lines.append(f"{'total':50s}{units.fmt(m, 'MB', 0):>10s}{units.fmt(l, 'MB', 0):>10s}"
                 f"  {m / sbh:>7.2f} {l / sbh:>7.2f}")
    lines.append(f"Megatron's 34*sbh + 5*a*s^2*b = {units.fmt(korthikanti_layer(cfg, seq, batch), 'MB', 0)} "
                 f"(5*a*s/h = {5 * cfg.n_heads * seq / cfg.d_model:g} sbh of it is the s^2 term)")
    return "\n".join(lines)
