"""Chapter 06's claims: the note's section 4 (7B, 70B and 400B+ layouts) and its summary table of
savings and costs, against the planner and the engine's formulas.

Every ours-value is computed here from the library; :data:`BASIS` says, for each claim, whether
it is derived (a formula whose chapter tests compare it with traces or DeepSpeed) or measured (a
run of this chapter). Percentages of "memory saved" are of the quantity the note's row is about,
named in the claim. Where the recipe changes the figure a claim also carries ``ours_note``, the
figure under the note's own 2 + 2 + 4 bytes per parameter (``pure-bf16``), and the ledger grades
it under that recipe first, then under mixed precision (``ledger.table_two``).
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import accounting, activations, models, recompute_cost
from gpumem.planner import cost as planner_cost, memory as planner_memory

from .scenarios import LLAMA2_7B, layout_bytes, note_70b_layout, zero3_alone

GB = units.GB
P70 = models.get("llama-3-70b").n_params()
NOTE_RECIPE = "pure-bf16"   # the note's 2 + 2 + 4 bytes per parameter


def _gb(v: float) -> str:
    return units.fmt(v, "GB", 1)


def states_saving(recipe: str, zero: int, gpus: int = 8) -> float:
    """Per-GPU model-state saving of a ZeRO stage against plain data parallelism, in percent."""
    base = accounting.model_states(P70, recipe, gpus, 0).total
    return 100 * (1 - accounting.model_states(P70, recipe, gpus, zero).total / base)


def acts(cfg, policy: str = "none", kernel: str = "flash", seq: int = 4096, batch: int = 1, recipe: str = "mixed") -> int:
    """Activation peak of one step (``activations.activations``)."""
    return activations.activations(cfg, seq, batch, kernel, policy, recipe).peak


def act_saving(policy: str = "none", kernel: str = "flash", base_kernel: str = "flash") -> float:
    """Percent of the 8B activation peak (s 4096) a policy or kernel removes."""
    cfg = models.get("llama-3-8b")
    return 100 * (1 - acts(cfg, policy, kernel) / acts(cfg, "none", base_kernel))


def extra_compute(policy: str, impl: str = "scratch") -> float:
    """Recompute FLOPs over forward + backward, percent (8B, s 4096), priced as
    ``planner_cost.RERUN[impl]``: the whole-segment re-run (the note's picture, DeepSpeed's and
    Megatron's checkpoints) unless ``impl="torch"``, PyTorch's non-reentrant early-stop re-run."""
    return 100 * recompute_cost.step_flops(models.get("llama-3-8b"), 4096, 1, policy, impl)["overhead"]


WHOLE, EARLY = planner_cost.RERUN["scratch"], planner_cost.RERUN["torch"]


def _layers_drop(policy: str) -> float:
    """Percent of the 8B layers' activations (the loss's logits left out) a policy removes."""
    cfg = models.get("llama-3-8b")
    layers = [recompute_cost.activation_bytes(cfg, 4096, 1, p)["layer_peak"] for p in ("none", policy)]
    return 100 * (1 - layers[1] / layers[0])


def state_share(part: str, recipe: str) -> float:
    """Percent of a 70B GPU's model-state bytes (ZeRO-3, 8 GPUs) that ``part`` ("optimizer" or
    "params") is: what moving that part alone off the GPU saves. Chapter 05's ledger asks the same
    (``accounting.model_states``, the same call)."""
    s = accounting.model_states(P70, recipe, 8, 3)
    return 100 * getattr(s, part) / s.total


def offload_saving(offload: str, recipe: str = "mixed") -> float:
    """Per-GPU model-state bytes an offload removes at ZeRO-3 on 8 GPUs as DeepSpeed lays it out
    (the gradient partition follows the optimizer to the host), percent."""
    device = "nvme" if offload == "optimizer+params" else "cpu"
    before = accounting.model_states(P70, recipe, 8, 3).total
    return 100 * (1 - accounting.model_states(P70, recipe, 8, 3, offload, device).total / before)


def _pct(v: float) -> str:
    return f"{v:.4g}\u00a0%"     # a no-break space: the ledger's wrapping keeps "25 %" on one line


def _7b_states(recipe: str = "mixed") -> int:
    return accounting.model_states(LLAMA2_7B.n_params(), recipe).total


def _7b_grads_opt(recipe: str) -> int:
    s = accounting.model_states(LLAMA2_7B.n_params(), recipe, 1, 2)
    return s.grads + s.optimizer


def _7b_acts() -> int:
    return acts(LLAMA2_7B, seq=2048, batch=4)


def _note70(recipe: str) -> int:
    return layout_bytes("llama-3-70b", note_70b_layout(recipe))["total"]


def _pp4(recipe: str = "mixed") -> int:
    return layout_bytes("llama-3-70b", note_70b_layout(recipe, pp=4, zero=1))["total"]


CLAIMS = [
    Claim("7c", "7B, one A100 80GB, mixed precision: model states", 56 * GB, _7b_states,
          lambda: f"The note counts 2 + 2 + 4 bytes a parameter: {_gb(_7b_states(NOTE_RECIPE))} for Llama-2-7B's "
                  f"{LLAMA2_7B.n_params() / 1e9:.2f} B. Mixed precision, which the note names, keeps fp32 master "
                  f"weights and moments: 16 B a parameter, {_gb(_7b_states())}, more than the GPU holds before "
                  "any activation.", ours_note=lambda: _7b_states(NOTE_RECIPE)),
    Claim("7c-acts", "7B, batch 4, sequence 2048: activations", 8 * GB, _7b_acts,
          lambda: f"With flash attention and no checkpointing a Llama-2-7B step keeps {_gb(_7b_acts())} "
                  f"(the loss's logits included); about 8 GB needs every layer checkpointed: "
                  f"{_gb(acts(LLAMA2_7B, 'full', seq=2048, batch=4))}."),
    Claim("7c-B", "7B, one GPU, ZeRO-2: gradients + optimizer per GPU", 5.25 * GB,
          lambda: _7b_grads_opt("mixed"),
          lambda: "ZeRO divides by the number of data-parallel ranks; on one GPU it divides by one. The note "
                  "divides by 8 GPUs that scenario A does not have.", ours_note=lambda: _7b_grads_opt(NOTE_RECIPE)),
    Claim("8a-85", "70B, 8 GPUs, ZeRO-3 + checkpoint every 2 layers (mixed): per GPU", 85 * GB,
          lambda: _note70("mixed"),
          lambda: f"Mixed precision's 16 B a parameter over 8 GPUs is {_gb(16 * P70 / 8)} of states alone; with "
                  f"ZeRO-3's working set (the 1.05 B-parameter embedding gathered, its gradient) and activations, "
                  f"{_gb(_note70('mixed'))}. Under the note's own 8-byte recipe it is {_gb(_note70('pure-bf16'))}, "
                  f"over the {_gb(zero3_alone('pure-bf16').question['usable'])} an A100 80GB leaves: the note's "
                  "figure is right for its recipe, and does not fit.", ours_note=lambda: _note70(NOTE_RECIPE)),
    Claim("8a-55", "70B, 8 GPUs, PP 4 + ZeRO + checkpointing: per GPU", 55 * GB, _pp4,
          lambda: "DeepSpeed refuses ZeRO-2 and 3 with pipeline parallelism, so 4 stages leave ZeRO-1 over 2 "
                  f"replicas: each GPU keeps a quarter of the weights and gradients, {_gb(_pp4())} in all. "
                  f"Pipelining never goes below ZeRO-3's 1/8; about 55 GB needs offload (under the note's "
                  f"recipe: {_gb(_pp4(NOTE_RECIPE))}).", ours_note=lambda: _pp4(NOTE_RECIPE)),
    Claim("8b-bf16", "summary: BF16 halves memory: model-state bytes per parameter (fp32 keeps 16)", 8,
          lambda: accounting.RECIPE["mixed"].total,
          lambda: "fp32 keeps 4 + 4 + 8 bytes, bf16 mixed 2 + 2 + 12: 16 either way. The saving is in "
                  f"activations ({100 * (1 - acts(models.get('llama-3-8b')) / acts(models.get('llama-3-8b'), recipe='fp32')):.0f} % "
                  "for 8B) and speed. Pure bf16 (the note's recipe) does halve them: 8 B.", unit="B/param",
          ours_note=lambda: accounting.RECIPE[NOTE_RECIPE].total),
    Claim("8b-z1", "summary: ZeRO-1 saves (70B model states, 8 GPUs)", 60, lambda: states_saving("mixed", 1),
          lambda: f"Under the note's recipe 140 + 140 + 280/8 = 315 GB, not 215: 1 - (2 + 2 + 4/8)/8 = "
                  f"{_pct(states_saving(NOTE_RECIPE, 1))}, an arithmetic slip. Mixed precision's 1 - (4 + 12/8)/16 "
                  "comes near 60 % by chance.", unit="%", ours_note=lambda: states_saving(NOTE_RECIPE, 1)),
    Claim("8b-z2", "summary: ZeRO-2 saves (70B model states, 8 GPUs)", 66, lambda: states_saving("mixed", 2),
          lambda: f"1 - (2 + 6/8)/8 = {_pct(states_saving(NOTE_RECIPE, 2))} under the note's recipe; "
                  "1 - (2 + 14/8)/16 under mixed precision.", unit="%",
          ours_note=lambda: states_saving(NOTE_RECIPE, 2)),
    Claim("8b-z3", "summary: ZeRO-3 saves (70B model states, 8 GPUs)", 87, lambda: states_saving("mixed", 3),
          lambda: "1 - 1/N for any recipe: right.", unit="%", ours_note=lambda: states_saving(NOTE_RECIPE, 3)),
    Claim("8b-ac", "summary: full checkpointing saves (8B activation peak, s 4096)", 70, lambda: act_saving("full"),
          lambda: f"The layers drop to their inputs ({_layers_drop('full'):.0f} % less); the loss's logits "
                  "stay. Chapter 03 grades the same row (8b).", unit="%"),
    Claim("8b-ac-t", f"summary: full checkpointing, {WHOLE}: +FLOPs (8B, s 4096)", 30,
          lambda: extra_compute("full"),
          lambda: f"One more forward of the 32 layers, each re-run to its end as DeepSpeed's and Megatron's "
                  f"checkpoints do: {extra_compute('full'):.1f} % of forward + backward (chapter 03, 5a). "
                  f"PyTorch's non-reentrant checkpoint stops each re-run before the segment's last matmul "
                  f"({EARLY}): {extra_compute('full', 'torch'):.1f} %. The planner prices each plan's re-run "
                  "as its framework runs it.", unit="%"),
    Claim("8b-ac2", "summary: interval checkpointing saves (8B activation peak)", 50, lambda: act_saving("every-other"),
          lambda: "Judged on the step's peak, which is what has to fit: the logits do not shrink. The note's "
                  f"50 % holds for the layers alone, which drop {_layers_drop('every-other'):.0f} %. Chapter 03 "
                  "grades the same row (8b').", unit="%"),
    Claim("8b-ac2-t", f"summary: interval checkpointing, {WHOLE}: +FLOPs (8B)", 15,
          lambda: extra_compute("every-other"),
          lambda: f"Every other layer re-run: half of full recomputation, {extra_compute('every-other'):.1f} % "
                  f"(chapter 03, 8b''); the {EARLY} costs {extra_compute('every-other', 'torch'):.1f} %.",
          unit="%"),
    Claim("8b-cpu", "summary: CPU optimizer offload saves (70B GPU model states, ZeRO-3)", 50,
          lambda: state_share("optimizer", "mixed"), unit="%", ours_note=lambda: state_share("optimizer", NOTE_RECIPE),
          why=lambda: f"The optimizer states are 4 of the note's 8 bytes ({_pct(state_share('optimizer', NOTE_RECIPE))}: "
                      "exactly its figure) and 12 of mixed precision's 16. DeepSpeed moves the gradient partition "
                      f"with them, so only the bf16 parameter shard stays: {_pct(offload_saving('optimizer', NOTE_RECIPE))} "
                      f"and {_pct(offload_saving('optimizer'))} removed."),
    Claim("8b-nvme", "summary: parameter offload saves (70B GPU model states, ZeRO-3)", 20,
          lambda: state_share("params", "mixed"), unit="%", ours_note=lambda: state_share("params", NOTE_RECIPE),
          why=lambda: f"The bf16 parameters are 2 of 8 bytes ({_pct(state_share('params', NOTE_RECIPE))}) and 2 of 16. "
                      "Offloaded with the optimizer, the GPU keeps no model states between uses, only the layer "
                      f"being computed (the ZeRO-3 working set): {_pct(offload_saving('optimizer+params'))}."),
    Claim("8b-fa", "summary: FlashAttention saves (8B activation peak vs a naive kernel, s 4096)", 40,
          lambda: act_saving(kernel="flash", base_kernel="naive"),
          lambda: "No s x s scores are kept: the saving grows with the sequence (O(s^2) to O(s)).", unit="%"),
]

BASIS = {c.id: "derived" for c in CLAIMS}
BASIS |= {"8a-85": "derived (gpumem.planner.memory; its ZeRO-3 states measured on CPU ranks by the plan-proof run)"}
