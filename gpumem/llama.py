"""A compact Llama (RMSNorm, GQA attention with RoPE, SwiGLU MLP), written to be traced.

Three attention kernels, so the course can show where the s^2 term comes from:

- ``flash``: ``F.scaled_dot_product_attention`` with ``enable_gqa``. On CPU PyTorch runs its
  flash kernel, which saves q, k, v, the output and a per-row logsumexp: O(s) per head.
- ``naive``: scores and softmax probabilities materialised in bf16; K and V expanded to all
  query heads, as a from-scratch implementation does.
- ``eager``: what Hugging Face's eager Llama attention keeps with dropout 0: an fp32 softmax
  (``softmax(..., dtype=float32)``) and its bf16 copy for the matmul, i.e. 6 bytes per score.

Activation-checkpoint policies are applied by :func:`checkpoint_plan` and ``Llama.forward``.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .errors import one_of
from .models import ModelConfig

KERNELS = ("flash", "naive", "eager")
POLICIES = ("none", "full", "every-2", "every-other", "selective")


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
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5          # (b, a, s, s)
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    if kernel == "naive":
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)  # bf16 (b, a, s, s)
    else:  # eager, as Hugging Face: additive mask, fp32 softmax, cast back for the matmul
        mask = torch.zeros(s, s, dtype=q.dtype, device=q.device).masked_fill(future, torch.finfo(q.dtype).min)
        probs = F.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
    return probs @ v


class Attention(nn.Module):
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
            o = checkpoint(core_attention, q, k, v, kernel, use_reentrant=False)
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
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kernel: str, selective: bool = False):
        h = x + self.attn(self.attn_norm(x), cos, sin, kernel, selective)
        return h + self.mlp(self.mlp_norm(h))


def checkpoint_plan(policy: str, n_layers: int) -> list[list[int]]:
    """Group layer indices into checkpointed segments; layers in no segment run normally.

    ``full``: each layer its own segment. ``every-2``: segments of two consecutive layers.
    ``every-other``: layers 0, 2, 4, ... checkpointed alone, the rest not (torchtitan's
    ``selective_ac_option="2"``). ``none`` and ``selective``: no whole-layer segments.
    """
    one_of(policy, POLICIES, "checkpoint policy")
    if policy == "full":
        return [[i] for i in range(n_layers)]
    if policy == "every-2":
        return [list(range(i, min(i + 2, n_layers))) for i in range(0, n_layers, 2)]
    if policy == "every-other":
        return [[i] for i in range(0, n_layers, 2)]
    return []


class Llama(nn.Module):
    """Llama-3 architecture for any :class:`ModelConfig`; loss is fp32 cross-entropy."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
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
                x = checkpoint(self._segment, x, cos, sin, kernel, seg[0], len(seg), use_reentrant=False)
                i += len(seg)
            else:
                x = self.layers[i](x, cos, sin, kernel, selective)
                i += 1
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, self.cfg.vocab), targets.reshape(-1))

    def _segment(self, x, cos, sin, kernel, first, count):
        for layer in self.layers[first:first + count]:
            x = layer(x, cos, sin, kernel)
        return x
