"""Chapter 02's claims: the note's ZeRO table (§1), its gather count and its volume.

Capacity verdicts use the GPU table (``gpumem.memory.gpus``): an "80 GB" H100 reports 81,559 MiB,
and what training may use is that minus a stated reserve.
"""

from functools import lru_cache

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.runs import zero3_schedule
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


def zero3_working_set(model: str = "llama-3-70b", recipe: str = "pure-bf16") -> dict:
    """What a ZeRO-3 rank holds beyond its shards, with DeepSpeed's defaults: the engine's one
    definition (``accounting.zero3_gathered``): the replayed steady peak of gathered parameters
    (prefetch and reuse at work), one full gradient of the largest module (the embedding's, before
    its reduce-scatter) and the contiguous reduce bucket. On demand (step 0) the gathered peak is
    only the largest module."""
    cfg = models.get(model)
    ws = accounting.zero3_gathered(cfg, recipe)
    return {"gathered_steady": ws.params, "gathered_on_demand": ws.grad, "largest_gradient": ws.grad,
            "reduce_bucket": ws.reduce, "total": int(ws)}


@lru_cache(maxsize=2)
def zero3_pure_bf16_fit(seq: int = 4096) -> dict:
    """Does ZeRO-3 with pure bf16 and full checkpointing fit 8 x H100 80GB? Judged once, from one
    GPU's timeline (``timeline.zero3_peak``, the verdict chapter 01 quotes too), beside the sum of
    the parts at their largest (states + working set + activation peak), which over-counts."""
    cfg = _llama70()
    states = _states("pure-bf16", 3).total
    working = zero3_working_set()["total"]
    acts = activations.activations(cfg, seq, 1, "flash", "full", "pure-bf16").peak
    from gpumem.memory import timeline   # records a full step on fake tensors (torch)
    z = timeline.zero3_peak(cfg, "pure-bf16", "full", 8, seq)
    usable = gpus.usable(CARD)
    return {"states": states, "working_set": working, "activations_full_ckpt": acts,
            "sum_of_parts": states + working + acts, "peak": z["total"],
            "peak_at": f"{z['phase']} {z['module']}", "at_peak": z["at"],
            "capacity": gpus.get(CARD).capacity, "usable": usable, "fits": z["total"] <= usable}


def _why_2c() -> str:
    f, w = zero3_pure_bf16_fit(), zero3_working_set()
    at = f["at_peak"]
    verdict = ("it fits, narrowly" if f["usable"] - f["peak"] < 5 * GB else "it fits") if f["fits"] else \
        f"over by {_gb(f['peak'] - f['usable'])}: it does not fit"
    return (f"The number is right for the note's pure-bf16 recipe (8 B/param over 8 GPUs), the "
            f"conclusion is not. An H100 80GB may use {_gb(f['usable'])} (it reports "
            f"{_gb(f['capacity'])}, less the reserve). A rank also holds ZeRO-3's working set, "
            f"{_gb(w['total'])} at its largest: {_gb(w['gathered_steady'])} of gathered parameters at the "
            f"steady peak, the embedding's full gradient ({_gb(w['largest_gradient'])}) and DeepSpeed's "
            f"reduce bucket ({_gb(w['reduce_bucket'])}); and activations. One GPU's timeline with full "
            f"checkpointing (chapter 01's row S2 quotes the same one) peaks at {_gb(f['peak'])} at "
            f"{f['peak_at']}: the sharded states {_gb(at['params'] + at['grads'] + at['optimizer'])} "
            f"(DeepSpeed allocates the gradient shard once, for the whole step), activations "
            f"{_gb(at['activations'])} (the layer inputs and the loss's tensors), temporaries "
            f"{_gb(at['temporaries'])} (the logits' gradient) and gathered parameters with the bucket "
            f"{_gb(at['gathered'])}: {verdict}. The sum of every part at its largest, "
            f"{_gb(f['sum_of_parts'])}, over-counts a little (the embedding's gradient and the forward's "
            f"activation peak never meet). The standard recipe needs {_gb(_states('mixed', 3).total)} "
            f"of states per GPU.")


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


