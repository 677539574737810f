"""Chapter 01's claims: the note's opening scenario (the 660 GB table) against our counts.

Capacity is what the GPU reports (``gpumem.memory.gpus``), and a fit is judged against capacity
and against usable memory (capacity minus the stated reserve), never against "80 GB".
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import accounting, gpus, models
from gpumem.memory.estimate import estimate

GB = units.GB
GPU = "h100-80gb"     # the note's GPU
N = 8                 # and how many


def _llama70() -> models.ModelConfig:
    return models.get("llama-3-70b")


def _states(recipe: str, zero: int = 0, gpus_: int = N) -> accounting.States:
    return accounting.model_states(_llama70().n_params(), recipe, gpus_, zero)


def _est(**kw) -> dict:
    return estimate(model="llama-3-70b", **kw).as_dict()["per_gpu"]


def _gb(value: float, digits: int = 0) -> str:
    return units.fmt(value, "GB", digits)


def capacity(n: int = N) -> int:
    """Bytes that ``n`` of the note's GPUs report, together."""
    return n * gpus.get(GPU).capacity


def usable(n: int = N) -> int:
    """Bytes that ``n`` of the note's GPUs leave for tensors, after the stated reserve."""
    return n * gpus.usable(GPU)


def _fit(total: int, have: int, room: int, what: str) -> str:
    """How ``total`` compares with ``have`` (capacity) and ``room`` (usable), in words."""
    if total > have:
        return f"{what}: {_gb(total, 1)}, over the capacity ({_gb(have, 1)}) by {_gb(total - have, 1)}"
    if total > room:
        return (f"{what}: {_gb(total, 1)}, under the capacity ({_gb(have, 1)}) but over the usable "
                f"{_gb(room, 1)} by {_gb(total - room, 1)}, so it fails for want of headroom")
    return f"{what}: {_gb(total, 1)}, within the usable {_gb(room, 1)}"


def _why_total() -> str:
    mixed, pure = _est()["total"], _est(recipe="pure-bf16")["total"]
    return (f"With the standard mixed recipe the states alone are {_gb(_states('mixed', gpus_=1).total)}; "
            f"{_fit(mixed, capacity(), usable(), 'the step')}. With the note's own pure-bf16 recipe, "
            f"{_fit(pure, capacity(), usable(), 'the step')}. The conclusion (8 GPUs are not enough "
            "without sharding) holds.")


def _why_s2() -> str:
    d = _est(recipe="pure-bf16", gpus=N, zero=3, checkpoint="full")
    one = gpus.get(GPU)
    have, room = one.capacity, gpus.usable(one)
    return ("Its own lines (17.5 + 17.5 + 35 + 20 + 17.5) add to 107.5, not 50, and DeepSpeed does "
            "not combine ZeRO-3 with pipeline parallelism. Pure bf16 + ZeRO-3 + full checkpointing: "
            + _fit(d["total"] - d["gathered"], have, room, "states and activations")
            + f"; ZeRO-3's working set (the gathered embedding and its gradient, "
            f"{_gb(d['gathered'], 1)}) makes it {_gb(d['total'], 1)}. It takes offload, more GPUs "
            "or a smaller optimizer state.")


CLAIMS = [
    Claim("1a", "70B parameters in bf16", 140 * GB, lambda: _states("mixed").params,
          lambda: f"Right: 2 bytes x {_llama70().n_params() / 1e9:.2f} B parameters (Meta's count)."),
    Claim("1a'", "70B gradients in bf16", 140 * GB, lambda: _states("mixed").grads,
          lambda: f"Right for bf16 gradients; DeepSpeed's accounting keeps fp32 gradients as well "
                  f"({_gb(_states('mixed-ds', gpus_=1).grads)})."),
    Claim("1b", "optimizer states", 280 * GB, lambda: _states("mixed").optimizer,
          lambda: "4 B/param is pure-bf16 AdamW. Standard mixed precision keeps an fp32 master copy "
                  "and fp32 m and v: 12 B/param."),
    Claim("1c", "activations, seq 4096, batch 1", 100 * GB, lambda: _est()["activations"],
          lambda: "Close by luck: the note's '32 layers x seq^2' formula is wrong twice: 70B has 80 "
                  "layers, and with FlashAttention no s^2 term is stored. Counted tensor by tensor: "
                  f"{_est_acts().per_layer / (4096 * 8192):.1f} sbh bytes a layer plus the logits at the loss."),
    Claim("1e", "memory of 8 x H100 '80 GB'", 640 * GB, capacity,
          lambda: f"An '80 GB' H100 reports {gpus.get(GPU).capacity // units.MiB:,} MiB "
                  f"({_gb(gpus.get(GPU).capacity, 1)}); after a reserve of {gpus.DEFAULT_RESERVE.describe()}, "
                  f"{_gb(gpus.usable(GPU), 1)} a GPU is usable, {_gb(usable(), 1)} for eight."),
    Claim("1d", "total for one training step", 660 * GB, lambda: _est()["total"], _why_total),
    Claim("S2", "ZeRO-3 + checkpointing, per GPU", 50 * GB,
          lambda: _est(recipe="pure-bf16", gpus=N, zero=3, checkpoint="full")["total"], _why_s2),
]


def _est_acts():
    return estimate(model="llama-3-70b").acts
