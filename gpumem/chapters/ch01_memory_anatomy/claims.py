"""Chapter 01's claims: the note's opening scenario (the 660 GB table) against our counts.

The scenario: 8 H100s, each running one sequence of 4,096 tokens (micro-batch 1, data parallel).
Capacity is what the GPU reports (``gpumem.memory.gpus``); a fit is judged per GPU, by the
traced peak (``steps``), against usable memory (capacity minus the stated reserve), never
against "80 GB". The sum of all parts is shown beside it as the safe bound it is.
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import accounting, gpus, models
from gpumem.memory.estimate import estimate

from . import steps

GB = units.GB
MODEL = "llama-3-70b"
GPU = "h100-80gb"     # the note's GPU
N = 8                 # and how many, each running one sequence of 4,096 tokens (micro-batch 1)


def _llama70() -> models.ModelConfig:
    return models.get("llama-3-70b")


def _states(recipe: str, zero: int = 0, gpus_: int = N) -> accounting.States:
    return accounting.model_states(_llama70().n_params(), recipe, gpus_, zero)


def _est(**kw) -> dict:
    out = estimate(model=MODEL, **kw).as_dict()
    return out["per_gpu"] | {"gathered_parts": out.get("gathered_parts", {})}


def _gb(value: float, digits: int = 0) -> str:
    return units.fmt(value, "GB", digits)


def capacity(n: int = N) -> int:
    """Bytes that ``n`` of the note's GPUs report, together."""
    return n * gpus.get(GPU).capacity


def usable(n: int = N) -> int:
    """Bytes that ``n`` of the note's GPUs leave for tensors, after the stated reserve."""
    return n * gpus.usable(GPU)


def _why_total() -> str:
    mixed, pure = steps.trace(MODEL, "mixed"), steps.trace(MODEL, "pure-bf16")
    split = steps.split_states(MODEL, "pure-bf16", N)
    one = gpus.get(GPU)
    return ("The note adds one copy of the model states to one sequence's activations. With the "
            f"standard mixed recipe the states alone are {_gb(_states('mixed', gpus_=1).total)}, and one "
            f"sequence's step peaks at {_gb(mixed.total_peak, 1)} (traced, in the {mixed.total_peak_moment.phase} "
            f"step; every part summed: {_gb(_est()['total'], 1)}, a safe upper bound here). With the note's "
            f"pure-bf16 recipe: {_gb(pure.total_peak, 1)} (sum {_gb(_est(recipe='pure-bf16')['total'], 1)}). "
            f"Set against {N} GPUs' memory, that mixes one sequence with {N}: at batch 1 on each of {N} "
            f"GPUs the step runs {N} sequences, and every GPU holds its own sequence's activations "
            f"({_gb(split['activations'], 1)}), more than one GPU's usable {_gb(gpus.usable(one), 1)}. "
            f"Even with the pure-bf16 states split evenly {N} ways, a GPU holds at least "
            f"{_gb(split['at_least'], 1)}. The conclusion (it does not fit) holds, for that reason: "
            "no division of the states can help until the activations shrink (chapter 03).")


def _why_s2() -> str:
    z = steps.zero3_peak(MODEL, "pure-bf16", "full", N)
    d = _est(recipe="pure-bf16", gpus=N, zero=3, checkpoint="full")
    one = gpus.get(GPU)
    fits = z["total"] <= gpus.usable(one)
    return ("Its own lines (17.5 + 17.5 + 35 + 20 + 17.5) add to 107.5, not 50, and DeepSpeed does "
            "not combine ZeRO-3 with pipeline parallelism (layers split across GPUs in stages). "
            "Pure bf16 + ZeRO-3 on 8 + full checkpointing, from one GPU's timeline (chapter 02's row 2c "
            f"quotes the same one): it peaks at {_gb(z['total'], 1)} in {z['phase']} ({z['module'] or 'loss'}), "
            f"with the sharded states (the gradient shard is allocated for the whole step), one "
            f"sequence's checkpointed activations, the logits' gradient, and ZeRO-3's gathered "
            f"parameters and reduce bucket ({_gb(z['at']['gathered'], 1)}; the working set at its "
            f"largest is {_gb(d['gathered'], 1)} = "
            + " + ".join(f"{name} {_gb(b, 1)}" for name, b in d["gathered_parts"].items())
            + "; the largest module is the embedding or the output head, 1.05 B parameters each); "
            + (f"{_gb(gpus.usable(one) - z['total'], 1)} under the usable {_gb(gpus.usable(one), 1)}: it fits."
               if fits else f"{_gb(z['total'] - gpus.usable(one), 1)} over the usable {_gb(gpus.usable(one), 1)}: "
               "it does not fit.")
            + f" Summing every part at its largest gives {_gb(d['total'], 1)}: a safe bound that "
            + ("agrees here." if (d["total"] > gpus.usable(one)) != fits else "is too coarse to decide here."))


CLAIMS = [
    Claim("1a", "70B parameters in bf16", 140 * GB, lambda: _states("mixed").params,
          lambda: f"Right: 2 bytes x {_llama70().n_params() / 1e9:.2f} B parameters (Meta's count)."),
    Claim("1a'", "70B gradients in bf16", 140 * GB, lambda: _states("mixed").grads,
          lambda: f"Right for bf16 gradients; the mixed-ds recipe (DeepSpeed's BF16_Optimizer, "
                  f"Megatron's --bf16) keeps fp32 gradients instead ({_gb(_states('mixed-ds', gpus_=1).grads)})."),
    Claim("1b", "optimizer states", 280 * GB, lambda: _states("mixed").optimizer,
          lambda: "4 B/param is pure-bf16 AdamW. Standard mixed precision keeps an fp32 master copy "
                  "and fp32 m and v: 12 B/param."),
    Claim("1c", "activations, seq 4096, batch 1", 100 * GB, lambda: _est()["activations"],
          lambda: "Close by luck: the note's '32 layers x seq^2' formula is wrong twice: 70B has 80 "
                  "layers, and with FlashAttention no s^2 term is stored. Counted tensor by tensor: "
                  f"{_est_acts().per_layer / (4096 * 8192):.1f} sbh bytes a layer plus the logits at the loss."),
    Claim("1d", "one step's peak, one sequence", 660 * GB, lambda: steps.trace(MODEL, "mixed").total_peak,
          _why_total),
    Claim("1e", "memory of 8 x H100 '80 GB'", 640 * GB, capacity,
          lambda: f"An '80 GB' H100 reports {gpus.get(GPU).capacity // units.MiB:,} MiB "
                  f"({_gb(gpus.get(GPU).capacity, 1)}); after a reserve of {gpus.DEFAULT_RESERVE.describe()}, "
                  f"{_gb(gpus.usable(GPU), 1)} a GPU is usable, {_gb(usable(), 1)} for eight. A step is "
                  "judged per GPU, though: the eight add up only for what is split among them."),
    Claim("S2", "ZeRO-3 + checkpointing, per GPU", 50 * GB,
          lambda: steps.zero3_peak(MODEL, "pure-bf16", "full", N)["total"], _why_s2),
]


def _est_acts():
    return estimate(model=MODEL).acts
