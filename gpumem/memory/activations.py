"""Activation memory of a Llama training step, counted tensor by tensor (bytes).

What is counted is what autograd saves for backward in ``gpumem.memory.llama`` (and what lives at the
moment of the peak); a test compares every term with a fake-tensor trace. Notation: T = b*s
tokens, h = d_model, k = kv width (GQA), F = FFN width, a = query heads, V = vocabulary,
e = bytes per element of the recipe's compute dtype (2 for bf16, 4 for fp32).

Per layer, no checkpointing:

* each RMSNorm (two per layer), by implementation (``norm``):
  - fused (the default; Apex, Transformer Engine, fused CUDA kernels): its input and an fp32
    1/rms per token, e*T*h + 4*T;
  - hf (Hugging Face's ``LlamaRMSNorm``, eager ops): 4*T*h + e*T*h + 4*T (which operator saves
    which tensor is lab 01's to derive; tests/test_lab01_adversarial.py counts it by hand). In
    bf16 that is +8*s*b*h per layer: 48.5 instead of 40.5 s*b*h for Llama-3-70B with flash (+20 %);
* attention keeps the normed input of W_q/W_k/W_v (e*T*h), then by kernel
  - flash: q, k, v (e*T*(h + 2k)), the output, which is also W_o's input (e*T*h), and an fp32
    logsumexp per head and row (4*a*T): **no s^2 term**;
  - naive: q, K and V expanded to all heads (e*T*3q, q = a*head_dim: h for Llama), the bool
    causal mask (s^2), the probabilities (e*b*a*s^2) and W_o's input (e*T*q);
  - eager (Hugging Face, dropout 0): as naive without the mask, but the probabilities twice,
    fp32 from the softmax and a bf16 copy for the matmul (6*b*a*s^2 in bf16);
* the SwiGLU MLP keeps its normed input (e*T*h) and gate, silu(gate), up and their product
  (4*e*T*F); a mixture of experts keeps the same input (the router's), then the router, the
  dispatched rows, the experts and the combine (``gpumem.memory.moe_acts``, at a stated routing).

Outside the layers: RoPE's cos and sin tables (2*e*s*head_dim, shared), the final norm, the
head's input, and at the loss the bf16 logits, their fp32 copy and fp32 log-softmax live
together ((e + 8)*T*V in bf16). The token ids are input data and not counted.

Hugging Face's own code (``impl="hf"``, with ``norm="hf"``; ``gpumem.memory.hf_trace`` traces it)
saves what the course's Llama saves with ``norm="hf"``, layer for layer, with three differences:
its forward rebinds the last hidden state to the final norm's output, so nothing holds the
un-normed one at the loss; its loss (``ForCausalLMLoss``) pads the int64 labels by one token
(8*b*(s+1)); and where a sliding window is no wider than the sequence (Mistral v0.1: 4096),
it materialises the mask (``masking_utils._ignore_causal_mask_sdpa``), so SDPA gets k and v
expanded to all heads and saves a bf16 copy of the mask in every layer (e*b*s^2). Models with
q/k norms (Qwen3) normalise each head of q and k: one norm over rows of head_dim per head.

Checkpointing keeps only each segment's input (e*T*h) and re-runs the segment in backward; then
the activation peak is the larger of the end of the forward and the re-run of the costliest
segment.
"""

from dataclasses import dataclass, field

from .. import units
from ..errors import one_of, positive_int
from .activation_parts import (elem_bytes, gemma_final_norm, hf_window_mask, layer_norm, norm_bytes,
                               norm_label, softcap)
from .models import ModelConfig
from .moe_acts import Routing, moe_terms
from .policies import KERNELS, NORMS, POLICIES, checkpoint_plan

IMPLS = ("course", "hf")   # whose code: gpumem.memory.llama, or transformers' (module docstring)


@dataclass
class Activations:
    """Activation bytes by part; ``peak`` is what the trace's activation category reaches."""
    per_layer: int            # one un-checkpointed layer's saved tensors
    checkpoint_input: int     # one checkpointed segment's saved input
    layers: int               # all layers' saved tensors at the end of the forward
    outside: int              # rope tables, final norm, head input
    loss: int                 # logits + fp32 copies live at the loss
    forward_peak: int
    recompute_peak: int
    parts: dict[str, int] = field(default_factory=dict)   # one layer, by tensor group

    @property
    def peak(self) -> int:
        return max(self.forward_peak, self.recompute_peak)


