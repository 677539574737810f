"""Fine-tuning's memory by formula: 8-bit AdamW, LoRA and QLoRA (chapter 08). Torch-free.

API (the command line and chapter 08's traces and runs use these):

* :class:`Finetune` - one setup: adapter, rank, targets, base dtype, optimizer, recipe;
* :func:`lora_params` - trainable adapter elements of a whole model;
* :func:`nf4_bytes_per_param` - NF4 + double quantisation, bytes per quantised weight;
* :func:`finetune_states` - role -> bytes per GPU (weights, adapters, grads, optimizer, buffers);
* :func:`finetune_activation_bytes` - saved activations by part, and the peak;
* :func:`validate` - bad combinations raise the course's UsageError (exit 2, one line).

Semantics, sources and assumptions are in each function's docstring.
"""

from dataclasses import dataclass

from ..errors import UsageError

FT_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
ADAPTERS = ("none", "lora")
BASE_DTYPES = ("bf16", "nf4")
OPTIMIZERS = ("adamw", "adamw-8bit")
ADAPTER_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class Finetune:
    """One fine-tuning setup.

    ``adapter`` none (full fine-tuning) or lora; ``lora_rank`` r; ``lora_targets`` the adapted
    projections (Llama names: q k v o gate up down); ``base_dtype`` bf16 or nf4 (nf4 + lora is
    QLoRA); ``optimizer`` torch AdamW (fp32 moments) or bitsandbytes' 8-bit AdamW; ``recipe``
    accounting's recipe, used for full fine-tuning. ``adapter_dtype``: fp32 is peft's default
    (``get_peft_model(..., autocast_adapter_dtype=True)`` upcasts bf16 adapters to fp32);
    ``autocast``: the step runs under ``torch.autocast(dtype=bfloat16)`` (HF Trainer's bf16=True).
    """
    adapter: str = "none"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = FT_TARGETS
    base_dtype: str = "bf16"
    optimizer: str = "adamw"
    recipe: str = "mixed"
    adapter_dtype: str = "fp32"
    autocast: bool = True


def lora_params(cfg, rank: int, targets=FT_TARGETS) -> int:
    """Trainable adapter elements of the whole model: r x (in + out) per adapted matrix."""
    raise NotImplementedError


def nf4_bytes_per_param(block: int = 64, scale_block: int = 256) -> float:
    """Bytes per NF4 weight with double quantisation (QLoRA, arXiv:2305.14314, section 3)."""
    raise NotImplementedError


def finetune_states(cfg, ft: Finetune, *, gpus: int = 1, zero: int = 0) -> dict[str, int]:
    """Role -> bytes per GPU of the model states of one fine-tuning setup."""
    raise NotImplementedError


def finetune_activation_bytes(cfg, ft: Finetune, seq: int, batch: int, *, attention: str = "flash",
                              checkpoint: str = "none") -> dict[str, int]:
    """Part -> activation bytes of one step, with ``peak``."""
    raise NotImplementedError


def validate(ft: Finetune, zero: int = 0) -> None:
    """Refuse bad combinations with a one-line :class:`UsageError`."""
    raise UsageError("not implemented yet")
