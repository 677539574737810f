"""Chapter 03's claims: the note's section on activation checkpointing (重计算), its summary
table's two checkpointing rows, and its 70B figures, against our counts.

Bytes are the formula of ``gpumem.memory.recompute_cost``, which the chapter's tests prove equal
to fake-tensor traces (Llama-3-8B, 70B) and to real CPU measurements; FLOPs are PyTorch's
``FlopCounterMode`` counts, which the same tests prove equal to the formula. "Extra compute"
is recompute FLOPs over forward + backward FLOPs, for a checkpoint that re-runs whole segments
(the note's picture; DeepSpeed's and Megatron's checkpoints do so).
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import activations, models, recompute_cost

GB = units.GB
SEQ = 4096


def _acts(model: str, plan: str, key: str = "peak", seq: int = SEQ) -> int:
    return recompute_cost.activation_bytes(models.get(model), seq, 1, plan)[key]


def extra(model: str, plan: str, impl: str = "scratch", seq: int = SEQ) -> float:
    """Recompute FLOPs as a percentage of forward + backward FLOPs."""
    return 100 * recompute_cost.step_flops(models.get(model), seq, 1, plan, impl)["overhead"]


def saving(model: str, plan: str, seq: int = SEQ) -> float:
    """How much of the step's activation peak a plan removes, in percent."""
    return 100 * (1 - _acts(model, plan, seq=seq) / _acts(model, "none", seq=seq))


def scores_bytes(model: str = "llama-3-8b", seq: int = SEQ, batch: int = 16) -> int:
    """fp32 attention scores, one s x s matrix per query head, per layer, per sequence."""
    cfg = models.get(model)
    return 4 * seq * seq * cfg.n_heads * cfg.n_layers * batch


def naive_acts(model: str = "llama-3-8b", seq: int = SEQ) -> int:
    """The step's activation peak with no checkpointing and a naive attention kernel, which keeps
    each layer's bf16 probabilities (and a bool mask) for backward."""
    return activations.activations(models.get(model), seq, 1, "naive", "none").peak


def _gb(v: float, digits: int = 2) -> str:
    return units.fmt(v, "GB", digits)


def _off(claim_id: str) -> str:
    """How far the note's figure is from ours, as a percentage of ours."""
    c = next(c for c in CLAIMS if c.id == claim_id)
    return f"{100 * abs(c.note - c.ours()) / c.ours():.1f} %"


def _best70() -> int:
    """The segment length with the lowest step peak, logits included, at 70B and s 4096."""
    return recompute_cost.best_segment_length(models.get("llama-3-70b"), SEQ, with_loss=True)


def _why_layers(plan: str) -> str:
    a = recompute_cost.activation_bytes(models.get("llama-3-8b"), SEQ, 1, plan)
    return (f"Near the note for the layers, {_gb(a['layer_peak'])}: checkpoints of 2*s*h bytes "
            f"({_gb(a['checkpoint'])} each) plus the layers being re-run ({_gb(a['per_layer'])} a layer, "
            f"flash attention). The step's peak is {_gb(a['peak'])}: the loss's bf16 logits, their fp32 "
            f"copy and log-softmax ({_gb(a['loss'])}) are alive when the forward ends.")