def layer_terms(cfg: ModelConfig, seq: int, batch: int, kernel: str, e: int,
                selective: bool = False, norm: str = "fused", impl: str = "course",
                routing: Routing | None = None) -> dict[str, tuple[int, str]]:
    """Saved bytes of one un-checkpointed layer, by tensor group, each with its formula (in s, b,
    h, k, F, a, q = a*head_dim; the element size ``e`` written out, e.g. ``2sbh`` in bf16)."""
    T, h, k, F, a = batch * seq, cfg.d_model, cfg.kv_dim, cfg.ffn, cfg.n_heads
    q, qs = cfg.q_dim, "h" if cfg.q_dim == cfg.d_model else "q"
    n_bytes, n_formula, label = layer_norm(cfg, T, e, norm)
    terms = {f"attn norm {label}": (n_bytes, n_formula), "q/k/v projection input": (e * T * h, f"{e}sbh")}
    if cfg.qk_norm:   # one norm per head over head_dim: rows T*a for q, T*kv_heads for k
        for x, w, heads, hs in (("q", q, a, "a"), ("k", k, cfg.n_kv_heads, "kv")):
            terms[f"{x} norm per head {label}"] = (norm_bytes(T * heads, cfg.head_dim, e, norm),
                                                   f"{e if norm == 'fused' else 4 + e}sb{x} + 4{hs}sb")
    if hf_window_mask(cfg, seq, impl) and kernel == "flash" and not selective:
        terms["q, k and v expanded to all heads"] = (3 * e * T * q, f"{3 * e}sb{qs}")
        terms["window mask, SDPA's bf16 copy"] = (e * batch * seq * seq, f"{e}bs^2")
        terms["output = W_o input"] = (e * T * q, f"{e}sb{qs}")
        terms["logsumexp (fp32)"] = (4 * a * T, "4asb")
    elif selective:   # checkpointed attention core: keeps q, k, v; W_o's input is its output
        terms["q, k, v (core recomputed)"] = (e * T * (q + 2 * k), f"{e}sb({qs}+2k)")
        terms["W_o input"] = (e * T * q, f"{e}sb{qs}")
    elif kernel == "flash":
        terms["q, k, v"] = (e * T * (q + 2 * k), f"{e}sb({qs}+2k)")
        terms["output = W_o input"] = (e * T * q, f"{e}sb{qs}")
        terms["logsumexp (fp32)"] = (4 * a * T, "4asb")
    else:
        scores = batch * a * seq * seq
        terms["q, expanded k and v"] = (e * T * 3 * q, f"{3 * e}sb{qs}")
        if kernel == "naive":
            terms["causal mask (bool)"] = (seq * seq, "s^2")
            terms["probabilities"] = (e * scores, f"{e}as^2b")
        else:  # eager: fp32 softmax output, and its bf16 copy when computing in bf16
            per = 4 + (e if e == 2 else 0)
            terms["probabilities fp32" + (" + bf16 copy" if e == 2 else "")] = (per * scores, f"{per}as^2b")
            if softcap(cfg):   # Gemma 2: tanh(scores / 50) * 50 before the mask
                terms["scores soft-capped: tanh output"] = (e * scores, f"{e}as^2b")
        terms["W_o input"] = (e * T * q, f"{e}sb{qs}")
    if cfg.norms_per_layer == 4:   # Gemma 2 also normalises each sub-layer's output
        terms[f"post-attention norm {label}"] = (n_bytes, n_formula)
    terms[f"mlp norm {label}"] = (n_bytes, n_formula)
    terms["mlp input"] = (e * T * h, f"{e}sbh")
    if cfg.moe:
        terms |= moe_terms(cfg, T, e, routing)
    elif cfg.mlp == "gelu":   # GPT-2's gelu_new in eager ops saves x, x/2, tanh, 1+tanh; + the output
        terms["gelu_new: 4 saved, the output"] = (5 * e * T * F, f"{5 * e}sbF")
    else:
        terms[f"gate, {'gelu' if cfg.mlp == 'geglu' else 'silu'}, up, product"] = (4 * e * T * F, f"{4 * e}sbF")
    if cfg.norms_per_layer == 4:
        terms[f"post-MLP norm {label}"] = (n_bytes, n_formula)
    return terms


