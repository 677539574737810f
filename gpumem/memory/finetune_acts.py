"""Activations of a LoRA or QLoRA step, by formula: what a frozen base still saves (torch-free).

Autograd saves a tensor for a gradient that will be computed, and only then (the generated
``mm``/``addmm`` backward nodes keep ``self`` only when ``mat2``'s gradient is needed, and
``mat2`` only when ``self``'s is). So, with the weights frozen (notation as in ``activations``;
e = 2, bf16):

* a frozen bf16 projection ``y = x W^T`` keeps W (the parameter itself: no new bytes) for x's
  gradient and not x: the projection inputs of full fine-tuning (q/k/v input, W_o input, MLP
  input, the SwiGLU product) are no longer saved by the base. bitsandbytes' ``MatMul4Bit``
  keeps only the packed weight (``ctx.tensors = (None, B)``), and dequantises it again in backward;
* an adapter ``B(A(x)) * scaling`` keeps its input for A's gradient and A's output (T x r) for
  B's; whether the input is the base's own tensor or a copy depends on peft's casts:
  - bf16 base (``lora.Linear.forward``): ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``
    always; with fp32 adapters (peft's default) that is an fp32 copy, and under autocast the
    matmul casts it back to a new bf16 tensor: each adapted projection saves its own 2-byte copy
    (4-byte without autocast). With bf16 adapters the input is shared;
  - 4-bit base (``lora.bnb.Linear4bit.forward``): no cast under autocast (``requires_conversion =
    not torch.is_autocast_enabled()``): the input is shared; without autocast, fp32 adapters copy.
    That check without a device argument reads CUDA's autocast only: under CPU autocast it is
    False, so on a CPU (``device="cpu"``) QLoRA copies as LoRA does (checked with saved-tensor
    hooks on peft 0.21.2, bitsandbytes 0.50.2, torch's CPU autocast);
  - under autocast the fp32 A and B are cast to bf16 once and cached (leaf tensors that require
    grad): 2 bytes per adapter element, alive while the step's graph is (``adapter_casts``);
* everything that feeds a gradient still saves as before: both norms (their input and 1/rms),
  the attention core (q, k, v, output, logsumexp), SiLU's input, the gate/up product's two
  factors, the final norm; the output head is frozen, so its input is not saved;
* layer 0's input (the frozen embedding's output) needs no gradient: its attention norm saves
  nothing, and without a q/k/v adapter neither does its attention core (``first_layer``). With
  only some of q/k/v adapted, the naive and eager kernels' matmuls in layer 0 keep one operand
  fewer than counted here (an approximation on the safe side, in that one layer only).
* Hugging Face's ``LlamaRMSNorm`` (``norm="hf"``) multiplies its frozen weight by the normed
  input: that product no longer saves the normed bf16 copy, only the fp32 input and the 1/rms
  (4Th + 4T); ``impl="hf"`` is transformers' own model as ``activations`` counts it (labels,
  the last hidden state rebound). transformers' gradient checkpointing with a frozen embedding
  needs ``enable_input_require_grads()`` (peft's ``prepare_model_for_kbit_training`` calls it),
  which makes layer 0 like the others: not counted here.
Dropout on the adapter path (peft's default ``lora_dropout=0.0`` is ``nn.Identity``) is not
counted. Checkpointing as in ``activations``: segment inputs, one segment re-run in backward.
"""

from ..errors import UsageError, one_of, positive_int
from .activations import activations, layer_terms, loss_terms, outside_terms, softmax_moment
from .finetune_setup import Finetune, adapter_tensors, matrices, validate
from .policies import KERNELS, POLICIES, checkpoint_plan


def copy_bytes(ft: Finetune, device: str = "cuda") -> int:
    """Bytes per element of the input copy each adapted projection saves (0: shared)."""
    if ft.adapter_dtype == "bf16":
        return 0
    if ft.base_dtype == "nf4" and device == "cuda":
        return 0 if ft.autocast else 4
    return 2 if ft.autocast else 4


