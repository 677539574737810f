"""A model description from a Hugging Face ``config.json``: the learner's own model, or a shipped one.

``load(name_or_path)`` reads a file (or a shipped config by name) into a
:class:`~gpumem.memory.models.ModelConfig` without importing torch or transformers. Fields and
their defaults follow transformers' own config classes (``configuration_<type>.py``, version pinned
in env/requirements.txt; a test compares the defaults with them) and the modules the modelling code
builds (``modeling_<type>.py``): which projections carry a bias, whether the head is tied, how many
norms a layer has. A missing or contradictory field is a :class:`UsageError` naming it.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from .models import ModelConfig

CONFIG_DIR = Path(__file__).with_name("configs")


@dataclass(frozen=True)
class Kind:
    """What one ``model_type`` builds, beyond the fields its config names."""
    fields: dict            # our name -> the config's field name
    defaults: dict          # config field -> transformers' default where the file may omit it
    acts: tuple             # accepted activation names
    act_field: str = "hidden_act"
    tied: bool = False      # transformers' default for tie_word_embeddings
    qkv_bias: bool | None = None   # fixed by the modelling code (None: the attention_bias field)
    o_bias: bool | None = None
    norms_per_layer: int = 2
    qk_norm: bool = False
    moe: bool = False


_LLAMA = {"d": "hidden_size", "L": "num_hidden_layers", "a": "num_attention_heads",
          "F": "intermediate_size", "V": "vocab_size"}
_SILU = ("silu", "swish")
KINDS: dict[str, Kind] = {
    "llama": Kind(_LLAMA, {"attention_bias": False, "mlp_bias": False}, _SILU),
    "mistral": Kind(_LLAMA, {}, _SILU, qkv_bias=False, o_bias=False),
    "qwen2": Kind(_LLAMA, {}, _SILU, qkv_bias=True, o_bias=False),
    "qwen3": Kind(_LLAMA, {"head_dim": 128, "attention_bias": False}, _SILU, qk_norm=True),
    "gemma2": Kind(_LLAMA, {"head_dim": 256, "attention_bias": False},
                   ("gelu_pytorch_tanh", "gelu"), act_field="hidden_activation", tied=True,
                   norms_per_layer=4),
    "gpt2": Kind({"d": "n_embd", "L": "n_layer", "a": "n_head", "V": "vocab_size", "P": "n_positions"},
                 {"n_inner": None}, ("gelu_new", "gelu", "gelu_pytorch_tanh", "relu"),
                 act_field="activation_function", tied=True, qkv_bias=True, o_bias=True),
    "mixtral": Kind(_LLAMA | {"E": "num_local_experts", "k": "num_experts_per_tok"}, {}, _SILU,
                    qkv_bias=False, o_bias=False, moe=True),
    "qwen3_moe": Kind(_LLAMA | {"F": "moe_intermediate_size", "E": "num_experts", "k": "num_experts_per_tok"},
                      {"head_dim": 128, "attention_bias": False, "decoder_sparse_step": 1,
                       "mlp_only_layers": []}, _SILU, qk_norm=True, moe=True),
}

# Shipped configs: published parameter counts (billions; active per token for MoE) and sources.
SHIPPED: dict[str, tuple[float, float | None, str]] = {
    "meta-llama-3-70b": (70.55, None, "Meta Llama 3 (llama-models sku_list.py); HF config.json"),
    "qwen2.5-72b": (72.7, None, "Qwen2.5-72B model card: 72.7B parameters"),
    "mistral-7b-v0.1": (7.24, None, "Jiang et al. 2023, Mistral 7B (arXiv 2310.06825), Table 1 "
                        "dimensions; 7.24B is the HF checkpoint's safetensors count"),
    "qwen3-8b": (8.2, None, "Qwen3-8B model card: 8.2B parameters, 6.95B non-embedding"),
    "gemma-2-9b": (9.24, None, "Gemma Team 2024, Gemma 2 (arXiv 2408.00118), Tables 1 and 2: "
                   "917,504,000 embedding + 8,324,201,984 non-embedding parameters"),
    "gpt2": (0.124, None, "OpenAI GPT-2 small as released (HF gpt2: 124M; the paper's 117M "
             "is a known miscount)"),
    "gpt3-175b": (175.0, None, "Brown et al. 2020 (arXiv 2005.14165), Table 2.1: 96 layers, "
                  "d_model 12288, 96 heads, context 2048, 175.0B"),
    "mixtral-8x7b": (46.7, 12.9, "Mistral AI, 'Mixtral of experts' (Dec 2023): 46.7B total, "
                     "12.9B per token; Jiang et al. 2024 (arXiv 2401.04088) Table 1"),
    "qwen3-30b-a3b": (30.5, 3.3, "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
}


def _field(raw: dict, key: str, kind: Kind):
    if key in raw and raw[key] is not None:
        return raw[key]
    if key in kind.defaults:
        return kind.defaults[key]
    raise UsageError(f"config.json: missing field {key!r} (model_type {raw.get('model_type')!r})")


def _int(raw: dict, key: str, kind: Kind) -> int:
    value = _field(raw, key, kind)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"config.json: field {key!r} must be a positive integer, got {value!r}")
    return value


def from_dict(raw: dict, name: str = "config") -> ModelConfig:
    """A :class:`ModelConfig` from a config dictionary; :class:`UsageError` names a bad field."""
    if not isinstance(raw, dict):
        raise UsageError("config.json: expected a JSON object")
    mt = raw.get("model_type")
    if mt not in KINDS:
        raise UsageError(f"config.json: model_type {mt!r} is not supported; accepted: {', '.join(KINDS)}")
    kind = KINDS[mt]
    f = {ours: _int(raw, theirs, kind) for ours, theirs in kind.fields.items()}
    d, a = f["d"], f["a"]
    # transformers: num_key_value_heads None means one key/value head per query head (no GQA)
    kv = _int(raw, "num_key_value_heads", kind) if raw.get("num_key_value_heads") is not None else a
    head_dim = raw.get("head_dim") or kind.defaults.get("head_dim")
    if head_dim is None and d % a:
        raise UsageError(f"config.json: num_attention_heads {a} does not divide hidden_size {d} "
                         "(and no head_dim is given)")
    if a % kv:
        raise UsageError(f"config.json: num_key_value_heads {kv} does not divide num_attention_heads {a}")
    act = _field(raw, kind.act_field, kind)
    if act not in kind.acts:
        raise UsageError(f"config.json: {kind.act_field} {act!r} is not supported for {mt}; "
                         f"accepted: {', '.join(kind.acts)}")
    if mt == "qwen3_moe" and (_field(raw, "decoder_sparse_step", kind) != 1 or _field(raw, "mlp_only_layers", kind)):
        raise UsageError("config.json: decoder_sparse_step other than 1 or a non-empty mlp_only_layers "
                         "(dense layers among the sparse ones) is not supported")
    bias = bool(raw.get("attention_bias", kind.defaults.get("attention_bias", False)))
    ffn = f["F"] if "F" in f else (raw.get("n_inner") or 4 * d)
    tied = raw.get("tie_word_embeddings", kind.tied)
    published = SHIPPED.get(name, (None, None, ""))
    return ModelConfig(
        name=name, n_layers=f["L"], d_model=d, n_heads=a, n_kv_heads=kv, ffn=ffn, vocab=f["V"],
        published_params=published[0], norm_eps=raw.get("rms_norm_eps", raw.get("layer_norm_epsilon", 1e-5)),
        rope_theta=raw.get("rope_theta", 10000.0), model_type=mt,
        explicit_head_dim=head_dim if head_dim and head_dim != d // a else 0,
        tie_embeddings=bool(tied), qkv_bias=bias if kind.qkv_bias is None else kind.qkv_bias,
        o_bias=bias if kind.o_bias is None else kind.o_bias,
        mlp="gelu" if mt == "gpt2" else "geglu" if mt == "gemma2" else "swiglu",
        mlp_bias=mt == "gpt2" or bool(raw.get("mlp_bias", False)),
        norm_kind="layer" if mt == "gpt2" else "rms", norms_per_layer=kind.norms_per_layer,
        qk_norm=kind.qk_norm, fused_qkv=mt == "gpt2", positions=f.get("P", 0),
        n_experts=f.get("E", 0), top_k=f.get("k", 0), published_active=published[1], source=published[2],
        # MistralConfig's default window is 4096 (transformers configuration_mistral.py), Mixtral's
        # None (configuration_mixtral.py); null: none
        sliding_window=(raw.get("sliding_window", 4096 if mt == "mistral" else None) or 0)
        if mt in ("mistral", "mixtral") else 0)


def load(name_or_path: str) -> ModelConfig:
    """A shipped config by name (``qwen2.5-72b``), or a ``config.json`` path; one-line errors."""
    shipped = CONFIG_DIR / f"{name_or_path}.json"
    path = shipped if name_or_path in SHIPPED else Path(name_or_path)
    if not path.is_file():
        raise UsageError(f"--config {name_or_path}: no such file; give a config.json path or one of: "
                         f"{', '.join(SHIPPED)}")
    try:
        raw = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"--config {name_or_path}: not JSON ({err.__class__.__name__}: {err})") from None
    # a Hub folder's config.json is named by its folder (Qwen2.5-72B/config.json), another file by itself
    name = name_or_path if name_or_path in SHIPPED else (
        path.resolve().parent.name if path.name == "config.json" else path.stem)
    if top_k := raw.get("num_experts_per_tok"):
        experts = raw.get("num_local_experts") or raw.get("num_experts") or 0
        if isinstance(top_k, int) and isinstance(experts, int) and top_k > experts:
            raise UsageError(f"config.json: num_experts_per_tok {top_k} is more than the {experts} experts")
    return from_dict(raw, name)
