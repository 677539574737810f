"""One fine-tuning setup (chapter 08): :class:`Finetune`, its checks (:func:`validate`), and the
adapted matrices and their LoRA tensors. Shared by ``finetune`` (model states) and
``finetune_acts`` (activations); sources are in ``finetune``'s docstring. Torch-free."""

from dataclasses import dataclass

from ..errors import UsageError, one_of
from . import accounting

FT_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
ADAPTERS = ("none", "lora")
BASE_DTYPES = ("bf16", "nf4")
OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw")
ADAPTER_DTYPES = ("fp32", "bf16")
@dataclass(frozen=True)
class Finetune:
    """One fine-tuning setup.

    ``adapter`` none (full fine-tuning) or lora; ``lora_rank`` r; ``lora_targets`` the adapted
    projections (Llama's q k v o gate up down); ``base_dtype`` bf16 or nf4 (nf4 + lora is
    QLoRA); ``optimizer`` adamw (torch: moments in the trained weights' dtype, fp32 with a master)
    or adamw-8bit (bitsandbytes ``AdamW8bit``) or, for adapters only, paged-adamw (bitsandbytes
    ``PagedAdamW32bit``, HF ``optim="paged_adamw_32bit"``, the QLoRA repository's default: two fp32
    states whatever the parameter's dtype, no step tensor); ``recipe`` accounting's recipe for full
    fine-tuning (with lora: mixed only). ``adapter_dtype`` fp32 (peft's default) or bf16 (as
    the QLoRA repository's qlora.py casts them); ``autocast``: the step runs under
    ``torch.autocast(dtype=torch.bfloat16)``, as the HF Trainer with ``bf16=True`` does.
    ``prepare`` (QLoRA only): peft's ``prepare_model_for_kbit_training`` was called, which casts
    every parameter that is not 4-bit (embedding, head, norms) to fp32 (``peft/utils/other.py``).
    """
    adapter: str = "none"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = FT_TARGETS
    base_dtype: str = "bf16"
    optimizer: str = "adamw"
    recipe: str = "mixed"
    adapter_dtype: str = "fp32"
    autocast: bool = True
    prepare: bool = False

    @property
    def lora(self) -> bool:
        return self.adapter == "lora"

    @property
    def plain(self) -> bool:
        """Full fine-tuning with torch AdamW: exactly ``accounting`` and ``activations``."""
        return not self.lora and self.base_dtype == "bf16" and self.optimizer == "adamw"


def validate(ft: Finetune, zero: int = 0) -> None:
    """Refuse bad combinations with a one-line :class:`UsageError` naming what is accepted.

    QLoRA with ZeRO-3 is accepted: the claim that ZeRO-3 cannot shard a 4-bit base is out of
    date (peft's DeepSpeed guide, "Use PEFT QLoRA and DeepSpeed with ZeRO3": supported with
    bitsandbytes >= 0.43 via ``bnb_4bit_quant_storage``; older versions of that page said
    "DeepSpeed-Zero3 and bitsandbytes are currently not compatible")."""
    one_of(ft.adapter, ADAPTERS, "adapter")
    one_of(ft.base_dtype, BASE_DTYPES, "base dtype")
    one_of(ft.optimizer, OPTIMIZERS, "optimizer")
    one_of(ft.adapter_dtype, ADAPTER_DTYPES, "adapter dtype")
    accounting.recipe(ft.recipe)
    if zero not in (0, 1, 2, 3):
        raise UsageError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero!r}")
    if ft.base_dtype == "nf4" and not ft.lora:
        raise UsageError("--base-dtype nf4 needs --adapter lora (QLoRA): a 4-bit base gets no weight "
                         "gradient (bitsandbytes' MatMul4Bit); accepted with --adapter none: --base-dtype bf16")
    if ft.optimizer == "paged-adamw" and not ft.lora:
        raise UsageError("--optimizer paged-adamw is counted for adapters (--adapter lora); accepted with "
                         "--adapter none: --optimizer adamw or adamw-8bit")
    if ft.prepare and not (ft.lora and ft.base_dtype == "nf4"):
        raise UsageError("prepare_model_for_kbit_training goes with QLoRA (--adapter lora --base-dtype nf4)")
    rank = ft.lora_rank
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise UsageError(f"--lora-rank must be a positive integer, got {rank!r}")
    if rank > 65_536:
        raise UsageError(f"--lora-rank {rank:,} is larger than any projection; accepted: 1 to 65,536")
    targets = tuple(ft.lora_targets)
    bad = [t for t in targets if t not in FT_TARGETS]
    if bad or not targets or len(set(targets)) != len(targets):
        what = f"unknown LoRA target {bad[0]!r}" if bad else (
            "no LoRA target" if not targets else "a LoRA target named twice")
        raise UsageError(f"{what}; accepted: a comma-separated subset of {','.join(FT_TARGETS)}")
    if ft.lora and ft.recipe != "mixed":
        raise UsageError(f"--recipe {ft.recipe} sets full fine-tuning's precision; with --adapter lora the base "
                         "is bf16 and the adapters peft's fp32: accepted --recipe mixed")


def matrices(cfg) -> dict[str, tuple[int, int]]:
    """Each target's (in, out) features in one layer. Refused (UsageError) where LoRA counting
    does not apply: mixtures of experts, a fused q/k/v matrix, an MLP without a gate."""
    if cfg.moe or cfg.fused_qkv or cfg.mlp not in ("swiglu", "geglu"):
        raise UsageError(f"LoRA is counted for dense models with separate q/k/v and a gated MLP; "
                         f"{cfg.name} is not one (model_type {cfg.model_type}); accepted: --adapter none")
    h, q, kv, F = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.ffn
    return {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, F), "up": (h, F), "down": (F, h)}


def adapter_tensors(cfg, rank: int, targets=FT_TARGETS) -> list[int]:
    """Element counts of every adapter tensor (A: r x in, B: out x r), whole model."""
    dims = matrices(cfg)
    layer = [n for t in targets for n in (rank * dims[t][0], dims[t][1] * rank)]
    return layer * cfg.n_layers


def lora_params(cfg, rank: int, targets=FT_TARGETS) -> int:
    """Trainable adapter elements of the whole model: r x (in + out) per adapted matrix, per layer."""
    return sum(adapter_tensors(cfg, rank, targets))
