"""Chapter 03's claims: the note's section on activation checkpointing (重计算), its summary
table's two checkpointing rows, and its 70B figures, against our counts and the papers.

Bytes are the formula of ``gpumem.memory.recompute_cost``, which the chapter's tests prove equal
to fake-tensor traces (Llama-3-8B, 70B) and to real CPU measurements; FLOPs are PyTorch's
``FlopCounterMode`` counts, which the same tests prove equal to the formula. "Extra compute"
is recompute FLOPs over forward + backward FLOPs, priced as a *whole-segment re-run* (the note's
picture; DeepSpeed's and Megatron's checkpoints do so) unless a row names the *early-stop re-run*
(PyTorch's non-reentrant checkpoint); ``scale.PRICES`` names both. The per-operator rows are read
from autograd (``opsaves``); the published rows quote Chen et al. 2016 and Korthikanti et al. 2022.
"""

from gpumem import units
from gpumem.course.ledger import Claim
from gpumem.memory import activations, models, recompute_cost

from . import opsaves
from .scale import PRICES

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


def _sig_round(v: float, digits: int) -> float:
    """``v`` rounded to ``digits`` significant figures."""
    from math import floor, log10
    return round(v, -int(floor(log10(abs(v)))) + digits - 1)


class Rounded(Claim):
    """A claim the note states as a round figure ("about 2 GB"): besides the usual verdict it is
    *close* when our figure, rounded to the note's ``digits`` significant figures, is the note's."""

    def __init__(self, *args, digits: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.digits = digits

    def verdict(self) -> str:
        plain = super().verdict()
        if plain == "wrong" and _sig_round(self.ours(), self.digits) == _sig_round(self.note, self.digits):
            return "close"
        return plain


class AtLeast(Claim):
    """A claim the note states as a floor ("50 %+"): it agrees when ours is at least the note's."""

    def verdict(self) -> str:
        return "agrees" if self.ours() >= self.note else super().verdict()

    def row(self) -> tuple[str, str, str, str, str]:
        i, what, note, ours, verdict = super().row()
        return i, what, ">= " + note, ours, verdict


class Named(Claim):
    """A claim about *which* tensors an operator keeps: the note's list against the list autograd
    keeps (``opsaves.saved_by``); it agrees only when the two lists are the same."""

    def verdict(self) -> str:
        return "agrees" if set(self.note.split(", ")) == set(self.ours().split(", ")) else "wrong"

    def row(self) -> tuple[str, str, str, str, str]:
        return self.id, self.what, self.note, self.ours(), self.verdict()


# Chen et al. 2016 (arXiv:1604.06174, abstract): a 1,000-layer ResNet on ImageNet, 48 GB -> 7 GB
# of memory for about 30 % more running time; O(sqrt(n)) memory for one extra forward, and a
# recursive variant with O(log n) memory for O(n log n) extra forward computation.
CHEN_GB = (48, 7)
CHEN_TIME_PCT = 30
# Korthikanti et al. 2022 (arXiv:2205.05198, abstract): a 530B GPT-3-style model on 2,240 A100s,
# 54.2 % MFU with selective recomputation + sequence parallelism, 42.1 % with full recomputation.
KORTH_MFU = (54.2, 42.1)


def chen_saving() -> float:
    """Chen et al.'s measured memory saving, in percent."""
    return 100 * (1 - CHEN_GB[1] / CHEN_GB[0])


def korth_slowdown() -> float:
    """How much longer Korthikanti et al.'s step takes with full recomputation than with selective
    recomputation + sequence parallelism, in percent: the same model FLOPs at 42.1 % vs 54.2 % MFU."""
    return 100 * (KORTH_MFU[0] / KORTH_MFU[1] - 1)


def _layers_drop(plan: str) -> float:
    """How much of the 8B layers' activations (the peak without the loss) ``plan`` removes, in %."""
    return 100 * (1 - _acts("llama-3-8b", plan, "layer_peak") / _acts("llama-3-8b", "none", "layer_peak"))


def _mb(v: float) -> str:
    return units.fmt(v, "MB", 1)


def _x_bytes(model: str = "llama-3-8b", seq: int = SEQ) -> int:
    """One bf16 s x h tensor at micro-batch 1 (X, or Q, which has h columns too)."""
    return 2 * seq * models.get(model).d_model


WHOLE, EARLY = PRICES["scratch"], PRICES["torch"]

CLAIMS = [
    Claim("4", "scores kept for backward (8B: 32 layers, s 4096, batch 16)", 32 * GB,
          scores_bytes,
          lambda: "64 MB (64 MiB) is one head's fp32 s x s matrix, and every query head has its own "
                  "(GQA shares only K and V). The note's 32 layers are Llama-3-8B's, the model of its "
                  f"next box: 32 heads x 32 layers x 16 sequences, {_gb(scores_bytes(), 1)}. Read at the "
                  f"scenario's 70B instead (64 heads, 80 layers) it would be {_gb(scores_bytes('llama-3-70b'), 1)}. "
                  "Chapter 04 reads the claim the same way (8B) and shows what flash attention keeps "
                  "instead: none of it; its backward recomputes S block by block from q, k and a "
                  "logsumexp per row."),
    Named("op-mm", "Q = X W_q keeps for its backward", "X, W_q, Q",
          lambda: ", ".join(opsaves.saved_by("matmul")),
          lambda: "Autograd keeps a matmul's inputs: X for dW_q = X^T dQ and W_q for dX = dQ W_q^T, not "
                  "its output Q. W_q is the parameter itself, kept anyway: no activation bytes. So the "
                  f"projection's own activation is X, {_mb(_x_bytes())} at 8B and s 4096, not the note's "
                  f"X + Q ({_mb(2 * _x_bytes())}); Q is kept by the operator that reads it next (RoPE, "
                  "attention). The same holds for S = Q K^T: it keeps Q and K, not S."),
    Named("op-sm", "softmax keeps for its backward", "S",
          lambda: ", ".join(opsaves.saved_by("softmax")),
          lambda: "Softmax keeps its output P, not its input S: its gradient is dS = P * (dP - "
                  "rowsum(dP * P)), which needs P alone. In bytes the two are the same s x s per head, "
                  "so the note's size is right and its tensor is not; chapter 04 builds on this."),
    Claim("op-sc", "scale applied to the scores (head dim 128)", 1 / 128,
          lambda: opsaves.sdpa_scale(models.get("llama-3-8b").head_dim),
          lambda: "The note writes softmax(S/d). Attention divides by sqrt(d), the square root of the "
                  f"head dimension: 1/sqrt(128) = {1 / 128 ** 0.5:.4f}, which is what PyTorch's "
                  "scaled_dot_product_attention applies (measured above), not 1/128 = "
                  f"{1 / 128:.4f}. With 1/d the softmax would be far flatter.", unit=""),
    Claim("5a", f"full recompute, {WHOLE}: +FLOPs (8B, 4k)", 30, lambda: extra("llama-3-8b", "full"),
          lambda: f"One extra forward of the 32 layers: {extra('llama-3-8b', 'full'):.1f} % of forward + "
                  "backward, not 33 %, because the output head is not re-run and the flash kernel's backward "
                  "costs 2.5x its forward. Causal attention is counted in full, as FlopCounterMode counts it "
                  "(4*s^2*h a layer); causal flash kernels on a GPU skip the masked half, in the re-run and "
                  f"the step alike, and the share barely moves. The {EARLY} (PyTorch's non-reentrant "
                  f"checkpoint) costs {extra('llama-3-8b', 'full', 'torch'):.1f} %: it stops each re-run at "
                  "the last tensor backward needs, so every segment's final W_down matmul is skipped.",
          unit="%"),
    AtLeast("5a-mem", "memory saved for ~+30 % time (Chen et al., measured)", 50, chen_saving,
            lambda: f"Chen et al. (arXiv:1604.06174, abstract) cut a 1,000-layer ResNet from {CHEN_GB[0]} GB "
                    f"to {CHEN_GB[1]} GB ({chen_saving():.0f} % less) for about {CHEN_TIME_PCT} % more "
                    "running time. The note's '50 %+' is a floor, and a low one: Llama-3-8B's layers drop "
                    f"{_layers_drop('full'):.0f} % (8b below).", unit="%"),
    Claim("5a-time", "time that costs (Chen et al., measured)", 30, lambda: CHEN_TIME_PCT,
          lambda: "Chen et al.'s measured +30 % running time matches the note's upper figure. Their method "
                  "keeps O(sqrt(n)) checkpoints for one extra forward; applied recursively it goes down to "
                  "O(log n) memory, but then costs O(n log n) extra forward computation: recomputation is "
                  "one extra forward only while each layer is re-run once.", unit="%"),
    Claim("5a-530B", "full recompute's step time (Korthikanti, 530B)", 30, korth_slowdown,
          lambda: "Korthikanti et al. (arXiv:2205.05198, abstract) trained a 530B GPT-3-style model on "
                  f"2,240 A100s at {KORTH_MFU[0]} % MFU with selective recomputation and sequence "
                  f"parallelism, against {KORTH_MFU[1]} % with full recomputation: the same step takes "
                  f"{korth_slowdown():.1f} % longer with full recomputation. Selective recomputation "
                  "re-runs only attention's core (section 5), and sequence parallelism divides the "
                  "activations by the tensor-parallel size, so little recomputation is needed at all.",
          unit="%"),
    Claim("5b", "8B, s 4096, batch 1, no checkpointing: activations", 64 * GB, lambda: _acts("llama-3-8b", "none"),
          lambda: f"41*s*b*h bytes a layer with flash attention: {_gb(_acts('llama-3-8b', 'none', 'layer_peak'))} "
                  f"for 32 layers, plus the loss's logits, {_gb(_acts('llama-3-8b', 'none'))} in all (traced). "
                  "No s^2 term: flash attention keeps no scores. The figure is kernel-dependent: with a "
                  "naive kernel it is the note's (5b-naive)."),
    Claim("5b-naive", "the same, naive attention: activations", 64 * GB,
          naive_acts,
          lambda: f"A kernel that materialises the scores keeps each layer's bf16 probabilities, 2*a*s^2 bytes, "
                  f"and a bool causal mask: {_gb(naive_acts())} in all, logits included. The note's 64 GB "
                  "is right for that kernel, not for the flash attention Llama-3 trains with."),
    Rounded("5c", "every layer checkpointed: the layers' activations (8B)", 2 * GB,
            lambda: _acts("llama-3-8b", "full", "layer_peak"),
            lambda: _why_layers("full") + f" The note's 2 GB is {_off('5c')} above the layers' figure, "
                    "which rounds to 2 GB at the note's one significant figure: close, for the layers. "
                    "The step's peak is a different matter: the logits dominate it."),
    Claim("5d", "checkpoint every 2 layers: the layers' activations (8B)", 4 * GB,
          lambda: _acts("llama-3-8b", "every-2", "layer_peak"),
          lambda: "Half as many checkpoints, but two layers re-run at once: "
                  f"{_gb(_acts('llama-3-8b', 'every-2', 'layer_peak'))}, about what every layer costs "
                  f"({_gb(_acts('llama-3-8b', 'full', 'layer_peak'))}), not twice it."),
    Claim("5d'", f"every 2 layers, {WHOLE}: +FLOPs (8B)", 15, lambda: extra("llama-3-8b", "every-2"),
          lambda: "Spacing moves memory, not FLOPs: every layer in a segment still runs its forward twice, "
                  f"{extra('llama-3-8b', 'every-2'):.1f} % as with every layer. Checkpointing every other "
                  f"layer (the rest not at all) costs {extra('llama-3-8b', 'every-other'):.1f} %: that is "
                  f"the note's +15 %. (The {EARLY} costs {extra('llama-3-8b', 'every-2', 'torch'):.1f} % "
                  "here: one W_down skipped per two layers.)", unit="%"),
    Claim("8b", "summary: full checkpointing saves (8B activation peak)", 70,
          lambda: saving("llama-3-8b", "full"),
          lambda: f"{_gb(_acts('llama-3-8b', 'none'))} -> {_gb(_acts('llama-3-8b', 'full'))}; without the "
                  f"loss's logits the layers drop {_layers_drop('full'):.0f} %.",
          unit="%"),
    Claim("8b'", "summary: interval checkpointing saves (8B peak)", 50,
          lambda: saving("llama-3-8b", "every-other"),
          lambda: "Judged on the step's peak, which is what has to fit: every other layer checkpointed "
                  f"saves {saving('llama-3-8b', 'every-other'):.0f} %, because the logits "
                  f"({_gb(_acts('llama-3-8b', 'none', 'loss'))}) do not shrink. The note's 50 % holds for "
                  f"the layers' part alone, which drops {_layers_drop('every-other'):.0f} %.",
          unit="%"),
    Claim("8b''", f"interval checkpointing, {WHOLE}: +FLOPs (8B)", 15, lambda: extra("llama-3-8b", "every-other"),
          lambda: "Half the layers run their forward twice: half of full recomputation's "
                  f"{extra('llama-3-8b', 'full'):.1f} % ({WHOLE}); the {EARLY} costs "
                  f"{extra('llama-3-8b', 'every-other', 'torch'):.1f} %.", unit="%"),
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