def fetches_per_step(model: str = "llama-3-70b", config: dict | None = None) -> int:
    """Module fetches of one steady ZeRO-3 step, forward and backward, counted as the chapter's
    gather trace counts them (a fetch of a module that owns sharded parameters), on DeepSpeed's
    schedule replayed for ``model`` (``config``: its stage-3 keys, default DeepSpeed's)."""
    from .ds_ranks import gather_counts
    cfg = models.get(model)
    params = zero3_schedule.llama_params(cfg)
    keys = zero3_schedule.DEFAULTS | (config or {})
    keep = zero3_schedule.persistent(params, keys["stage3_param_persistence_threshold"])
    owners = {m for m, own in params.items() if any(p not in keep for p, _ in own)}
    c = gather_counts(zero3_schedule.simulate(zero3_schedule.fetch_order(cfg), params, keys), owners)["step1"]
    return c["forward_fetches"] + c["backward_fetches"]


def _why_3a() -> str:
    layers = models.get("llama-3-70b").n_layers
    return (f"Per step, as the note counts: DeepSpeed fetches each module that owns sharded weights before "
            f"its forward and again before its backward. The note draws a fused W_qkv, so a layer has 5 "
            f"matrices (W_qkv, W_o, gate, up, down); its 4 miss SwiGLU's gate. Llama-3-70B has {layers} layers, "
            f"not 32, and the embedding and the head add 2 per pass: with fused qkv "
            f"2 x {fetches_per_pass(5, layers)} = {2 * fetches_per_pass(5, layers):,}; the course's Llama keeps "
            f"q, k and v apart (7 per layer), 2 x {fetches_per_pass(7, layers)} = "
            f"{2 * fetches_per_pass(7, layers):,}. The norms stay whole (persistent), so no fetch gathers them.")


def _why_3b(zero_result: dict | None, trace: dict | None) -> str:
    big = zero3_schedule.step_volume("llama-3-70b")
    head = models.get("llama-3-70b").vocab * models.get("llama-3-70b").d_model
    parts = [f"Right per forward pass: a pass gathers every parameter once, psi. A step also gathers again "
             f"for backward what forward released (at 70B every layer but the head: the head, "
             f"{head / 1e9:.2f} B elements, runs forward and backward between a layer's two uses, beyond "
             f"DeepSpeed's 1e9-element reuse window), {big['for_backward_psi']:.3f} psi, and reduce-scatters "
             f"the gradients, psi: {big['for_forward_psi']:.3f} + {big['for_backward_psi']:.3f} + 1 = "
             f"{big['per_step_psi']:.3f} psi, {_gb(2 * big['per_step_psi'] * big['n_params'])} of bf16 "
             f"collectives per step (DeepSpeed's defaults, replayed)."]
    if zero_result is not None:
        s3 = zero_result["stages"]["3"]
        parts.append(f"From scratch ({zero_result['ranks']} ranks, every weight released after use) a step "
                     f"moves {s3['comm_per_step_in_psi']:.2f} psi "
                     f"({s3['comm_in_psi_by_kind']['all_gather']:.2f} gathered + "
                     f"{s3['comm_in_psi_by_kind']['reduce_scatter']:.2f} reduce-scattered); DDP moves "
                     f"{zero_result['stages']['0']['comm_per_step_in_psi']:.2f}.")
    if trace is not None:
        c, before = trace["counts"]["step1"], trace["counts"]["step0"]
        got = (c["bytes_gathered"] + before["after_step_bytes"]) / (4 * models.get(trace["model"]).n_params())
        deep = deeper_volume(trace["model"])
        parts.append(f"DeepSpeed on {trace['model']} ({trace['n_layers']} layers) gathers {got:.2f} psi per step: "
                     f"a shallow model keeps much of itself whole from forward to backward; at 80 layers the "
                     f"same rules gather {deep['gathered_psi']:.2f} psi.")
    return " ".join(parts)


def deeper_volume(model: str = "mini", layers: int = 80) -> dict:
    """DeepSpeed's schedule (replayed) for the traced model made ``layers`` deep, thresholds scaled
    as in the trace: the share of the model kept through the turn shrinks with depth."""
    cfg = models.with_layers(models.get(model), layers)
    return zero3_schedule.step_volume(cfg, scaled_zero3_config(cfg))


def claims(zero_result: dict | None = None, trace: dict | None = None) -> list[Claim]:
    """The note's ZeRO table and gather claims, graded per step as the note states them (70B,
    DeepSpeed's defaults, replayed); an ``experiments.zero`` result and/or an
    ``experiments.gather_trace`` result add what the runs measured to the explanation of 3b."""
    return ZERO_TABLE + [
        Claim("3a", "all-gathers per step, 70B (note: 32 x 4)", 128, fetches_per_step, _why_3a, unit="fetches"),
        Claim("3b", "communication = parameter size, per step", 1,
              lambda: zero3_schedule.step_volume("llama-3-70b")["per_step_psi"],
              lambda: _why_3b(zero_result, trace), unit="psi")]
