"""Chapter 08's claims: the note's single-GPU rule (its section 3 scenario 2, "RTX 3090 24GB, LoRA:
INT4 + CPU offload, barely runs", and the summary's "single GPU: quantisation + CPU offload"), and
the QLoRA paper's figures (arXiv:2305.14314: abstract, section 3), against the engine's counts
(:mod:`gpumem.memory.finetune`, through :mod:`.scale`).

The note names no model for its scenario; the chapter reads it for Llama-3-8B and Llama-3-70B."""

from gpumem.course.ledger import Claim
from gpumem.memory import finetune as F, models

from . import scale

GB = 10**9
PEFT_8B_R16 = 41_943_040     # peft print_trainable_parameters, Llama-3-8B r = 16 on all seven projections


def _3090(model: str) -> dict:
    return scale.rtx3090(model)


def _why_3090_70b() -> str:
    r = _3090("llama-3-70b")
    return (f"QLoRA r16, 512 tokens, every layer checkpointed: states {r['states'] / GB:.1f} GB (NF4 base "
            f"{F.nf4_bytes_per_param():.3f} B/weight) + activations {r['activations'] / GB:.1f} GB against "
            f"{r['capacity'] / GB:.1f} GB: {r['short_by'] / GB:.1f} GB must leave the GPU. A paged optimizer "
            f"frees only the adapters' moments ({r['pageable'] / GB:.1f} GB); the other "
            f"{r['streamed'] / GB:.1f} GB is frozen base streamed over PCIe Gen4 three times a step "
            f"({r['pcie_s']:.1f} s) beside {r['compute_s']:.1f} s of compute at {100 * scale.MFU:.0f} % of "
            "the 3090's 71 TFLOP/s: it runs, slowly, as the note says")


def _why_3090_8b() -> str:
    r = _3090("llama-3-8b")
    lo = scale.need(models.get("llama-3-8b"), scale.RECIPES["LoRA r16"], "full", 512)["total"]
    return (f"QLoRA r16 needs {r['total'] / GB:.1f} GB with no offload at all; even a bf16 LoRA needs "
            f"{lo / GB:.1f} GB with checkpointing: for an 8B model neither INT4 nor offload is required")


def _why_65b() -> str:
    q = scale.qlora_65b()
    return (f"LLaMA-65B, r = 64 on every linear layer, bf16 adapters, {scale.QLORA_SEQ} tokens: states "
            f"{q['states'] / GB:.1f} GB + activations {q['acts_ckpt'] / GB:.1f} GB checkpointed = "
            f"{q['total_ckpt'] / GB:.1f} GB, inside the card's {q['usable'] / GB:.1f} GB usable; without "
            f"checkpointing {q['total_none'] / GB:.1f} GB does not fit: the claim needs checkpointing")


CLAIMS = [
    Claim("3-rtx3090-70b", "RTX 3090 24GB LoRA: INT4 + CPU offload barely runs (read as 70B)",
          F.RTX3090_BYTES, lambda: _3090("llama-3-70b")["total"], _why_3090_70b),
    Claim("3-rtx3090-8b", "RTX 3090 24GB LoRA: needs INT4 + CPU offload (read as 8B)",
          F.RTX3090_BYTES, lambda: _3090("llama-3-8b")["total"], _why_3090_8b),
    Claim("qlora-65b", "QLoRA paper: 65B fine-tuned on a single 48GB GPU", 48 * GB,
          lambda: scale.qlora_65b()["total_ckpt"], _why_65b),
    Claim("qlora-bits", "QLoRA paper: NF4 + double quantisation = 4.127 bits per weight", 4.127,
          lambda: 8 * F.nf4_bytes_per_param(),
          lambda: "4-bit code + 8-bit absmax per 64 weights + fp32 scale per 256 absmaxes: "
                  f"4 + 8/64 + 32/16384 = {8 * F.nf4_bytes_per_param():.4f}; bitsandbytes adds ~1.1 KiB of "
                  "tables per tensor (code, offset, nested map)", unit="bits"),
    Claim("qlora-dq-65b", "QLoRA paper: double quantisation saves ~3 GB on a 65B model", 3 * GB,
          lambda: scale.double_quant_saving(),
          lambda: "fp32 absmaxes cost 32/64 = 0.5 bits per weight, double-quantised 0.127: 0.373 bits on "
                  f"LLaMA-65B's {sum(F.quantised_tensors(scale.LLAMA_65B)):,} quantised weights"),
    Claim("peft-8b-r16", "peft: Llama-3-8B r16 on all seven projections trains 41,943,040 params",
          PEFT_8B_R16 / 1e6, lambda: F.lora_params(models.get("llama-3-8b"), 16) / 1e6,
          lambda: "r (in + out) per matrix: 16 x (4096+4096 + 2 x (4096+1024) + 4096+4096 + 2 x "
                  "(4096+14336) + 14336+4096) x 32 layers", unit="M params"),
]