def layer_saved(cfg, seq: int, batch: int, kernel: str, ft: Finetune, grad_in: bool,
                selective: bool = False, norm: str = "fused", impl: str = "course",
                device: str = "cuda") -> dict[str, int]:
    """Saved bytes of one layer with a frozen base, by tensor group; ``grad_in``: whether the
    layer's input needs a gradient (every layer after the first)."""
    T, e, r, tg = batch * seq, 2, ft.lora_rank, set(ft.lora_targets)
    h, q, F = cfg.d_model, cfg.q_dim, cfg.ffn
    copy, e_out = copy_bytes(ft, device), 2 if ft.autocast or ft.adapter_dtype == "bf16" else 4
    core = grad_in or bool(tg & {"q", "k", "v"})       # does the attention core record a graph?
    flash_out = kernel == "flash" and not selective and core   # SDPA saves its output, W_o's input

    def inputs(group, width, shared_saved=False):
        adapted = [t for t in group if t in tg]
        if not adapted:
            return 0
        if copy == 0:
            return 0 if shared_saved else e * T * width
        return copy * T * width * len(adapted)

    out: dict[str, int] = {}
    frozen_norm = e * T * h if norm == "hf" else 0       # HF's weight multiply keeps no normed copy
    for name, (b, _) in layer_terms(cfg, seq, batch, kernel, e, selective, norm, impl).items():
        if name.startswith(("attn norm", "mlp norm")):
            b -= frozen_norm
        elif name.startswith(("q norm per head", "k norm per head")) and norm == "hf":   # Qwen3's q/k norms
            b -= e * T * (q if name[0] == "q" else cfg.kv_dim)
        if name.startswith("attn norm"):
            out[name] = b if grad_in else 0
        elif name.startswith("mlp norm"):
            mlp_norm = (name, b)
        elif name not in ("q/k/v projection input", "W_o input", "mlp input", "gate, silu, up, product"):
            out[name] = b if core else 0               # the attention core, q/k norms
    out["adapter inputs q/k/v"] = inputs(("q", "k", "v"), h)
    out["adapter input o"] = inputs(("o",), q, flash_out)
    grad_mid = grad_in or core or "o" in tg            # does the residual stream need a gradient?
    out[mlp_norm[0]] = mlp_norm[1] if grad_mid else 0
    out["adapter inputs gate/up"] = inputs(("gate", "up"), h)
    g_grad, u_grad = grad_mid or "gate" in tg, grad_mid or "up" in tg
    out["gate (silu input)"] = e * T * F if g_grad else 0
    out["silu, up (the product's factors)"] = e * T * F * (g_grad + u_grad)
    out["adapter input down"] = inputs(("down",), F)
    dims = matrices(cfg)
    out["adapters' A outputs (T x r)"] = sum(e_out * T * r for t in dims if t in tg)
    return out


