"""The model registry: Meta's Llama-3 configs and tiny teaching models.

Dimensions follow Meta's reference code (llama-models: ``sku_list.py``, ``model.py``): the FFN
width is int(8d/3) x ffn_dim_multiplier rounded up to ``multiple_of``. Embeddings are untied.
Configs ship here; nothing is downloaded.
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

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one transformer block: attention, SwiGLU MLP and two RMSNorm weights."""
        d, kv, f = self.d_model, self.kv_dim, self.ffn
        attention = d * d + 2 * d * kv + d * d   # W_q, W_k, W_v, W_o
        mlp = 3 * d * f                          # gate, up, down
        return attention + mlp + 2 * d

    def largest_layer_params(self) -> int:
        """Largest single weight matrix (DeepSpeed's estimator sizes buffers by it)."""
        return max(self.vocab * self.d_model, self.d_model * self.ffn)

    def n_params(self) -> int:
        """Total parameters: embedding, blocks, final norm, untied output head."""
        return 2 * self.vocab * self.d_model + self.n_layers * self.layer_params() + self.d_model

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
