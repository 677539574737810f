"""Chapter 02's claims: the note's ZeRO table (§1), its gather count and its volume.

Capacity verdicts use the GPU table (``gpumem.memory.gpus``): an "80 GB" H100 reports 81,559 MiB,
and what training may use is that minus a stated reserve.
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.dist import zero3_schedule
from gpumem.memory import accounting, activations, gpus, models

from .ds_ranks import scaled_zero3_config

GB = units.GB
CARD = "h100-80gb"


def _llama70() -> models.ModelConfig:
    return models.get("llama-3-70b")


def _states(recipe: str, zero: int = 0, gpus_: int = 8) -> accounting.States:
    return accounting.model_states(_llama70().n_params(), recipe, gpus_, zero)


def _gb(value: float) -> str:
    return units.fmt(value, "GB", 1)


def zero3_working_set(model: str = "llama-3-70b", elem_bytes: int = 2) -> dict:
    """What a ZeRO-3 rank holds beyond its shards in a steady step, with DeepSpeed's defaults: the
    replayed peak of gathered parameters (prefetch and reuse at work) plus one full gradient of
    the largest module (the embedding's, before its reduce-scatter). On demand (step 0) the
    gathered peak is only the largest module, what ``accounting.zero3_gathered`` counts."""
    cfg = models.get(model)
    steady = zero3_schedule.steady_peak(cfg, elem_bytes=elem_bytes)["bytes"]
    on_demand = int(accounting.zero3_gathered(cfg, "pure-bf16" if elem_bytes == 2 else "fp32").params)
    grad = elem_bytes * cfg.largest_layer_params()
    return {"gathered_steady": steady, "gathered_on_demand": on_demand, "largest_gradient": grad,
            "total": steady + grad}


def zero3_pure_bf16_fit(seq: int = 4096, micro_batch: int = 1) -> dict:
    """Does ZeRO-3 with pure bf16 fit 8 x H100 80GB? States, the steady working set and activations
    with full checkpointing (the least activation memory) against the card's usable bytes."""
    cfg = _llama70()
    states = _states("pure-bf16", 3).total
    working = zero3_working_set()["total"]
    acts = activations.activations(cfg, seq, micro_batch, "flash", "full", "pure-bf16").peak
    usable = gpus.usable(CARD)
    return {"states": states, "working_set": working, "activations_full_ckpt": acts,
            "needed": states + working + acts, "capacity": gpus.get(CARD).capacity, "usable": usable,
            "fits": states + working + acts <= usable}


def _why_2c() -> str:
    f, w = zero3_pure_bf16_fit(), zero3_working_set()
    return (f"The number is right for pure bf16, the conclusion is not. An H100 80GB may use "
            f"{_gb(f['usable'])} (it reports {_gb(f['capacity'])}, less the reserve), so {_gb(f['states'])} "
            f"of states leave {_gb(f['usable'] - f['states'])}. A ZeRO-3 rank also holds its working set: "
            f"{_gb(w['gathered_steady'])} of gathered parameters at the steady peak (replayed with DeepSpeed's "
            f"defaults) and the embedding's full gradient ({_gb(w['largest_gradient'])}), {_gb(f['working_set'])}. "
            f"Activations come on top: {_gb(f['activations_full_ckpt'])} at 4,096 tokens even with full "
            f"checkpointing (each layer keeps only its input and recomputes the rest in backward; chapter 03). "
            f"{_gb(f['needed'])} in all, over the {_gb(f['usable'])}. The standard recipe needs "
            f"{_gb(_states('mixed', 3).total)} of states per GPU.")


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
    Claim("2c", "ZeRO-3, per GPU (everything / 8)", 70 * GB, lambda: _states("pure-bf16", 3).total, _why_2c),
]


def fetches_per_pass(modules_per_layer: int, layers: int) -> int:
    """Modules whose sharded parameters ZeRO-3 gathers in one forward pass: DeepSpeed fetches per
    module that owns parameters (a bias lives in its Linear; the persistent norms stay whole), so
    the weight-carrying modules of a block times the layers, plus the embedding and the (untied)
    output head."""
    return modules_per_layer * layers + 2