def layer_parts(cfg: ModelConfig, seq: int, batch: int, kernel: str, e: int,
                selective: bool = False, norm: str = "fused", impl: str = "course",
                routing: Routing | None = None) -> dict[str, int]:
    """Saved bytes of one un-checkpointed layer, by tensor group (:func:`layer_terms` without
    the formulas)."""
    terms = layer_terms(cfg, seq, batch, kernel, e, selective, norm, impl, routing)
    return {name: b for name, (b, _) in terms.items()}


def softmax_moment(cfg: ModelConfig, seq: int, batch: int, kernel: str, e: int,
                   norm: str = "fused") -> int:
    """Bytes alive in one layer at its softmax (naive and eager kernels; 0 for flash).

    Saved so far (norm, projection input, q, expanded k and v) plus what is alive without being
    saved: the un-expanded k and v held by the caller, the bool causal mask, and the softmax's
    input and output together. ``softmax(x, dtype=float32)`` of bf16 scores first makes an fp32
    copy of x, on CPU and on CUDA alike: ATen (``SoftMax.cpp``, ``softmax()``) takes the
    in-register ``half_to_float`` path only for fp16 input on CUDA. So bf16 eager peaks at
    2 + 4 + 4 = 10 bytes per score, then settles at 6.
    """
    if kernel == "flash":
        return 0
    T, h, k, a = batch * seq, cfg.d_model, cfg.kv_dim, cfg.n_heads
    scores = batch * a * seq * seq
    if kernel == "naive":
        live_scores = 2 * e * scores
    else:  # the larger of: adding the (s, s) mask (scores, mask, sum) and the softmax
        at_softmax = (2 + 4 + 4) * scores if e == 2 else 8 * scores
        live_scores = max(2 * e * scores + e * seq * seq, at_softmax)
    return (norm_bytes(T, h, e, norm)  # the attention norm's saved tensors
            + e * T * h                # projection input
            + 3 * e * T * h            # q, expanded k and v
            + 2 * e * T * k            # k and v before expansion (held by the caller)
            + seq * seq                # bool causal mask
            + live_scores)


