"""The model registry: Meta's Llama-3 configs and tiny teaching models, and the description every
model is counted from.

Dimensions follow Meta's reference code (llama-models: ``sku_list.py``, ``model.py``): the FFN
width is int(8d/3) x ffn_dim_multiplier rounded up to ``multiple_of``. Embeddings are untied.
Configs ship here; nothing is downloaded. Other architectures (Hugging Face ``config.json``
files: ``gpumem.memory.hf_config``) fill the fields after ``teaching``; their defaults are
Llama's, so a Llama needs none of them.
"""

from dataclasses import dataclass, asdict

from ..errors import UsageError


@dataclass(frozen=True)
class ModelConfig:
    """A Llama model's dimensions, enough to count its parameters and activation bytes."""
    name: str
    n_layers: int
    d_model: int
    n_heads: int        # query heads (a)
    n_kv_heads: int     # key/value heads (GQA)
    ffn: int            # SwiGLU hidden width (F)
    vocab: int
    published_params: float | None = None  # Meta's published count, in billions
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    teaching: bool = False  # small enough to train on a CPU in seconds
    # --- other architectures (defaults: Llama) ---
    model_type: str = "llama"
    explicit_head_dim: int = 0     # the config's head_dim where it is not d / a (Gemma, Qwen3)
    tie_embeddings: bool = False   # the output head reuses the embedding matrix
    qkv_bias: bool = False
    o_bias: bool = False
    mlp: str = "swiglu"            # swiglu or geglu (gate, up, down), gelu (up, down)
    mlp_bias: bool = False
    norm_kind: str = "rms"         # rms (a weight) or layer (a weight and a bias)
    norms_per_layer: int = 2       # Gemma 2: 4 (before and after attention and MLP)
    qk_norm: bool = False          # an RMSNorm over each head's q and k (Qwen3, Gemma 3)
    fused_qkv: bool = False        # one q/k/v matrix (GPT-2's c_attn): same count, fewer tensors
    positions: int = 0             # learned absolute positions (GPT-2), else 0 (RoPE)
    n_experts: int = 0             # mixture of experts: experts per layer (0: dense)
    top_k: int = 0                 # experts each token is sent to
    shared_expert_ffn: int = 0     # an always-on expert's width (0: none)
    published_active: float | None = None   # published active parameters per token, billions
    source: str = ""               # where the dimensions come from
    sliding_window: int = 0        # every layer attends this many tokens back (Mistral), 0: all

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.d_model // self.n_heads

    @property
    def q_dim(self) -> int:
        """Width of the queries and of the attention output (W_o's input): a x head_dim."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    def attention_params(self) -> int:
        """W_q, W_k, W_v, W_o, their biases where the model has them, and q/k norms."""
        d, q, kv = self.d_model, self.q_dim, self.kv_dim
        return (2 * d * q + 2 * d * kv + (q + 2 * kv) * self.qkv_bias + d * self.o_bias
                + 2 * self.head_dim * self.qk_norm)

    def expert_params(self) -> int:
        """One MLP of width ``ffn`` (a dense layer's MLP, or one expert)."""
        d, f = self.d_model, self.ffn
        mats = 2 if self.mlp == "gelu" else 3
        return mats * d * f + ((mats - 1) * f + d) * self.mlp_bias

    def mlp_params(self, active: bool = False) -> int:
        """The MLP of one layer; for a mixture of experts all experts (``active``: the top-k a
        token uses), the router, and the shared expert."""
        if not self.moe:
            return self.expert_params()
        experts = self.top_k if active else self.n_experts
        shared = 3 * self.d_model * self.shared_expert_ffn
        return experts * self.expert_params() + self.d_model * self.n_experts + shared

    def norm_params(self) -> int:
        """One norm's parameters: a weight, and a bias for LayerNorm."""
        return self.d_model * (2 if self.norm_kind == "layer" else 1)

    def layer_params(self, active: bool = False) -> int:
        """Parameters of one transformer block: attention, MLP (or experts) and its norms."""
        return self.attention_params() + self.mlp_params(active) + self.norms_per_layer * self.norm_params()

    def largest_layer_params(self) -> int:
        """Largest module's parameters (DeepSpeed's estimator sizes buffers by it): a weight
        matrix, or for a mixture of experts the experts' fused tensors (transformers 5 keeps all
        of a layer's experts in one module)."""
        experts = self.n_experts * self.expert_params() if self.moe else 0
        return max(self.vocab * self.d_model, self.d_model * self.ffn, experts)

    def embedding_params(self) -> int:
        """Token embedding, learned positions, and the output head unless tied to the embedding."""
        return (2 - self.tie_embeddings) * self.vocab * self.d_model + self.positions * self.d_model

    def n_params(self, active: bool = False) -> int:
        """Total parameters: embeddings, blocks, final norm, output head (``active``: per token)."""
        return self.embedding_params() + self.n_layers * self.layer_params(active) + self.norm_params()

    def as_dict(self) -> dict:
        return asdict(self) | {"head_dim": self.head_dim, "n_params": self.n_params()}


def _ffn(d: int, multiplier: float, multiple_of: int) -> int:
    """Meta's rule: int(2 * 4d / 3), times the multiplier, rounded up to ``multiple_of``."""
    hidden = int(multiplier * int(2 * 4 * d / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


REGISTRY: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in [
        ModelConfig("llama-3-8b", 32, 4096, 32, 8, _ffn(4096, 1.3, 1024), 128256, 8.03),
        ModelConfig("llama-3-70b", 80, 8192, 64, 8, _ffn(8192, 1.3, 4096), 128256, 70.55),
        ModelConfig("llama-3.1-405b", 126, 16384, 128, 8, _ffn(16384, 1.2, 4096), 128256, 405.85),
        # Teaching models: the same architecture, small enough to train on a laptop CPU.
        ModelConfig("tiny", 2, 64, 4, 2, 176, 256, teaching=True),
        ModelConfig("mini", 4, 128, 8, 2, 352, 512, teaching=True),
    ]
}


def get(name: str) -> ModelConfig:
    """Look a model up by name; a :class:`UsageError` lists the accepted names."""
    if name not in REGISTRY:
        raise UsageError(f"unknown model {name!r}; accepted: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def with_layers(cfg: ModelConfig, n_layers: int) -> ModelConfig:
    """The same widths with another depth (used to trace a few blocks and compose)."""
    from dataclasses import replace
    return replace(cfg, name=f"{cfg.name}[{n_layers}L]", n_layers=n_layers)
