"""What a mixture-of-experts layer saves for backward, by formula (bytes), for ``activations``.

The layer follows transformers' own code (``MixtralSparseMoeBlock``, ``Qwen3MoeSparseMoeBlock``,
version pinned in env/requirements.txt) with its default experts implementation ``grouped_mm``
(``integrations/moe.py``: ``grouped_mm_experts_forward``); ``gpumem.memory.hf_trace`` builds the
model with it, and ``tests/test_hf_moe.py`` checks every term below against a trace on real
tensors. T = s*b tokens, h = d_model, F = one expert's width, E = experts, k = experts per
token, e = bytes per element of the compute dtype, S = the dispatched rows (token, expert pairs).

* router: its input (the MLP input, counted by ``activations``), the fp32 softmax output (4TE),
  top-k's int64 indices (8Tk), and where the top-k weights are renormalised (Mixtral always,
  Qwen3-MoE with ``norm_topk_prob``, true in every published Qwen3-MoE config) the fp32 sum and
  quotient of the in-place division (4T + 4Tk). The router logits themselves are not saved
  (the softmax keeps its output), and with ``output_router_logits`` false (both configs'
  default) no auxiliary loss holds them;
* dispatch: the token rows gathered in expert order (eSh), two int64 index tensors (the sort
  order and the source token of each row: 16S) and the int32 offsets (4E);
* each expert's SwiGLU on its rows: the gate|up output (2eSF; silu and the multiply save views
  of it), silu(gate) (eSF) and the product, the down projection's input (eSF): 4eSF;
* combine: the down projection's output and the routing weights it is multiplied by (eSh +
  wS, w = 4 for Mixtral, whose weights stay fp32, e for Qwen3-MoE, which casts them to the
  compute dtype), and the inverse permutation (8S); the per-token sum saves nothing;
* a shared expert (always on, width F_s; Qwen2-MoE, DeepSeek): a dense SwiGLU on all T tokens,
  4eTF_s. No supported ``model_type`` has one, so this term is not traced.

Routing. S is what the experts process. transformers neither drops nor pads: every token's k
choices are computed, so S = T*k whatever the router decides (capacity factor 1.0, assumed by
default), and each term above depends on the routing only through S. The stated routing is
balanced, every expert getting T*k/E rows; that share is what one GPU holds per local expert
under expert parallelism. A dispatcher with a capacity factor c (GShard, DeepSpeed-MoE,
Megatron's drop-and-pad) sizes every expert's buffer at ceil(c*T*k/E) rows: the dispatch,
expert and combine terms scale with c (c > 1 pads, c < 1 drops the tokens over capacity).
"""

import math
from dataclasses import dataclass

from ..errors import UsageError
from .models import ModelConfig

WEIGHT_BYTES = {"mixtral": 4}   # routing weights kept fp32; others: the compute dtype


@dataclass(frozen=True)
class Routing:
    """How tokens reach the experts: counted (``tokens_per_expert``, e.g. read off a real
    router) or balanced at ``capacity_factor``; ``norm_topk``: top-k weights renormalised."""
    tokens_per_expert: tuple[int, ...] | None = None
    capacity_factor: float = 1.0
    norm_topk: bool = True


BALANCED = Routing()


def dispatched_rows(cfg: ModelConfig, tokens: int, routing: Routing = BALANCED) -> int:
    """S: the (token, expert) rows the experts process."""
    if routing.tokens_per_expert is not None:
        counts = routing.tokens_per_expert
        if len(counts) != cfg.n_experts or sum(counts) != tokens * cfg.top_k:
            raise UsageError(f"tokens per expert {counts}: expected {cfg.n_experts} counts summing to "
                             f"tokens x top_k = {tokens * cfg.top_k}")
        return sum(counts)
    if routing.capacity_factor == 1.0:
        return tokens * cfg.top_k
    if routing.capacity_factor <= 0:
        raise UsageError(f"capacity factor must be positive, got {routing.capacity_factor}")
    return cfg.n_experts * math.ceil(routing.capacity_factor * tokens * cfg.top_k / cfg.n_experts)


def local_rows(cfg: ModelConfig, tokens: int, ep: int = 1, routing: Routing = BALANCED) -> int:
    """Rows one GPU's experts process when ``ep`` GPUs of ``tokens`` tokens each split the experts
    (expert parallelism), balanced routing at ``routing``'s capacity factor: each of its
    n_experts / ep experts takes ceil(c T k / n_experts) rows from each of the ep GPUs (a sender
    sizes each expert's slot by its own tokens, as DeepSpeed's top-k gating does), so
    ep x (n_experts / ep) x ceil(c T k / n_experts): :func:`dispatched_rows` of one GPU's tokens,
    whatever ep. What the experts save (:func:`moe_terms`) is therefore the same per GPU with ep."""
    if routing.tokens_per_expert is not None or cfg.n_experts % ep:
        raise UsageError(f"local rows: balanced routing over ep={ep} dividing {cfg.n_experts} experts only")
    return dispatched_rows(cfg, tokens, routing)


def moe_terms(cfg: ModelConfig, tokens: int, e: int,
              routing: Routing | None = None) -> dict[str, tuple[int, str]]:
    """One MoE layer's saved bytes after the MLP input, by tensor group, with formulas."""
    routing = routing or BALANCED
    T, h, F, E, k = tokens, cfg.d_model, cfg.ffn, cfg.n_experts, cfg.top_k
    S = dispatched_rows(cfg, T, routing)
    w = WEIGHT_BYTES.get(cfg.model_type, e)
    terms = {"router softmax (fp32)": (4 * T * E, "4sbE"),
             "router top-k indices (int64)": (8 * T * k, "8sbk")}
    if routing.norm_topk:
        terms["top-k sum and weights (fp32)"] = (4 * T * (k + 1), "4sb(k+1)")
    terms |= {"rows gathered, sort and token index": (e * S * h + 16 * S, f"{e}Sh + 16S"),
              "tokens per expert, offsets (int32)": (4 * E, "4E"),
              "experts: gate|up, silu, product": (4 * e * S * F, f"{4 * e}SF"),
              "combine: down output, weights, inverse": (e * S * h + (w + 8) * S, f"{e}Sh + {w + 8}S")}
    if cfg.shared_expert_ffn:
        terms["shared expert (not traced)"] = (4 * e * T * cfg.shared_expert_ffn, f"{4 * e}sbF_s")
    return terms