CLAIMS = [
    Claim("4", "attention scores kept for backward (8B shape, s 4096, 32 layers, batch 16)", 32 * GB,
          scores_bytes,
          lambda: "64 MB (64 MiB) is one head's fp32 s x s matrix, and every query head has its own "
                  f"(32 in Llama-3-8B; GQA shares only K and V): {_gb(scores_bytes(), 0)}. FlashAttention "
                  "keeps none of it: its backward recomputes S block by block from q, k and a logsumexp per row."),
    Claim("5a", "every layer checkpointed, whole-segment re-run: extra compute (8B, s 4096)", 30, lambda: extra("llama-3-8b", "full"),
          lambda: f"One extra forward of the 32 layers: {extra('llama-3-8b', 'full'):.1f} % of forward + "
                  "backward, not 33 %, because the output head is not re-run and the flash kernel's backward "
                  "costs 2.5x its forward. Causal attention is counted in full, as FlopCounterMode counts it (4*s^2*h "
                  "a layer); causal flash kernels on a GPU skip the masked half, so there the core costs about "
                  "half, in the re-run and in the step alike, and the share barely moves. PyTorch's non-reentrant checkpoint re-runs less, "
                  f"{extra('llama-3-8b', 'full', 'torch'):.1f} %: it stops each re-run at the last tensor "
                  "backward needs, so every segment's final W_down matmul is skipped.", unit="%"),
    Claim("5b", "8B, s 4096, batch 1, no checkpointing: activations", 64 * GB, lambda: _acts("llama-3-8b", "none"),
          lambda: f"41*s*b*h bytes a layer with flash attention: {_gb(_acts('llama-3-8b', 'none', 'layer_peak'))} "
                  f"for 32 layers, plus the loss's logits, {_gb(_acts('llama-3-8b', 'none'))} in all (traced). "
                  "No s^2 term: flash attention keeps no scores. The figure is kernel-dependent: with a "
                  "naive kernel it is the note's (5b-naive)."),
    Claim("5b-naive", "8B, s 4096, batch 1, no checkpointing, naive attention: activations", 64 * GB,
          naive_acts,
          lambda: f"A kernel that materialises the scores keeps each layer's bf16 probabilities, 2*a*s^2 bytes, "
                  f"and a bool causal mask: {_gb(naive_acts())} in all, logits included. The note's 64 GB "
                  "is right for that kernel, not for the flash attention Llama-3 trains with."),
    Claim("5c", "every layer checkpointed: the layers' activations (8B)", 2 * GB,
          lambda: _acts("llama-3-8b", "full", "layer_peak"),
          lambda: _why_layers("full") + f" The note's round 2 GB is {_off('5c')} above the layers' "
                  "figure, just past the 15 % that the ledger still calls close: the right size, "
                  "rounded up too far."),
    Claim("5d", "checkpoint every 2 layers: the layers' activations (8B)", 4 * GB,
          lambda: _acts("llama-3-8b", "every-2", "layer_peak"),
          lambda: "Half as many checkpoints, but two layers re-run at once: "
                  f"{_gb(_acts('llama-3-8b', 'every-2', 'layer_peak'))}, about what every layer costs "
                  f"({_gb(_acts('llama-3-8b', 'full', 'layer_peak'))}), not twice it."),
    Claim("5d'", "checkpoint every 2 layers, whole-segment re-run: extra compute (8B)", 15, lambda: extra("llama-3-8b", "every-2"),
          lambda: "Spacing moves memory, not FLOPs: every layer in a segment still runs its forward twice, "
                  f"{extra('llama-3-8b', 'every-2'):.1f} % as with every layer. Checkpointing every other "
                  f"layer (the rest not at all) costs {extra('llama-3-8b', 'every-other'):.1f} %: that is "
                  "the note's +15 %.", unit="%"),
    Claim("8b", "summary: full-layer checkpointing saves (8B activation peak)", 70,
          lambda: saving("llama-3-8b", "full"),
          lambda: f"{_gb(_acts('llama-3-8b', 'none'))} -> {_gb(_acts('llama-3-8b', 'full'))}; without the "
                  f"loss's logits the layers drop {100 * (1 - _acts('llama-3-8b', 'full', 'layer_peak') / _acts('llama-3-8b', 'none', 'layer_peak')):.0f} %.",
          unit="%"),
    Claim("8b'", "summary: interval checkpointing saves (8B activation peak)", 50,
          lambda: saving("llama-3-8b", "every-other"),
          lambda: "Judged on the step's peak, which is what has to fit: every other layer checkpointed "
                  f"saves {saving('llama-3-8b', 'every-other'):.0f} %, because the logits "
                  f"({_gb(_acts('llama-3-8b', 'none', 'loss'))}) do not shrink. The note's 50 % holds for "
                  "the layers' part alone, which drops "
                  f"{100 * (1 - _acts('llama-3-8b', 'every-other', 'layer_peak') / _acts('llama-3-8b', 'none', 'layer_peak')):.0f} %.",
          unit="%"),
    Claim("8b''", "summary: interval checkpointing, whole-segment re-run: extra compute (8B)", 15, lambda: extra("llama-3-8b", "every-other"),
          lambda: "Half the layers run their forward twice: half of full recomputation's "
                  f"{extra('llama-3-8b', 'full'):.1f} %.", unit="%"),
    Claim("S0", "70B, ZeRO-3 + recomputation: activations per GPU", 20 * GB, lambda: _acts("llama-3-70b", "full"),
          lambda: f"80 checkpoints of 2*s*h bytes and one 70B layer re-run: {_gb(_acts('llama-3-70b', 'full', 'layer_peak'))}; "
                  f"the loss's logits make the peak {_gb(_acts('llama-3-70b', 'full'))}. ZeRO does not shard "
                  "activations: each GPU holds its own micro-batch's."),
    Claim("S4", "70B, checkpoint every 2 layers: activations per GPU", 15 * GB,
          lambda: _acts("llama-3-70b", "every-2"),
          lambda: f"40 checkpoints and two layers re-run: {_gb(_acts('llama-3-70b', 'every-2', 'layer_peak'))}, "
                  f"{_gb(_acts('llama-3-70b', 'every-2'))} with the logits. Two-layer segments give the layers' "
                  "lowest re-run peak at 80 layers (the checkpoints cost more than a second layer re-run); "
                  f"counting the logits, {_best70()}-layer segments give the lowest step peak, "
                  f"{_gb(_acts('llama-3-70b', f'every-{_best70()}'))}, because a re-run below the logits costs nothing."),
]
