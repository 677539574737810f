"""The claims ledger: the study note's figures against the library's, with a computed verdict.

Each :class:`Claim` holds the note's number (as the note states it) and a function that computes
ours. The verdict is arithmetic: *agrees* within 3 %, *close* within 15 %, else *wrong*. The
``why`` says what the note assumed or missed (see shared/reference/seed-errata.md for sources).
"""

from dataclasses import dataclass
from typing import Callable

from . import accounting, models, units
from .estimate import estimate

GB = units.GB


@dataclass
class Claim:
    id: str
    what: str
    note: float          # bytes (or a plain number when unit is "")
    ours: Callable[[], float]
    why: Callable[[], str]
    unit: str = "GB"

    def verdict(self) -> str:
        ours = self.ours()
        err = abs(self.note - ours) / ours
        return "agrees" if err <= 0.03 else "close" if err <= 0.15 else "wrong"

    def row(self) -> tuple[str, str, str, str, str]:
        fmt = (lambda v: units.fmt(v, "GB", 1)) if self.unit == "GB" else (lambda v: f"{v:,.4g} {self.unit}")
        return self.id, self.what, fmt(self.note), fmt(self.ours()), self.verdict()


def _llama70() -> models.ModelConfig:
    return models.get("llama-3-70b")


def _states(recipe: str, zero: int = 0, gpus: int = 8) -> accounting.States:
    return accounting.model_states(_llama70().n_params(), recipe, gpus, zero)


def _est(**kw) -> dict:
    return estimate(model="llama-3-70b", **kw).as_dict()["per_gpu"]


def _gb(value: float) -> str:
    return units.fmt(value, "GB", 0)


CHAPTER_01 = [
    Claim("1a", "70B parameters in bf16", 140 * GB, lambda: _states("mixed").params,
          lambda: f"Right: 2 bytes x {_llama70().n_params() / 1e9:.2f} B parameters (Meta's count)."),
    Claim("1a'", "70B gradients in bf16", 140 * GB, lambda: _states("mixed").grads,
          lambda: f"Right for bf16 gradients; DeepSpeed's accounting keeps fp32 gradients as well "
                  f"({_gb(_states('mixed-ds', gpus=1).grads)})."),
    Claim("1b", "optimizer states", 280 * GB, lambda: _states("mixed").optimizer,
          lambda: "4 B/param is pure-bf16 AdamW. Standard mixed precision keeps an fp32 master copy "
                  "and fp32 m and v: 12 B/param."),
    Claim("1c", "activations, seq 4096, batch 1", 100 * GB, lambda: _est()["activations"],
          lambda: "Close by luck: the note's '32 layers x seq^2' formula is wrong twice: 70B has 80 "
                  "layers, and with FlashAttention no s^2 term is stored. Counted tensor by tensor: "
                  f"{_est_acts().per_layer / (4096 * 8192):.1f} sbh bytes a layer plus the logits at the loss."),
    Claim("1d", "total for one training step", 660 * GB, lambda: _est()["total"],
          lambda: f"With the standard recipe the states alone are {_gb(_states('mixed', gpus=1).total)}. "
                  "The note's conclusion (8 x 80 GB is not enough) holds, by a wider margin."),
    Claim("2-DDP", "DDP, per GPU (P + G + O)", 560 * GB, lambda: _states("pure-bf16", 0).total,
          lambda: f"Right for the note's own pure-bf16 recipe; {_gb(_states('mixed', 0).total)} for "
                  "the standard one."),
    Claim("2a", "ZeRO-1, per GPU (P + G + O/8)", 215 * GB, lambda: _states("pure-bf16", 1).total,
          lambda: "Arithmetic slip: 140 + 140 + 280/8 = 315, not 215, so the saving is 43.75 %, "
                  f"not 60 %. Standard recipe: {_gb(_states('mixed', 1).total)}."),
    Claim("2b", "ZeRO-2, per GPU (P + G/8 + O/8)", 192.5 * GB, lambda: _states("pure-bf16", 2).total,
          lambda: "Right for its recipe: 2 + 6/8 = 2.75 B/param. Standard: 2 + 14/8 = 3.75 B/param, "
                  f"{_gb(_states('mixed', 2).total)}."),
    Claim("2c", "ZeRO-3, per GPU (everything / 8)", 70 * GB, lambda: _states("pure-bf16", 3).total,
          lambda: "Right for pure bf16, but that leaves no room for activations and gather buffers on "
                  f"an 80 GB card; the standard recipe needs {_gb(_states('mixed', 3).total)} per GPU."),
    Claim("S2", "ZeRO-3 + checkpointing, per GPU", 50 * GB,
          lambda: _est(recipe="pure-bf16", gpus=8, zero=3, checkpoint="full")["total"],
          lambda: "Its own lines (17.5 + 17.5 + 35 + 20 + 17.5) add to 107.5, not 50, and DeepSpeed "
                  "does not combine ZeRO-3 with pipeline parallelism. Even pure bf16 + ZeRO-3 + full "
                  "checkpointing is over 80 GB: it takes offload or more GPUs."),
]


def _est_acts():
    return estimate(model="llama-3-70b").acts


def table(claims: list[Claim]) -> str:
    rows = [("id", "claim", "note", "ours", "verdict")] + [c.row() for c in claims]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(f"{v:<{w}}" if i < 2 else f"{v:>{w}}" for i, (v, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def explanations(claims: list[Claim]) -> str:
    return "\n".join(f"[{c.id}] {c.verdict()}: {c.why()}" for c in claims)


def _fetches_per_pass(model: str) -> int:
    """Modules whose parameters ZeRO-3 gathers in one forward: 7 linear layers per block (q, k,
    v, o, gate, up, down), the embedding and the head; RMSNorm weights stay whole (persistent)."""
    return 7 * models.get(model).n_layers + 2


def chapter_02(zero_result: dict | None = None) -> list[Claim]:
    """The note's ZeRO table and gather claims; with a ``experiments.zero`` result, the measured
    communication volume joins the ledger."""
    claims = [c for c in CHAPTER_01 if c.id.startswith("2")] + [
        Claim("3a", "all-gathers per forward, 70B (note: 32 x 4)", 128,
              lambda: _fetches_per_pass("llama-3-70b"),
              lambda: "DeepSpeed fetches per submodule: attention has 4 matrices and the MLP 3, not 2 "
                      "and 2; 70B has 80 layers, not 32; the embedding and head add 2. The backward pass "
                      "gathers them again.", unit="fetches")]
    if zero_result is not None:
        claims.append(Claim(
            "3b", "communication per step, in units of psi", 1,
            lambda: zero_result["stages"]["3"]["comm_per_step_in_psi"],
            lambda: "One pass moves psi, but a step gathers the parameters for forward and again for "
                    "backward, and reduce-scatters the gradients: measured on "
                    f"{zero_result['ranks']} ranks, against "
                    f"{zero_result['stages']['0']['comm_per_step_in_psi']:g} psi for DDP.", unit="psi"))
    return claims
