"""What a checkpoint plan costs, by formula: activation bytes and FLOPs (torch-free).

Bytes (flash attention, fused RMSNorm; e bytes per element, T = b*s tokens): one layer keeps
``activations.layer_parts`` (about 41*s*b*h bytes for Llama-3); a checkpointed segment keeps
only its input, e*T*h, and re-runs its layers in backward, when the layers before it still hold
what they saved. Under SAC (PyTorch's selective checkpointing with the matmul-keeping policy) a
layer keeps its input, the outputs of its seven matmuls and of the attention kernel (with the
kernel's fp32 logsumexp): e*T*(5h + 2k + 2F) + 4*a*T, and re-runs its norms, RoPE, SiLU and
products in backward.

FLOPs, counted as ``torch.utils.flop_counter`` counts them: a matmul of T tokens through a
d_in x d_out weight is 2*T*d_in*d_out forward and twice that backward (input and weight
gradients); attention's core is 4*b*s^2*h forward (QK^T and PV, the causal half not subtracted)
and 10*b*s^2*h backward (the flash kernel recomputes QK^T, then four more matmuls). The
embedding lookup and pointwise ops count zero. Full recomputation re-runs the layers' forward,
so it adds the layers' share of one forward; PyTorch's non-reentrant checkpoint stops each
re-run once the last tensor backward needs exists (``early_stop``), which skips the final W_down
matmul of every segment. ``tests/test_03_*`` check every figure against traces and counters.
"""

import math

from .activations import elem_bytes, layer_parts, norm_bytes
from .models import ModelConfig
from .recompute_plans import Plan, plan as make_plan, segments_of

IMPLS = ("torch", "scratch")

# The two prices of a re-run, by name (``impl`` of :func:`step_flops`): PyTorch's non-reentrant
# checkpoint stops before the segment's last matmul; DeepSpeed's, Megatron's, use_reentrant=True
# and the course's from-scratch checkpoint re-run the whole segment.
PRICE_NAMES = {"torch": "early-stop re-run", "scratch": "whole-segment re-run"}


def _plan(p: str | Plan, cfg: ModelConfig) -> Plan:
    return make_plan(p, cfg.n_layers) if isinstance(p, str) else p


def sac_layer_bytes(cfg: ModelConfig, seq: int, batch: int = 1, recipe: str = "mixed") -> int:
    """Bytes one layer keeps under SAC: its input, every matmul output, the attention kernel's
    output and its fp32 logsumexp."""
    e, T, h, k, F, a = elem_bytes(recipe), batch * seq, cfg.d_model, cfg.kv_dim, cfg.ffn, cfg.n_heads
    return e * T * (5 * h + 2 * k + 2 * F) + 4 * a * T


def activation_bytes(cfg: ModelConfig, seq: int, batch: int = 1, plan: str | Plan = "none",
                     impl: str = "torch", recipe: str = "mixed") -> dict:
    """Activation bytes of one step under ``plan`` (flash attention, fused norm): saved at the
    end of the forward, the peak of re-running a segment, and the step's peak."""
    p = _plan(plan, cfg)
    e, T, h, V, L = elem_bytes(recipe), batch * seq, cfg.d_model, cfg.vocab, cfg.n_layers
    full = sum(layer_parts(cfg, seq, batch, "flash", e).values())
    kept = sac_layer_bytes(cfg, seq, batch, recipe) if p.sac else \
        sum(layer_parts(cfg, seq, batch, "flash", e, selective=p.core).values())
    boundary = e * T * h
    rope = 2 * e * seq * cfg.head_dim
    segments = [] if p.sac else list(p.segments)
    in_segment = {i for seg in segments for i in seg}

    def saved_before(i: int) -> int:
        plain = sum(1 for j in range(i) if j not in in_segment)
        return plain * kept + sum(boundary for seg in segments if seg[0] < i)

    layers = saved_before(L)
    outside = rope + norm_bytes(T, h, e) + e * T * h      # rope tables, final norm, head input
    loss = (e + (4 if e == 2 else 0) + 4) * T * V + 8      # logits, fp32 copy, log-softmax, 2 scalars
    forward_peak = layers + outside + loss
    # backward of the last layer begins with every layer's saved bytes still held
    recompute_peak, backward_start = 0, layers + rope + 8
    for seg in segments:
        held = saved_before(seg[0]) + boundary + rope + 8
        settled = held + len(seg) * full - boundary        # the re-run's first norm keeps the input
        if impl != "torch":                                 # re-run to the end: W_down's output and
            settled += 2 * boundary                         # the residual sum are alive for a moment
        recompute_peak = max(recompute_peak, settled)
    if p.sac:  # re-running the last layer restores its pointwise tensors (full - kept) next to
        # every layer's kept bytes, and the re-run goes on to the residual sum at its end
        recompute_peak = layers + rope + 8 + (full - kept) + boundary
    return {"saved": forward_peak, "layers": layers, "outside": outside, "loss": loss,
            "per_layer": kept, "checkpoint": boundary, "forward_peak": forward_peak,
            "recompute_peak": recompute_peak, "layer_peak": max(backward_start, recompute_peak),
            "peak": max(forward_peak, recompute_peak)}


