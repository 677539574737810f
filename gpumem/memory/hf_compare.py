"""Hugging Face's ``LlamaForCausalLM`` against the course's Llama: what each saves, line by line.

Both columns come from ``activations`` (the course: ``norm="fused"``, its default; Hugging Face:
``norm="hf", impl="hf"``, which ``hf_trace`` traces from transformers' own code, and
``tests/test_hf_trace.py`` checks against that trace). No torch here: the table is arithmetic.
"""

from .. import units
from .activations import elem_bytes, layer_terms, loss_terms, norm_bytes
from .models import ModelConfig

_NORM_WHY = "fp32 input kept (1)"
_SAME_ATTN = "same (no mask, GQA) (2)"


def difference_rows(cfg: ModelConfig, seq: int = 4096, batch: int = 1,
                    recipe: str = "mixed") -> list[tuple[str, str, int, int, str]]:
    """(where, tensors, course bytes, Hugging Face bytes, why) per row; ``where`` is "layer"
    (one layer, dense flash attention) or "outside" (the rest of the step, at the loss)."""
    e, T, h = elem_bytes(recipe), batch * seq, cfg.d_model
    course = layer_terms(cfg, seq, batch, "flash", e, norm="fused")
    hf = layer_terms(cfg, seq, batch, "flash", e, norm="hf", impl="hf")
    if len(course) != len(hf):
        raise ValueError(f"{cfg.name}: its Hugging Face layer saves other tensor groups than the course's")
    rows = []
    for (name, (b_c, _)), (_, (b_h, _)) in zip(course.items(), hf.items()):
        if "norm" in name:
            rows.append(("layer", name.split(" (")[0], b_c, b_h, _NORM_WHY))
        else:
            rows.append(("layer", name, b_c, b_h, "same" if b_c == b_h else "differs"))
    rows[2:5] = [("layer", "q, k, v, output, logsumexp", sum(r[2] for r in rows[2:5]),
                  sum(r[3] for r in rows[2:5]), _SAME_ATTN)]
    rope = 2 * e * seq * cfg.head_dim
    rows += [("outside", "RoPE cos and sin tables", rope, rope, "same (one for all layers)"),
             ("outside", "final norm", norm_bytes(T, h, e, "fused"), norm_bytes(T, h, e, "hf"), _NORM_WHY),
             ("outside", "output head input", e * T * h, e * T * h, "same")]
    c_loss, h_loss = loss_terms(cfg, seq, batch, e), loss_terms(cfg, seq, batch, e, "hf")
    logits = sum(b for n, (b, _) in c_loss.items())
    rows.append(("outside", "logits, fp32 copy, log-softmax", logits,
                 sum(b for n, (b, _) in h_loss.items() if "labels" not in n),
                 "same (HF upcasts too)"))
    rows.append(("outside", "labels (int64)", 0, sum(b for n, (b, _) in h_loss.items() if "labels" in n),
                 "HF pads them by one (3)"))
    return rows


def difference_table(cfg: ModelConfig, seq: int = 4096, batch: int = 1, recipe: str = "mixed") -> str:
    """The rows of :func:`difference_rows` as text (100 columns), in MB, with totals for the step."""
    rows = difference_rows(cfg, seq, batch, recipe)
    mb = lambda b: units.fmt(b, "MB", 2)   # noqa: E731
    lines = [f"{cfg.name}, seq {seq} x batch {batch}: HF LlamaForCausalLM vs the course's Llama "
             f"(fused norm)",
             f"{'tensors':32s}{'course':>14s}{'HF':>14s}{'HF - course':>13s}  why"]
    for where in ("layer", "outside"):
        lines.append("per layer" if where == "layer" else "outside the layers, at the loss")
        for _, name, c, h, why in (r for r in rows if r[0] == where):
            lines.append(f"  {name[:30]:30s}{mb(c):>14s}{mb(h):>14s}{mb(h - c):>13s}  {why}"[:100])
    per = [sum(r[i] for r in rows if r[0] == "layer") for i in (2, 3)]
    out = [sum(r[i] for r in rows if r[0] == "outside") for i in (2, 3)]
    step = [cfg.n_layers * p + o for p, o in zip(per, out)]
    for name, (c, h) in (("one layer", per), ("outside", out), (f"step, {cfg.n_layers} layers", step)):
        lines.append(f"{'total ' + name:32s}{mb(c):>14s}{mb(h):>14s}{mb(h - c):>13s}"
                     f"  {100 * (h - c) / c:+.1f} %")
    lines += ["(1) LlamaRMSNorm in eager ops: pow keeps the fp32 input, the weight multiply the bf16",
              "    normed copy; a fused kernel keeps the bf16 input (4 bytes per element more).",
              "(2) is_causal, no mask: k and v stay at the key/value heads (enable_gqa). A fake-tensor",
              "    trace that lets transformers assume packed rows adds an (s, s) mask and k, v expanded",
              "    to every head; hf_trace answers 'not packed', as real position ids do.",
              "(3) ForCausalLMLoss pads the labels by one token; the course's targets are input data.",
              "The logits are bf16 in both, upcast to fp32 for the loss: no difference there."]
    return "\n".join(lines)
