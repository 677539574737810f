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


def softcap(cfg: ModelConfig) -> bool:
    """Does the model soft-cap its attention scores and logits (tanh(x / c) * c)? Gemma 2 does,
    by its config's defaults (``attn_logit_softcapping`` 50, ``final_logit_softcapping`` 30, as in
    every published Gemma 2 config); tanh keeps its output, in the compute dtype."""
    return cfg.model_type == "gemma2"


def hf_window_mask(cfg: ModelConfig, seq: int, impl: str) -> bool:
    """Does Hugging Face's code materialise the attention mask (a window no wider than seq)?"""
    return impl == "hf" and 0 < cfg.sliding_window <= seq


def layer_norm(cfg: ModelConfig, T: int, e: int, norm: str) -> tuple[int, str, str]:
    """One norm over T rows of d_model: bytes, formula, label. LayerNorm (GPT-2) keeps its input,
    a mean and a 1/std per row, in the input's dtype on CPU (bf16: 2*e*T; CUDA keeps fp32).
    Gemma 2's norm (``Gemma2RMSNorm``) computes in fp32 whatever the input: 8*T*h + 4*T + 4*h in
    bf16, the last term made from the weight in every norm (the tensors are lab 01's to derive;
    tests/test_lab01_adversarial.py counts them by hand)."""
    h = cfg.d_model
    if cfg.model_type == "gemma2":   # Gemma2RMSNorm: all in fp32, then (1 + weight), cast back
        return 8 * T * h + 4 * T + 4 * h, "8sbh + 4sb + 4h", "(fp32 input, normed, 1/rms, 1+w)"
    if cfg.norm_kind == "layer":
        return e * T * h + 2 * e * T, f"{e}sbh + {2 * e}sb", "(input, mean, 1/std)"
    return norm_bytes(T, h, e, norm), f"{e if norm == 'fused' else 4 + e}sbh + 4sb", norm_label(norm)


def gemma_final_norm(cfg: ModelConfig, seq: int, batch: int, e: int) -> int:
    """Activation bytes beside the layers' saved tensors and the RoPE tables while Gemma 2's
    final norm runs in transformers (``Gemma2Model.forward``): the two eager masks (full and
    sliding window, b x s x s in the compute dtype), the int64 position ids (8s), the norm's
    saved tensors and its fp32 product before the cast; in bf16 also the embedding output and
    the norm's input, both still referenced (not saved), and the cast bf16 output. It tops the
    loss only for a vocabulary small beside the width (not for any published Gemma 2)."""
    T, h = batch * seq, cfg.d_model
    held = 3 * e * T * h if e == 2 else 0
    return 2 * e * batch * seq * seq + 8 * seq + layer_norm(cfg, T, e, "hf")[0] + 4 * T * h + held