def activations(cfg: ModelConfig, seq: int, batch: int = 1, kernel: str = "flash",
                policy: str = "none", recipe: str = "mixed", norm: str = "fused",
                impl: str = "course", routing: Routing | None = None) -> Activations:
    """Activation bytes of one training step of ``cfg``, by part, with its forward and recompute
    peaks; ``impl="hf"``: what transformers' own model saves (module docstring); ``routing``:
    how a mixture of experts dispatches its tokens (default balanced, capacity factor 1.0)."""
    seq, batch = positive_int(seq, "sequence length"), positive_int(batch, "micro-batch")
    one_of(kernel, KERNELS, "attention kernel")
    one_of(policy, POLICIES, "checkpoint policy")
    one_of(norm, NORMS, "norm")
    one_of(impl, IMPLS, "implementation")
    e = elem_bytes(recipe)
    T, h, V, L = batch * seq, cfg.d_model, cfg.vocab, cfg.n_layers
    parts = layer_parts(cfg, seq, batch, kernel, e, policy == "selective", norm, impl, routing)
    per_layer = sum(parts.values())
    full_layer = sum(layer_parts(cfg, seq, batch, kernel, e, norm=norm, impl=impl, routing=routing).values())
    at_softmax = softmax_moment(cfg, seq, batch, kernel, e, norm)
    segments = checkpoint_plan(policy, L)
    segment_of = {i: seg for seg in segments for i in seg}
    ckpt_input = e * T * h
    # Does a norm save its input tensor itself? The fused norm does, and so does HF's in fp32
    # (its fp32 "copy" is the input). Then a re-run segment's first norm saves the segment input
    # (counted once: ``shared``). If not (HF in bf16), tensors the Python code still references
    # are alive unsaved (``unsaved`` each): a block's input and its mid-block residual while the
    # block runs, and the last hidden state while the head and the loss run.
    keeps = norm == "fused" or e == 4
    shared, unsaved = (ckpt_input, 0) if keeps else (0, e * T * h)
    rope = 0 if cfg.positions else 2 * e * seq * cfg.head_dim

    def saved_before(i: int) -> int:
        """Saved bytes of layers 0..i-1 at the end of their forward (checkpointed: inputs)."""
        plain = sum(1 for j in range(i) if j not in segment_of)
        seg_inputs = sum(1 for seg in segments if seg[0] < i)
        return plain * per_layer + seg_inputs * ckpt_input

    layers = saved_before(L)
    outside = sum(b for b, _ in outside_terms(cfg, seq, batch, e, norm).values())
    loss = sum(b for b, _ in loss_terms(cfg, seq, batch, e, impl).values())
    # Hugging Face's forward rebinds the last hidden state to the final norm's output
    forward_peak = layers + outside + loss + (0 if impl == "hf" else unsaved)
    if softcap(cfg) and impl == "hf":   # Gemma 2: its final norm's moment; the softmax's not modelled
        at_softmax, forward_peak = 0, max(forward_peak, layers + rope + gemma_final_norm(cfg, seq, batch, e))
    if at_softmax:  # the last layer's softmax can top the loss (its input is in at_softmax)
        forward_peak = max(forward_peak, saved_before(L - 1) + rope + at_softmax + unsaved)
    recompute_peak = 0
    for seg in segments:
        # Re-running a segment in backward: held are the inputs of segments up to it, the
        # saved tensors of plain layers before it, and the re-run layers (their first norm may
        # save the segment input itself: ``shared``). The loss scalars are still alive.
        held = saved_before(seg[0]) + ckpt_input + rope + 8
        # the last re-run block's input is the segment input only in a one-layer segment
        block_input = unsaved if len(seg) > 1 else 0
        settled = held + len(seg) * full_layer - shared + block_input + unsaved
        peak_in_last = held + (len(seg) - 1) * full_layer + at_softmax - shared + block_input
        recompute_peak = max(recompute_peak, settled, peak_in_last if at_softmax else 0)
    if policy == "selective" and at_softmax:
        # backward re-runs the last layer's attention core: its scores are alive again, next
        # to everything saved before it, while the loss scalars are still held
        recompute_peak = saved_before(L - 1) + rope + at_softmax + 8
    return Activations(per_layer=per_layer, checkpoint_input=ckpt_input, layers=layers,
                       outside=outside, loss=loss, forward_peak=forward_peak,
                       recompute_peak=recompute_peak, parts=parts)


def outside_terms(cfg: ModelConfig, seq: int, batch: int, e: int, norm: str = "fused") -> dict[str, tuple[int, str]]:
    """Activations saved outside the layers (bytes, formula): RoPE's shared cos and sin tables
    (learned positions: the int64 position ids their lookup keeps), the final norm and the
    output head's input."""
    T, h = batch * seq, cfg.d_model
    n_bytes, n_formula, label = layer_norm(cfg, T, e, norm)
    # GPT-2's forward views the token ids (input_ids.view), so the tracer counts them too
    first = ({"position ids, token ids (int64)": (8 * seq + 8 * T, "8s + 8sb")} if cfg.positions else
             {"RoPE cos and sin tables": (2 * e * seq * cfg.head_dim, f"{2 * e}s*head_dim")})
    return first | {f"final norm {label}": (n_bytes, n_formula), "output head input": (e * T * h, f"{e}sbh")}


