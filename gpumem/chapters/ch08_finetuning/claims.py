"""Chapter 08's claims: the note's single-GPU rule (its section 3 scenario 2, "RTX 3090 24GB, LoRA:
INT4 + CPU offload, barely runs", and the summary's "single GPU: quantisation + CPU offload"), and
the QLoRA paper's figures (arXiv:2305.14314: abstract, section 3), against the engine's counts
(:mod:`gpumem.memory.finetune`, through :mod:`.scale`).

The note names no model for its scenario; the chapter reads it for Llama-3-8B and Llama-3-70B.
Its claim there is a yes/no one (INT4 + offload needed), graded by :class:`FitClaim`: the step's
bytes against the card's usable bytes (capacity minus the single-GPU reserve, ``scale.usable``)."""

import textwrap
from dataclasses import dataclass
from typing import Callable

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import finetune as F, models

from . import scale

GB = 10**9


@dataclass
class FitClaim(Claim):
    """A yes/no claim about one card: ``note`` is 1 when the note says the step needs offload, 0
    when it says the step fits; ``ours`` the step's bytes, ``usable`` the card's usable bytes. The
    verdict: *agrees* when the count gives the note's answer, else *wrong*."""
    usable: Callable[[], int] = lambda: 0

    def needs_offload(self) -> bool:
        return self.ours() > self.usable()

    def verdict(self) -> str:
        return "agrees" if self.needs_offload() == bool(self.note) else "wrong"

    def row(self) -> tuple[str, str, str, str, str]:
        sign = ">" if self.needs_offload() else "<="
        return (self.id, self.what, "needs offload" if self.note else "fits",
                f"{units.fmt(self.ours(), 'GB', 1)} {sign} {units.fmt(self.usable(), 'GB', 1)}", self.verdict())


def ledger_table(claims: list[Claim], width: int = 100) -> str:
    """The claims as a table no wider than ``width``: id, claim (wrapped), the note's figure, ours
    and the verdict (a :class:`FitClaim`'s "ours" is the step's bytes against the usable bytes)."""
    rows = [c.row() for c in claims]
    head = ("id", "claim", "note", "ours", "verdict")
    w = [max(len(r[i]) for r in rows + [head]) for i in range(5)]
    w[1] = width - sum(w[i] for i in (0, 2, 3, 4)) - 2 * 4

    def line(cells):
        return "  ".join(f"{v:<{n}}" if i < 2 else f"{v:>{n}}" for i, (v, n) in enumerate(zip(cells, w))).rstrip()
    out = [line(head), "-" * width]
    for r in rows:
        first, *rest = textwrap.wrap(r[1], w[1])
        out += [line((r[0], first, *r[2:]))] + [line(("", p, "", "", "")) for p in rest]
    return "\n".join(out)
PEFT_8B_R16 = 41_943_040     # peft print_trainable_parameters, Llama-3-8B r = 16 on all seven projections


def _3090(model: str) -> dict:
    return scale.rtx3090(model)


def _why_3090_70b() -> str:
    r = _3090("llama-3-70b")
    return (f"QLoRA r16, 512 tokens, every layer checkpointed: states {r['states'] / GB:.1f} GB (NF4 base "
            f"{F.nf4_bytes_per_param():.3f} B/weight) + activations {r['activations'] / GB:.1f} GB against "
            f"{r['usable'] / GB:.1f} GB usable: {r['short_by'] / GB:.1f} GB must leave the GPU, so INT4 "
            f"alone is not enough and offload is needed, as the note says. A paged optimizer moves only "
            f"the adapters' moments ({r['pageable'] / GB:.1f} GB); the other {r['streamed'] / GB:.1f} GB is "
            f"frozen base streamed over PCIe Gen4 three times a step ({r['pcie_s']:.1f} s) beside "
            f"{r['compute_s']:.1f} s of compute at {100 * scale.MFU:.0f} % of the 3090's 71 TFLOP/s: "
            f"about {r['pcie_s'] + r['compute_s']:.1f} s a step, it runs, slowly: the note's \"barely runs\"")


def _why_3090_8b() -> str:
    r = _3090("llama-3-8b")
    lo = scale.need(models.get("llama-3-8b"), scale.RECIPES["LoRA r16"], "full", 512)["total"]
    return (f"QLoRA r16 needs {r['total'] / GB:.1f} GB of the {r['usable'] / GB:.1f} GB usable, no "
            f"offload at all; even a bf16 LoRA needs {lo / GB:.1f} GB with checkpointing: for an 8B model "
            "neither INT4 nor offload is required")


def _why_65b() -> str:
    q, q4 = scale.qlora_65b(), scale.qlora_65b(batch=4)
    return (f"LLaMA-65B as the QLoRA repo's 65B script runs it: r = 64 on every linear layer, bf16 "
            f"adapters, paged_adamw_32bit (fp32 states), 1 x {q['seq']} tokens, checkpointed: states "
            f"{q['states'] / GB:.2f} GB + activations {q['acts_ckpt'] / GB:.2f} GB = {q['total_ckpt'] / GB:.2f} GB "
            f"of {q['usable'] / GB:.2f} GB usable. The script's first version (4 x {q4['seq']}): "
            f"{q4['total_ckpt'] / GB:.2f} GB, on the edge; paging the {q4['pageable'] / GB:.1f} GB of optimizer "
            f"states to the host is what keeps it safe. Without checkpointing: "
            f"{q['total_none'] / GB:.1f} GB, no fit")


CLAIMS = [
    FitClaim("3-rtx3090-70b", "RTX 3090 24GB LoRA: INT4 + CPU offload barely runs (read as 70B)",
             1, lambda: _3090("llama-3-70b")["total"], _why_3090_70b, usable=lambda: scale.usable("rtx-3090")),
    FitClaim("3-rtx3090-8b", "RTX 3090 24GB LoRA: needs INT4 + CPU offload (read as 8B)",
             1, lambda: _3090("llama-3-8b")["total"], _why_3090_8b, usable=lambda: scale.usable("rtx-3090")),
    FitClaim("qlora-65b", "QLoRA paper: 65B fine-tuned on a single 48GB GPU", 0,
             lambda: scale.qlora_65b()["total_ckpt"], _why_65b, usable=lambda: scale.qlora_65b()["usable"]),
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
