"""Chapter 06's claims: the note's section 4 (7B, 70B and 400B+ layouts) and its summary table of
savings and costs, against the planner and the engine's formulas.

Every ours-value is computed here from the library; :data:`BASIS` says, for each claim, whether
it is derived (a formula whose chapter tests compare it with traces or DeepSpeed) or measured (a
run of this chapter). Percentages of "memory saved" are of the quantity the note's row is about,
named in the claim.
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import accounting, activations, models, planner_memory, recompute_cost

from .scenarios import LLAMA2_7B, layout_bytes, note_70b_layout, zero3_alone

GB = units.GB
P70 = models.get("llama-3-70b").n_params()


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


def extra_compute(policy: str) -> float:
    """Recompute FLOPs over forward + backward, percent (8B, s 4096, PyTorch's checkpoint)."""
    return 100 * recompute_cost.step_flops(models.get("llama-3-8b"), 4096, 1, policy, "torch")["overhead"]


def offload_saving(offload: str) -> float:
    """Per-GPU model-state bytes removed by offloading at ZeRO-3 on 8 GPUs (mixed), percent, as
    the planner counts it (gradient partitions follow the optimizer to the host)."""
    cfg = models.get("llama-3-70b")
    base = planner_memory.states_part(cfg, note_70b_layout())
    lay = note_70b_layout()
    moved = planner_memory.states_part(cfg, lay.__class__(**{**lay.__dict__, "offload": offload}))
    tot = lambda s: s["params"] + s["grads"] + s["optimizer"]  # noqa: E731
    return 100 * (1 - tot(moved) / tot(base))


def _7b_states() -> int:
    return accounting.model_states(LLAMA2_7B.n_params(), "mixed").total


def _7b_acts() -> int:
    return acts(LLAMA2_7B, seq=2048, batch=4)


def _note70(recipe: str) -> int:
    return layout_bytes("llama-3-70b", note_70b_layout(recipe))["total"]


def _pp4() -> int:
    return layout_bytes("llama-3-70b", note_70b_layout("mixed", pp=4, zero=1))["total"]


CLAIMS = [
    Claim("7c", "7B, one A100 80GB, mixed precision: model states", 56 * GB, _7b_states,
          lambda: f"The note counts 2 + 2 + 4 bytes a parameter. Mixed precision keeps fp32 master weights and "
                  f"moments: 16 B x {LLAMA2_7B.n_params() / 1e9:.2f} B parameters = {_gb(_7b_states())}, more "
                  "than the GPU holds before any activation."),
    Claim("7c-acts", "7B, batch 4, sequence 2048: activations", 8 * GB, _7b_acts,
          lambda: f"With flash attention and no checkpointing a Llama-2-7B step keeps {_gb(_7b_acts())} "
                  f"(the loss's logits included); about 8 GB needs every layer checkpointed: "
                  f"{_gb(acts(LLAMA2_7B, 'full', seq=2048, batch=4))}."),
    Claim("7c-B", "7B, one GPU, ZeRO-2: gradients + optimizer per GPU", 5.25 * GB,
          lambda: (lambda s: s.grads + s.optimizer)(accounting.model_states(LLAMA2_7B.n_params(), "mixed", 1, 2)),
          lambda: "ZeRO divides by the number of data-parallel ranks; on one GPU it divides by one. The note "
                  "divides by 8 GPUs that scenario A does not have."),
    Claim("8a-85", "70B, 8 GPUs, ZeRO-3 + checkpoint every 2 layers (mixed): per GPU", 85 * GB,
          lambda: _note70("mixed"),
          lambda: f"Mixed precision's 16 B a parameter over 8 GPUs is {_gb(16 * P70 / 8)} of states alone; with "
                  f"ZeRO-3's working set (the 1.05 B-parameter embedding gathered, its gradient) and activations, "
                  f"{_gb(_note70('mixed'))}. Under the note's own 8-byte recipe it is {_gb(_note70('pure-bf16'))}, "
                  f"still over the {_gb(zero3_alone('pure-bf16').question['usable'])} an A100 80GB leaves."),
    Claim("8a-55", "70B, 8 GPUs, PP 4 + ZeRO + checkpointing: per GPU", 55 * GB, _pp4,
          lambda: "DeepSpeed refuses ZeRO-2 and 3 with pipeline parallelism, so 4 stages leave ZeRO-1 over 2 "
                  f"replicas: each GPU keeps a quarter of the weights and gradients, {_gb(_pp4())} in all. "
                  "Pipelining never goes below ZeRO-3's 1/8; about 55 GB needs offload."),
    Claim("8b-bf16", "summary: BF16 halves memory: model-state bytes per parameter (fp32 keeps 16)", 8,
          lambda: accounting.RECIPE["mixed"].total,
          lambda: "fp32 keeps 4 + 4 + 8 bytes, bf16 mixed 2 + 2 + 12: 16 either way. The saving is in "
                  f"activations ({100 * (1 - acts(models.get('llama-3-8b')) / acts(models.get('llama-3-8b'), recipe='fp32')):.0f} % "
                  "for 8B) and speed.", unit="B/param"),
    Claim("8b-z1", "summary: ZeRO-1 saves (70B model states, 8 GPUs)", 60, lambda: states_saving("mixed", 1),
          lambda: f"1 - (4 + 12/8)/16 under mixed precision; under the note's 8-byte recipe "
                  f"{states_saving('pure-bf16', 1):.2f} %.", unit="%"),
    Claim("8b-z2", "summary: ZeRO-2 saves (70B model states, 8 GPUs)", 66, lambda: states_saving("mixed", 2),
          lambda: f"1 - (2 + 14/8)/16; the note's recipe {states_saving('pure-bf16', 2):.2f} %.", unit="%"),
    Claim("8b-z3", "summary: ZeRO-3 saves (70B model states, 8 GPUs)", 87, lambda: states_saving("mixed", 3),
          lambda: "1 - 1/N for any recipe: right.", unit="%"),
    Claim("8b-ac", "summary: full checkpointing saves (8B activation peak, s 4096)", 70, lambda: act_saving("full"),
          lambda: f"The layers drop to their inputs; the loss's logits stay. Extra compute "
                  f"{extra_compute('full'):.1f} % (PyTorch's checkpoint), not 30 %.", unit="%"),
    Claim("8b-ac2", "summary: interval checkpointing saves (8B activation peak)", 50, lambda: act_saving("every-other"),
          lambda: f"Every other layer checkpointed: {extra_compute('every-other'):.1f} % extra compute "
                  "(the note: 15 %).", unit="%"),
    Claim("8b-cpu", "summary: CPU optimizer offload saves (70B GPU model states, ZeRO-3)", 50,
          lambda: offload_saving("optimizer"),
          lambda: "The optimizer states are 12 of 16 bytes; DeepSpeed moves the gradient partitions with "
                  "them, so only the bf16 parameter shard stays.", unit="%"),
    Claim("8b-nvme", "summary: parameter offload saves (70B GPU model states, ZeRO-3)", 20,
          lambda: offload_saving("optimizer+params"),
          lambda: "With parameters offloaded too, the GPU keeps no model states between uses, only the "
                  "layer being computed (the ZeRO-3 working set). The note's 20 % has no source.", unit="%"),
    Claim("8b-fa", "summary: FlashAttention saves (8B activation peak vs a naive kernel, s 4096)", 40,
          lambda: act_saving(kernel="flash", base_kernel="naive"),
          lambda: "No s x s scores are kept: the saving grows with the sequence (O(s^2) to O(s)).", unit="%"),
]

BASIS = {c.id: "derived" for c in CLAIMS}
BASIS |= {"8a-85": "derived (planner_memory; its ZeRO-3 states measured on CPU ranks by the plan-proof run)"}