def loss_terms(cfg: ModelConfig, seq: int, batch: int, e: int, impl: str = "course") -> dict[str, tuple[int, str]]:
    """What lives at the loss (bytes, formula): the logits, their fp32 copy (none when already
    fp32), the fp32 log-softmax, two fp32 scalars (the loss and nll's total weight), and with
    ``impl="hf"`` the labels ``ForCausalLMLoss`` pads by one token (int64)."""
    T, V = batch * seq, cfg.vocab
    terms = {"logits" + (" (bf16)" if e == 2 else " (fp32)"): (e * T * V, f"{e}sbV")}
    if softcap(cfg):   # Gemma 2's final soft-cap: the tanh output beside the capped logits
        terms["logits soft-capped: tanh output"] = (e * T * V, f"{e}sbV")
    if e == 2:
        terms["logits, fp32 copy"] = (4 * T * V, "4sbV")
    terms["log-softmax (fp32)"] = (4 * T * V, "4sbV")
    terms["loss scalars (fp32)"] = (8, "8")
    if impl == "hf":   # and shifted: a copy unless one row (labels[..., 1:] is then contiguous)
        terms["labels padded by one (int64)"] = (8 * batch * (seq + 1), "8b(s+1)")
        if batch > 1:
            terms["labels shifted, a copy (int64)"] = (8 * batch * seq, "8bs")
    return terms



def step_table(cfg: ModelConfig, seq: int, batch: int = 1, kernel: str = "flash",
               recipe: str = "mixed", norm: str = "fused") -> str:
    """From one layer to the step: L layers, what is saved outside them and what lives at the
    loss, summed to the activations at the end of the forward (no checkpointing), in MB."""
    e = elem_bytes(recipe)
    layer = sum(layer_parts(cfg, seq, batch, kernel, e, norm=norm).values())
    rows = [(f"{cfg.n_layers} layers x {units.fmt(layer, 'MB', 0)}", cfg.n_layers * layer, "L x one layer")]
    rows += [(n, b, f) for n, (b, f) in outside_terms(cfg, seq, batch, e, norm).items()]
    rows += [(n, b, f) for n, (b, f) in loss_terms(cfg, seq, batch, e).items()]
    if norm == "hf" and e == 2:   # HF's bf16 norm does not save its input: the caller holds it
        rows.append(("last hidden state (held, not saved)", e * seq * batch * cfg.d_model, f"{e}sbh"))
    a = activations(cfg, seq, batch, kernel, "none", recipe, norm)
    head = f"{cfg.name}, seq {seq} x batch {batch}, {kernel}, no checkpointing"
    lines = [f"{head:44s}{'bytes':>14s}  formula"]
    lines += [f"{n:44s}{units.fmt(b, 'MB', 0):>14s}  {f}" for n, b, f in rows]
    lines.append(f"{'sum: held at the loss':44s}{units.fmt(sum(r[1] for r in rows), 'MB', 0):>14s}")
    lines.append(f"{'activation peak (formula)':44s}{units.fmt(a.peak, 'MB', 0):>14s}"
                 f"  {'at the loss' if a.peak == a.forward_peak else 'elsewhere: see the kernel'}")
    return "\n".join(lines)


def parts_table(cfg: ModelConfig, seq: int, batch: int = 1, recipe: str = "mixed",
                norm: str = "fused") -> str:
    """One layer's saved bytes by tensor group, per kernel, in MB (10^6), with each group's
    formula, and the totals in units of s*b*h."""
    sbh = seq * batch * cfg.d_model
    cols = {k: layer_terms(cfg, seq, batch, k, elem_bytes(recipe), norm=norm) for k in KERNELS}
    names = list(dict.fromkeys(n for terms in cols.values() for n in terms))
    formula = {n: f for terms in cols.values() for n, (_, f) in terms.items()}
    lines = [f"{'one layer of ' + cfg.name + f', seq {seq} x batch {batch}':44s}"
             + "".join(f"{k:>11s}" for k in KERNELS) + "  formula (bytes)"]
    for n in names:
        lines.append(f"{n:44s}" + "".join(
            f"{units.fmt(cols[k][n][0], 'MB', 0) if n in cols[k] else '-':>11s}" for k in KERNELS)
            + f"  {formula[n]}")
    totals = {k: sum(b for b, _ in cols[k].values()) for k in KERNELS}
    lines.append(f"{'total':44s}" + "".join(f"{units.fmt(totals[k], 'MB', 0):>11s}" for k in KERNELS))
    lines.append(f"{'total / (s*b*h)':44s}" + "".join(f"{totals[k] / sbh:>11.1f}" for k in KERNELS))
    lines.append("s, b: sequence, micro-batch; h: hidden; k: key/value width; F: MLP width; a: query heads")
    return "\n".join(lines)
