"""Chapter 02's claims: the note's ZeRO table (§1), its gather count and its volume."""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import accounting, models

GB = units.GB


def _llama70() -> models.ModelConfig:
    return models.get("llama-3-70b")


def _states(recipe: str, zero: int = 0, gpus: int = 8) -> accounting.States:
    return accounting.model_states(_llama70().n_params(), recipe, gpus, zero)


def _gb(value: float) -> str:
    return units.fmt(value, "GB", 0)


# The note's ZeRO table, in its own pure-bf16 recipe (2 + 2 + 4 bytes per parameter).
ZERO_TABLE = [
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
]


def _fetches_per_pass(model: str) -> int:
    """Modules whose parameters ZeRO-3 gathers in one forward: 7 linear layers per block (q, k,
    v, o, gate, up, down), the embedding and the head; RMSNorm weights stay whole (persistent)."""
    return 7 * models.get(model).n_layers + 2


def claims(zero_result: dict | None = None) -> list[Claim]:
    """The note's ZeRO table and gather claims; with a ``experiments.zero`` result, the measured
    communication volume joins the ledger."""
    out = ZERO_TABLE + [
        Claim("3a", "all-gathers per forward, 70B (note: 32 x 4)", 128,
              lambda: _fetches_per_pass("llama-3-70b"),
              lambda: "DeepSpeed fetches per submodule: attention has 4 matrices and the MLP 3, not 2 "
                      "and 2; 70B has 80 layers, not 32; the embedding and head add 2. The backward pass "
                      "gathers them again.", unit="fetches")]
    if zero_result is not None:
        out.append(Claim(
            "3b", "communication per step, in units of psi", 1,
            lambda: zero_result["stages"]["3"]["comm_per_step_in_psi"],
            lambda: "One pass moves psi, but a step gathers the parameters for forward and again for "
                    "backward, and reduce-scatters the gradients: measured on "
                    f"{zero_result['ranks']} ranks, against "
                    f"{zero_result['stages']['0']['comm_per_step_in_psi']:g} psi for DDP.", unit="psi"))
    return out
