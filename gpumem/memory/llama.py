"""A compact Llama (RMSNorm, GQA attention with RoPE, SwiGLU MLP), written to be traced.

Three attention kernels, so the course can show where the s^2 term comes from:

- ``flash``: ``F.scaled_dot_product_attention`` with ``enable_gqa``. On CPU PyTorch runs its
  flash kernel, which saves q, k, v, the output and a per-row logsumexp: O(s) per head.
- ``naive``: scores and softmax probabilities materialised in bf16; K and V expanded to all
  query heads, as a from-scratch implementation does.
- ``eager``: what Hugging Face's eager Llama attention keeps with dropout 0: an fp32 softmax
  (``softmax(..., dtype=float32)``) and its bf16 copy for the matmul, i.e. 6 bytes per score.

Two RMSNorms (``norm``): ``fused`` saves what a fused GPU kernel saves; ``hf`` is Hugging Face's
``LlamaRMSNorm`` line for line, which autograd makes save an fp32 copy of its input as well.

Activation-checkpoint policies are planned by ``policies.checkpoint_plan`` and applied by
``Llama.forward``.
"""

import contextlib
import threading

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import one_of
from .models import ModelConfig
from .policies import KERNELS, NORMS, checkpoint_plan

_state = threading.local()


def recomputing() -> bool:
    """True while torch.utils.checkpoint re-runs a forward inside backward (tracers ask)."""
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def recompute_marker():
    """Mark the code inside as recomputation, so :func:`recomputing` (and the tracers) see it."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _contexts():
    return contextlib.nullcontext(), recompute_marker()


def ckpt(fn, *args):
    """Non-reentrant activation checkpoint whose recomputation a tracer can recognise."""
    return checkpoint(fn, *args, use_reentrant=False, context_fn=_contexts)


class _FusedRMSNormFn(torch.autograd.Function):
    """RMSNorm that saves only its input and the fp32 1/rms per row, as fused GPU kernels do
    (Apex, Transformer Engine, PyTorch's CUDA ``_fused_rms_norm``). PyTorch's CPU RMSNorm is a
    composite of ops that would also save two fp32 copies of the input."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        acc = torch.promote_types(x.dtype, torch.float32)                # fp32 (fp64 stays fp64)
        rstd = torch.rsqrt(x.to(acc).pow(2).mean(-1, keepdim=True) + eps)   # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return (x.to(acc) * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        acc = rstd.dtype
        xhat = x.to(acc) * rstd
        gw = grad.to(acc) * weight.to(acc)
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dweight = (grad.to(acc) * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dweight.to(weight.dtype), None


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale, saving only its input and an fp32 1/rms per row for backward."""
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return _FusedRMSNormFn.apply(x, self.weight, self.eps)


class HFRMSNorm(nn.Module):
    """Hugging Face's ``LlamaRMSNorm`` (transformers ``modeling_llama.py``), same ops: ``pow``
    saves the fp32 input, ``rsqrt`` its result, the weight multiply the bf16 normalised input."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return self.weight * hidden_states.to(input_dtype)


def make_norm(norm: str, dim: int, eps: float) -> nn.Module:
    """The RMSNorm named by ``norm``: ``fused`` (:class:`RMSNorm`) or ``hf`` (:class:`HFRMSNorm`)."""
    return {"fused": RMSNorm, "hf": HFRMSNorm}[one_of(norm, NORMS, "norm")](dim, eps)


def rope_tables(seq: int, head_dim: int, theta: float, dtype, device=None):
    """cos and sin tables of shape (seq, head_dim), shared by every layer of one forward."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin):
    """Rotate pairs of channels; x: (b, heads, s, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def repeat_kv(x, n_rep: int):
    """(b, kv_heads, s, d) -> (b, kv_heads * n_rep, s, d), a copy, as naive GQA code does."""
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def core_attention(q, k, v, kernel: str):
    """Causal attention of q (b, a, s, d) over k, v (b, kv, s, d). Returns (b, a, s, d)."""
    if kernel == "flash":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    s = q.shape[2]
    # Written as Hugging Face's eager attention is: each step reassigns, so the previous
    # (b, a, s, s) tensor is freed and only the softmax's input and output overlap.
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5          # (b, a, s, s)
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    if kernel == "naive":
        scores = scores.masked_fill(future, float("-inf"))
        probs = scores.softmax(dim=-1)                                 # bf16, saved
    else:  # eager: additive mask, fp32 softmax (saved), bf16 copy for the matmul (saved)
        scores = scores + torch.zeros(s, s, dtype=q.dtype, device=q.device).masked_fill(
            future, torch.finfo(q.dtype).min)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    del scores
    return probs @ v


class Attention(nn.Module):
    """GQA attention with RoPE; the core uses the chosen kernel (recomputed in backward if selective)."""
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_dim, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, kernel: str, selective: bool = False):
        b, s, _ = x.shape
        c = self.cfg
        q = self.wq(x).view(b, s, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if selective:  # keep q, k, v; recompute the attention core in backward
            o = ckpt(core_attention, q, k, v, kernel)
        else:
            o = core_attention(q, k, v, kernel)
        return self.wo(o.transpose(1, 2).reshape(b, s, c.d_model))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """One transformer layer: pre-norm attention and pre-norm SwiGLU MLP, each with a residual connection."""
    def __init__(self, cfg: ModelConfig, norm: str = "fused"):
        super().__init__()
        self.attn_norm = make_norm(norm, cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = make_norm(norm, cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kernel: str, selective: bool = False):
        h = x + self.attn(self.attn_norm(x), cos, sin, kernel, selective)
        return h + self.mlp(self.mlp_norm(h))


class Llama(nn.Module):
    """Llama-3 architecture for any :class:`ModelConfig`; loss is fp32 cross-entropy."""

    def __init__(self, cfg: ModelConfig, norm: str = "fused"):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, norm) for _ in range(cfg.n_layers))
        self.norm = make_norm(norm, cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens, targets, kernel: str = "flash", policy: str = "none"):
        one_of(kernel, KERNELS, "attention kernel")
        segments = checkpoint_plan(policy, self.cfg.n_layers)
        starts = {seg[0]: seg for seg in segments}
        x = self.embed(tokens)
        cos, sin = rope_tables(tokens.shape[1], self.cfg.head_dim, self.cfg.rope_theta, x.dtype, x.device)
        selective = policy == "selective"
        i = 0
        while i < self.cfg.n_layers:
            if i in starts:
                seg = starts[i]
                x = ckpt(self._segment, x, cos, sin, kernel, seg[0], len(seg))
                i += len(seg)
            else:
                x = self.layers[i](x, cos, sin, kernel, selective)
                i += 1
        logits = self.head(self.norm(x))
        flat = targets if targets.dim() == 1 else targets.reshape(-1)   # pass 1-D ids to avoid a view
        return F.cross_entropy(logits.float().view(-1, self.cfg.vocab), flat)

    def _segment(self, x, cos, sin, kernel, first, count):
        for layer in self.layers[first:first + count]:
            x = layer(x, cos, sin, kernel)
        return x
