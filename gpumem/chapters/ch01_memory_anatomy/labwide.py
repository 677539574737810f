"""Lab 01, part 2: the course's Llama layer with a wider attention and q/k norms, and its truth
from real tensors.

What chapter 01's table (and ``gpumem.memory.llama``'s layer) never has:

- an attention as wide as ``n_heads * head_dim`` with ``head_dim`` given by the configuration,
  not ``d_model // n_heads`` (Qwen3-32B: d_model 5120, 64 heads of 128, so W_q maps 5120 to
  8192; Qwen3's ``config.json``, ``head_dim``; Gemma's configurations do the same);
- q/k norms (``qk_norm``), an RMSNorm on q and one on k after their projections, before RoPE,
  in one of two placements:

  - ``"per-head"``, Qwen3's: over each head's ``head_dim`` numbers, after the split into heads
    (transformers ``modeling_qwen3.py``, ``Qwen3Attention.forward``:
    ``self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)``);
  - ``"full"``, OLMo 2's: over the whole projection, ``n_heads * head_dim`` numbers for q and
    ``n_kv_heads * head_dim`` for k, before the split (transformers ``modeling_olmo2.py``,
    ``Olmo2Attention.__init__``: ``self.q_norm = Olmo2RMSNorm(config.num_attention_heads *
    self.head_dim, ...)``; ``Olmo2Attention.forward``: ``self.q_norm(self.q_proj(hidden_states))``,
    then ``.view(hidden_shape)``);

  both run the course's fused RMSNorm (``llama.RMSNorm``, as fused kernels such as Liger's run
  it), not transformers' eager one.

Everything else is part 2's layer: the fused RMSNorms, RoPE, ``llama.core_attention`` under the
three kernels and the SwiGLU MLP. :func:`measure` counts what autograd saves in one real bf16
forward, as :func:`.variants.measure` does (autograd's C hook entry points bound there at import).
``gpumem.memory.activations.layer_parts`` counts the wide attention and Qwen3's per-head norms
(``ModelConfig.qk_norm``) but has no full-width q/k norm: its count of that layer is wrong (a
1/rms per head, not one per row; ``tests/test_lab01_adversarial.py`` holds it to that), so a
copy of the library does not answer part 2's ``"full"`` cases, which every check grades first.
"""
import torch
from torch import nn

from gpumem.memory import llama
from gpumem.memory.models import ModelConfig

from . import variants

_truth: dict = {}          # (shape, kernel, qk_norm) -> (saved bytes, parameters); see labguard
QK_NORMS = ("none", "per-head", "full")      # no q/k norms; Qwen3's placement; OLMo 2's
KEYS = ("d_model", "n_heads", "n_kv_heads", "head_dim", "ffn", "seq", "batch", "kernel", "qk_norm")


class WideAttention(nn.Module):
    """GQA attention with RoPE, ``n_heads * head_dim`` wide, with q/k norms per head (Qwen3),
    over the whole width (OLMo 2) or none."""

    def __init__(self, cfg: ModelConfig, qk_norm: str):
        super().__init__()
        self.cfg, self.qk_norm = cfg, qk_norm
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, q, bias=False)
        self.wk = nn.Linear(cfg.d_model, kv, bias=False)
        self.wv = nn.Linear(cfg.d_model, kv, bias=False)
        self.wo = nn.Linear(q, cfg.d_model, bias=False)
        if qk_norm != "none":
            widths = (cfg.head_dim, cfg.head_dim) if qk_norm == "per-head" else (q, kv)
            self.q_norm = llama.RMSNorm(widths[0], cfg.norm_eps)
            self.k_norm = llama.RMSNorm(widths[1], cfg.norm_eps)

    def forward(self, x, cos, sin, kernel: str):
        b, s, _ = x.shape
        c = self.cfg
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, s, c.n_heads, c.head_dim)
        k = k.view(b, s, c.n_kv_heads, c.head_dim)
        v = v.view(b, s, c.n_kv_heads, c.head_dim).transpose(1, 2)
        if self.qk_norm == "per-head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = llama.apply_rope(q, cos, sin), llama.apply_rope(k, cos, sin)
        o = llama.core_attention(q, k, v, kernel)
        return self.wo(o.transpose(1, 2).reshape(b, s, c.n_heads * c.head_dim))


