"""Small pieces of the activation formula (``activations``): element sizes, one norm's saved bytes
by implementation, and when Hugging Face's code materialises a sliding-window mask."""

from ..errors import one_of
from .models import ModelConfig
from .policies import NORMS


def elem_bytes(recipe: str) -> int:
    """Bytes per activation element in the recipe's compute dtype: 4 for fp32, else 2 (bf16)."""
    return 4 if recipe == "fp32" else 2


def norm_bytes(T: int, h: int, e: int, norm: str = "fused") -> int:
    """Saved bytes of one RMSNorm over T tokens of width h (``activations``' docstring)."""
    one_of(norm, NORMS, "norm")
    return (e * T * h if norm == "fused" else 4 * T * h + e * T * h) + 4 * T


def norm_label(norm: str) -> str:
    """What an RMSNorm of implementation ``norm`` saves, in words (a table row's name)."""
    return "(input + 1/rms)" if norm == "fused" else "(fp32 input, normed copy, 1/rms)"


def hf_window_mask(cfg: ModelConfig, seq: int, impl: str) -> bool:
    """Does Hugging Face's code materialise the attention mask (a window no wider than seq)?"""
    return impl == "hf" and 0 < cfg.sliding_window <= seq


def layer_norm(cfg: ModelConfig, T: int, e: int, norm: str) -> tuple[int, str, str]:
    """One norm over T rows of d_model: bytes, formula, label. LayerNorm (GPT-2) keeps its input,
    a mean and a 1/std per row, in the input's dtype on CPU (bf16: 2*e*T; CUDA keeps fp32)."""
    h = cfg.d_model
    if cfg.norm_kind == "layer":
        return e * T * h + 2 * e * T, f"{e}sbh + {2 * e}sb", "(input, mean, 1/std)"
    return norm_bytes(T, h, e, norm), f"{e if norm == 'fused' else 4 + e}sbh + 4sb", norm_label(norm)
