"""Chapter 01's claims: the note's opening scenario (the 660 GB table) against our counts."""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import accounting, models
from gpumem.memory.estimate import estimate

GB = units.GB


def _llama70() -> models.ModelConfig:
    return models.get("llama-3-70b")


def _states(recipe: str, zero: int = 0, gpus: int = 8) -> accounting.States:
    return accounting.model_states(_llama70().n_params(), recipe, gpus, zero)


def _est(**kw) -> dict:
    return estimate(model="llama-3-70b", **kw).as_dict()["per_gpu"]


def _gb(value: float) -> str:
    return units.fmt(value, "GB", 0)


CLAIMS = [
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
    Claim("S2", "ZeRO-3 + checkpointing, per GPU", 50 * GB,
          lambda: _est(recipe="pure-bf16", gpus=8, zero=3, checkpoint="full")["total"],
          lambda: "Its own lines (17.5 + 17.5 + 35 + 20 + 17.5) add to 107.5, not 50, and DeepSpeed "
                  "does not combine ZeRO-3 with pipeline parallelism. Even pure bf16 + ZeRO-3 + full "
                  "checkpointing is over 80 GB: it takes offload or more GPUs."),
]


def _est_acts():
    return estimate(model="llama-3-70b").acts