def layer_flops(cfg: ModelConfig, seq: int, batch: int = 1, causal: bool = False) -> dict:
    """Forward FLOPs of one layer: its matmuls, attention's core, and the W_down matmul alone;
    ``causal``: the core as a causal flash kernel executes it (half the s x s tiles) instead of
    PyTorch's count of the whole matrix."""
    T, h, k, F = batch * seq, cfg.d_model, cfg.kv_dim, cfg.ffn
    matmuls = 2 * T * (2 * h * h + 2 * h * k + 3 * h * F)
    core = 4 * batch * seq * seq * h // (2 if causal else 1)
    return {"matmuls": matmuls, "core": core, "down": 2 * T * h * F, "total": matmuls + core}


def step_flops(cfg: ModelConfig, seq: int, batch: int = 1, plan: str | Plan = "none",
               impl: str = "torch", causal: bool = False) -> dict:
    """FLOPs of forward, backward and recompute under ``plan`` (see the module docstring);
    ``causal``: attention's core halved, as a causal kernel executes it (:func:`layer_flops`)."""
    p = _plan(plan, cfg)
    lay = layer_flops(cfg, seq, batch, causal)
    head = 2 * batch * seq * cfg.d_model * cfg.vocab
    L = cfg.n_layers
    forward = L * lay["total"] + head
    backward = L * (2 * lay["matmuls"] + 5 * lay["core"] // 2) + 2 * head
    if p.core:
        recompute = L * lay["core"]
    elif p.sac:
        recompute = 0                     # matmuls and attention are kept; pointwise ops are free
    else:
        recompute = len(p.checkpointed()) * lay["total"]
        if impl == "torch":
            recompute -= len(p.segments) * lay["down"]
    total = forward + backward
    return {"forward": forward, "backward": backward, "recompute": recompute,
            "overhead": recompute / total}


def best_segment_length(cfg: ModelConfig, seq: int, batch: int = 1, recipe: str = "mixed",
                        with_loss: bool = False) -> int:
    """The segment length k that minimises the layers' re-run peak (the checkpoints before a
    segment plus its k layers): about sqrt(n * boundary / layer), not Chen's sqrt(n), because a
    layer keeps some twenty times its input. With ``with_loss`` it minimises the step's peak,
    which the loss's logits set at the end of the forward: longer segments are then free until
    their re-run outgrows the logits, so the best k is longer."""
    key = "peak" if with_loss else "recompute_peak"

    def peak(k: int) -> int:
        p = Plan(f"every-{k}", cfg.n_layers, segments_of(k, cfg.n_layers))
        return activation_bytes(cfg, seq, batch, p, recipe=recipe)[key]
    return min(range(1, cfg.n_layers + 1), key=lambda k: (peak(k), k))


def chen_estimate(n_layers: int, boundary: float, interior: float) -> float:
    """Chen et al.'s continuous optimum sqrt(n * boundary / interior) (sqrt(n) for equal sizes)."""
    return math.sqrt(n_layers * boundary / interior)