class WideBlock(nn.Module):
    """Part 2's layer: pre-norm :class:`WideAttention` and pre-norm SwiGLU MLP, with residuals."""

    def __init__(self, cfg: ModelConfig, qk_norm: str):
        super().__init__()
        self.attn_norm = llama.RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = WideAttention(cfg, qk_norm)
        self.mlp_norm = llama.RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = llama.MLP(cfg)

    def forward(self, x, cos, sin, kernel: str):
        h = x + self.attn(self.attn_norm(x), cos, sin, kernel)
        return h + self.mlp(self.mlp_norm(h))


def config(d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int, qk_norm: str) -> ModelConfig:
    """A one-layer configuration of these widths (the vocabulary is unused); ``ModelConfig``'s
    ``qk_norm`` is Qwen3's per-head placement, so it is set only for ``"per-head"``."""
    if qk_norm not in QK_NORMS:
        raise ValueError(f"qk_norm must be one of {QK_NORMS}, not {qk_norm!r}")
    return ModelConfig("lab01-wide", 1, d_model, n_heads, n_kv_heads, ffn, 16, explicit_head_dim=head_dim,
                       qk_norm=qk_norm == "per-head")


def source() -> str:
    """The code part 2 prints: the block, the fused RMSNorm's forward, the attention, RoPE, the
    attention core, ``repeat_kv`` and the MLP (comments removed: they would name what is saved)."""
    import inspect
    import textwrap
    parts = [("WideBlock", WideBlock.forward), ("RMSNorm (fused)", llama._FusedRMSNormFn.forward),
             ("WideAttention", WideAttention), ("apply_rope", llama.apply_rope),
             ("core_attention", llama.core_attention), ("repeat_kv", llama.repeat_kv),
             ("MLP", llama.MLP.forward)]
    return "\n\n".join(f"# {title}\n" + variants.without_comments(textwrap.dedent(inspect.getsource(obj)))
                       for title, obj in parts)


def measure(d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int, seq: int, batch: int,
            kernel: str, qk_norm: str) -> tuple[int, int]:
    """(bytes one layer saves for backward, the layer's parameters), from one real bf16 forward:
    each saved storage once, less the parameters and the RoPE tables all layers share."""
    key = (d_model, n_heads, n_kv_heads, head_dim, ffn, seq, batch, kernel, qk_norm)
    if key in _truth:
        return _truth[key]
    cfg = config(d_model, n_heads, n_kv_heads, head_dim, ffn, qk_norm)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        block = WideBlock(cfg, qk_norm).to(torch.bfloat16)
        cos, sin = llama.rope_tables(seq, head_dim, cfg.rope_theta, torch.bfloat16)
        x0 = torch.randn(batch, seq, d_model, dtype=torch.bfloat16, requires_grad=True)
        seen: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
            return t
        recording = variants._GRAD_ON()
        variants._SET_GRAD(True)
        variants._PUSH_HOOKS(pack, lambda t: t)
        try:
            out = block(x0 * 1, cos, sin, kernel)       # x0 * 1: the input is freed unless saved
        finally:
            variants._POP_HOOKS()
            variants._SET_GRAD(recording)
        del out
    for t in [*block.parameters(), cos, sin]:
        seen.pop(t.untyped_storage().data_ptr(), None)
    _truth[key] = (sum(seen.values()), sum(p.numel() for p in block.parameters()))
    return _truth[key]


HEADS = (8, 12, 16, 20, 24)        # head widths drawn (even: RoPE rotates pairs)


def draw_shape(rng) -> dict:
    """A shape the lab never shows: GQA ratio 1-4 (at least 2 key/value heads: with one and
    batch 1, ``repeat_kv``'s reshape is a view, not a copy), d_model = n_heads * a head width
    that is not ``head_dim`` (so the plain Llama layer exists at the same d_model, for hints)."""
    kv, rep = rng.randint(2, 4), rng.randint(1, 4)
    plain, head = rng.sample(HEADS, 2)
    return dict(d_model=kv * rep * plain, n_heads=kv * rep, n_kv_heads=kv, head_dim=head,
                ffn=8 * rng.randint(10, 60), seq=rng.randint(5, 40), batch=rng.randint(1, 3))


def draw_far_shape(rng) -> dict:
    """Far outside :func:`draw_shape`'s range (Qwen3-like: 6-8 key/value heads, head_dim 64 or
    128, d_model smaller or larger than the attention, hundreds of positions)."""
    kv, rep = rng.choice([6, 8]), rng.choice([1, 2])
    head, plain = rng.choice([(64, 48), (64, 96), (128, 80), (128, 160)])
    return dict(d_model=kv * rep * plain, n_heads=kv * rep, n_kv_heads=kv, head_dim=head,
                ffn=16 * rng.randint(100, 250), seq=rng.randint(300, 600), batch=rng.randint(1, 2))
