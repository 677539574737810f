"""The fine-tuning options of ``estimate`` (and of any verb that counts a fine-tuning step):
``--adapter none|lora``, ``--lora-rank R``, ``--lora-targets q,k,v,o,gate,up,down``,
``--base-dtype bf16|nf4`` and ``--optimizer adamw|adamw-8bit|paged-adamw`` (the last: adapters
only, bitsandbytes' ``PagedAdamW32bit``), read into a
:class:`~gpumem.memory.finetune.Finetune` and checked (a one-line UsageError, exit 2). Torch-free;
argparse only, so ``gpumem.cli_verbs`` stays a thin layer and ``trace`` can take the same options.
"""

import re

from ..errors import UsageError
from .finetune import ADAPTERS, BASE_DTYPES, FT_TARGETS, OPTIMIZERS, Finetune, validate

OPTIONS = ("--adapter", "--lora-rank", "--lora-targets", "--base-dtype", "--optimizer")


def add_options(p) -> None:
    """Add the five options to an argparse parser (defaults None, so that what was given is known)."""
    p.add_argument("--adapter", choices=ADAPTERS, default=None,
                   help="none: full fine-tuning; lora: frozen base + adapters (peft) (none)")
    p.add_argument("--lora-rank", default=None, help="LoRA rank r, a positive integer (16)")
    p.add_argument("--lora-targets", default=None,
                   help=f"adapted projections, comma-separated ({','.join(FT_TARGETS)})")
    p.add_argument("--base-dtype", choices=BASE_DTYPES, default=None,
                   help="the base's weights: bf16, or nf4 with --adapter lora (QLoRA) (bf16)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="adamw (torch, moments in the weights' dtype), adamw-8bit (bitsandbytes, block-wise "
                        "8-bit) or paged-adamw (bitsandbytes PagedAdamW32bit: fp32 states; adapters only) (adamw)")


def _rank(text: str) -> int:
    if not re.fullmatch(r"\s*[+-]?[0-9]{1,12}\s*", text):
        raise UsageError(f"--lora-rank must be a positive integer, got {text!r}")
    return int(text)


def _targets(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(","))


def from_args(args, zero: int = 0, recipe: str = "mixed") -> Finetune | None:
    """The setup the options describe, checked; None when none of them was given."""
    given = {o: getattr(args, o[2:].replace("-", "_")) for o in OPTIONS}
    if all(v is None for v in given.values()):
        return None
    lora = given["--adapter"] == "lora"
    stray = [o for o in ("--lora-rank", "--lora-targets") if given[o] is not None]
    if stray and not lora:
        raise UsageError(f"{', '.join(stray)} goes with --adapter lora; accepted with --adapter none: "
                         "--base-dtype bf16, --optimizer adamw or adamw-8bit")
    ft = Finetune(adapter=given["--adapter"] or "none",
                  lora_rank=_rank(given["--lora-rank"]) if given["--lora-rank"] is not None else 16,
                  lora_targets=_targets(given["--lora-targets"]) if given["--lora-targets"] is not None
                  else FT_TARGETS,
                  base_dtype=given["--base-dtype"] or "bf16", optimizer=given["--optimizer"] or "adamw",
                  recipe=recipe)
    validate(ft, zero)
    return ft


def registry_trace(args) -> None:
    """``trace --model NAME``: the name is a registry model (else exit 2), and none of chapter 08's
    options is given: the course's own Llama has no adapters, so they are refused, not ignored
    (they go with ``--config``)."""
    from . import models
    models.get(args.model)
    given = [o for o in OPTIONS if getattr(args, o[2:].replace("-", "_")) is not None]
    if given:
        raise UsageError(f"trace --model traces the course's Llama, which has no adapters; {', '.join(given)} "
                         "goes with --config (a shipped name such as meta-llama-3-70b, or a config.json)")


ROLE_LABELS = {
    "base_weights": "base weights", "quant_constants": "NF4 absmax + double-quant scales",
    "adapter_weights": "adapter weights", "grads": "gradients", "master": "fp32 master copy",
    "optimizer_moments": "optimizer moments", "optimizer_scales": "8-bit block absmaxes + maps",
    "step_counters": "AdamW step counters", "dequant_buffer": "dequantised bf16 matrix (buffer)",
}


def render(d: dict, fmt) -> list[str]:
    """Lines for ``estimate``'s table: the setup and the bytes by role (``fmt``: bytes -> text)."""
    ft = d.get("finetune")
    if ft is None:
        return []
    what = ("full fine-tuning" if ft["adapter"] == "none" else
            f"{'QLoRA' if ft['base_dtype'] == 'nf4' else 'LoRA'} r={ft['lora_rank']} on "
            f"{','.join(ft['lora_targets'])} ({ft['adapter_dtype']} adapters)")
    lines = [f"  {what}, base {ft['base_dtype']}, {ft['optimizer']}; by role:"]
    lines += [f"    {ROLE_LABELS[k]:44s} {fmt(v)}" for k, v in d["roles"].items() if v]
    return lines