def finetune_activations(cfg, ft: Finetune, seq: int, batch: int, kernel: str = "flash",
                         policy: str = "none", norm: str = "fused", impl: str = "course",
                         device: str = "cuda") -> dict[str, int]:
    """Activation bytes by part (``layer: ...`` for a layer after the first) and in total:
    ``per_layer``, ``first_layer``, ``checkpoint_input``, ``layers`` (at the end of the forward),
    ``outside``, ``loss``, ``adapter_casts``, ``forward_peak``, ``recompute_peak``, ``peak``.
    Full fine-tuning (``adapter="none"``) is ``activations.activations`` unchanged."""
    validate(ft)
    seq, batch = positive_int(seq, "sequence length"), positive_int(batch, "micro-batch")
    one_of(kernel, KERNELS, "attention kernel")
    one_of(policy, POLICIES, "checkpoint policy")
    if not ft.lora:
        a = activations(cfg, seq, batch, kernel, policy, ft.recipe, norm, impl)
        return ({f"layer: {k}": v for k, v in a.parts.items()}
                | {"per_layer": a.per_layer, "first_layer": a.per_layer, "checkpoint_input": a.checkpoint_input,
                   "layers": a.layers, "outside": a.outside, "loss": a.loss, "adapter_casts": 0,
                   "forward_peak": a.forward_peak, "recompute_peak": a.recompute_peak, "peak": a.peak})
    if cfg.positions:
        raise UsageError(f"LoRA activations are counted for RoPE models; {cfg.name} has learned positions")
    selective = policy == "selective"
    T, e, L = batch * seq, 2, cfg.n_layers
    later = layer_saved(cfg, seq, batch, kernel, ft, True, selective, norm, impl, device)
    first = layer_saved(cfg, seq, batch, kernel, ft, False, selective, norm, impl, device)
    per = [sum(first.values())] + [sum(later.values())] * (L - 1)
    casts = 2 * sum(adapter_tensors(cfg, ft.lora_rank, ft.lora_targets)) if (
        ft.autocast and ft.adapter_dtype == "fp32") else 0
    ckpt_input, rope = e * T * cfg.d_model, 2 * e * seq * cfg.head_dim
    frozen_norm = e * T * cfg.d_model if norm == "hf" else 0
    outside = sum(b for n, (b, _) in outside_terms(cfg, seq, batch, e, norm).items()
                  if n != "output head input") - frozen_norm
    loss = sum(b for b, _ in loss_terms(cfg, seq, batch, e, impl).values())
    # HF's bf16 norm does not save its input: the block's input and the mid-block residual are
    # alive unsaved while a block runs, the last hidden state at the loss (``activations``)
    shared_input, unsaved = (ckpt_input, 0) if norm == "fused" else (0, ckpt_input)
    segments = checkpoint_plan(policy, L)
    in_segment = {i for seg in segments for i in seg}

    def saved_before(i: int) -> int:
        return (sum(per[j] for j in range(i) if j not in in_segment)
                + ckpt_input * sum(1 for seg in segments if seg[0] < i))

    # at a naive/eager softmax: what ``softmax_moment`` counts (the normed input is alive, held by
    # the caller) plus this layer's q/k/v adapters' copies and A outputs
    qkv = [t for t in ("q", "k", "v") if t in ft.lora_targets]
    at_softmax = softmax_moment(cfg, seq, batch, kernel, e, norm)
    if at_softmax:
        at_softmax += -frozen_norm + copy_bytes(ft, device) * T * cfg.d_model * len(qkv) + (
            2 if ft.autocast or ft.adapter_dtype == "bf16" else 4) * T * ft.lora_rank * len(qkv)
    layers = saved_before(L)
    # transformers' forward keeps the final norm's output (``last_hidden_state``) until the loss:
    # the frozen head saves nothing, so it is alive unsaved there (the course's Llama frees it)
    forward_peak = layers + outside + loss + casts + (ckpt_input if impl == "hf" else unsaved)
    if at_softmax:
        forward_peak = max(forward_peak, saved_before(L - 1) + rope + at_softmax + casts + unsaved)
    recompute_peak = 0
    for seg in segments:
        held = saved_before(seg[0]) + ckpt_input + rope + 8 + casts
        shared = shared_input if seg[0] > 0 else 0     # a re-run layer's first norm saves its input
        block_input = unsaved if len(seg) > 1 else 0
        rerun = [per[i] for i in seg]
        recompute_peak = max(recompute_peak, held + sum(rerun) - shared + block_input + unsaved,
                             held + sum(rerun[:-1]) + at_softmax - shared + block_input if at_softmax else 0)
    if selective and at_softmax:
        recompute_peak = saved_before(L - 1) + rope + at_softmax + 8 + casts
    return ({f"layer: {k}": v for k, v in later.items()}
            | {"per_layer": per[-1], "first_layer": per[0], "checkpoint_input": ckpt_input, "layers": layers,
               "outside": outside, "loss": loss, "adapter_casts": casts, "forward_peak": forward_peak,
               "recompute_peak": recompute_peak, "peak": max(forward_peak, recompute_peak)})