def _fetches_per_pass(model: str) -> int:
    """The course's Llama: 7 linear layers per block (q, k, v, o, gate, up, down), the embedding
    and the untied head."""
    return fetches_per_pass(7, models.get(model).n_layers)


def _per_pass(zero_result: dict | None, trace: dict | None) -> float:
    """Parameters all-gathered for one forward pass, in psi: from DeepSpeed's trace (what a
    steady step gathers for forward, plus the persistent norms gathered after the step before),
    else from scratch (half of stage 3's all-gather volume)."""
    if trace is not None:
        c, before = trace["counts"]["step1"], trace["counts"]["step0"]
        return (c["gathered_for"]["forward"] + before["after_step_bytes"]) / (4 * models.get(trace["model"]).n_params())
    return zero_result["stages"]["3"]["comm_in_psi_by_kind"]["all_gather"] / 2


def _why_3b(zero_result: dict | None, trace: dict | None) -> str:
    big = zero3_schedule.step_volume("llama-3-70b")
    parts = ["Per pass the note is right: a pass gathers every parameter once, psi.",
             "A step is forward + backward + the gradient reduce-scatter."]
    if zero_result is not None:
        s3 = zero_result["stages"]["3"]
        parts.append(f"From scratch ({zero_result['ranks']} ranks) a step moves {s3['comm_per_step_in_psi']:.2f} psi "
                     f"({s3['comm_in_psi_by_kind']['all_gather']:.2f} gathered + "
                     f"{s3['comm_in_psi_by_kind']['reduce_scatter']:.2f} reduce-scattered); DDP moves "
                     f"{zero_result['stages']['0']['comm_per_step_in_psi']:.2f}.")
    if trace is not None:
        c, before = trace["counts"]["step1"], trace["counts"]["step0"]
        got = (c["bytes_gathered"] + before["after_step_bytes"]) / (4 * models.get(trace["model"]).n_params())
        deep = deeper_volume(trace["model"])
        parts.append(f"DeepSpeed on {trace['model']} ({trace['n_layers']} layers) gathers {got:.2f} psi per step, "
                     f"+ 1 psi reduce-scattered: a shallow model keeps much of itself whole from forward to "
                     f"backward; at 80 layers the same rules gather {deep['gathered_psi']:.2f} psi.")
    parts.append(f"Llama-3-70B with DeepSpeed's defaults: {big['gathered_psi']:.3f} + 1 = {big['per_step_psi']:.2f} "
                 f"psi per step, {_gb(2 * big['per_step_psi'] * big['n_params'])} of bf16 collectives.")
    return " ".join(parts)


def deeper_volume(model: str = "mini", layers: int = 80) -> dict:
    """DeepSpeed's schedule (replayed) for the traced model made ``layers`` deep, thresholds scaled
    as in the trace: the share of the model kept through the turn shrinks with depth."""
    cfg = models.with_layers(models.get(model), layers)
    return zero3_schedule.step_volume(cfg, scaled_zero3_config(cfg))


def claims(zero_result: dict | None = None, trace: dict | None = None) -> list[Claim]:
    """The note's ZeRO table and gather claims; with an ``experiments.zero`` result and/or a
    ``experiments.gather_trace`` result, the measured communication volume joins the ledger."""
    out = ZERO_TABLE + [
        Claim("3a", "all-gathers per forward, 70B (note: 32 x 4)", 128,
              lambda: _fetches_per_pass("llama-3-70b"),
              lambda: "DeepSpeed fetches per submodule: attention has 4 matrices and the MLP 3, not 2 "
                      "and 2; 70B has 80 layers, not 32; the embedding and head add 2. The backward pass "
                      "gathers them again.", unit="fetches")]
    if zero_result is not None or trace is not None:
        out.append(Claim("3b", "communication = parameter size (per pass)", 1,
                         lambda: _per_pass(zero_result, trace), lambda: _why_3b(zero_result, trace), unit="psi"))
    return out
