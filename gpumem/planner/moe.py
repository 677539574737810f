"""Mixtures of experts in the planner: expert parallelism (``ep``) as a lever, its bytes per GPU,
its FLOPs and the switches that set it up (torch-free). Its all-to-all: ``timing.moe_time``.

What ep is. The ``ep`` ranks of an expert-parallel group split every MoE layer's experts: each
holds ``n_experts / ep`` of them whole, and the tokens its router sends elsewhere travel by
all-to-all. The attention, norms, routers and embeddings stay data-parallel as before. The ep
ranks are taken from the data-parallel group: consecutive ranks form an ep group, and ranks
ep apart hold the same experts (the expert-data-parallel group, dp / ep ranks) -- DeepSpeed 0.19.8
``utils/groups.py`` ``_create_expert_and_data_parallel`` (expert data-parallel ranks
``range(i, world, ep)``), Megatron-Core's default order ``tp-cp-ep-dp-pp``. Its names:
DeepSpeed-MoE ``deepspeed.moe.layer.MoE(ep_size=...)`` (Rajbhandari et al. 2022, DeepSpeed-MoE,
arXiv 2201.05596) and DeepSpeed 0.19.8's AutoEP (``"expert_parallel": {"enabled": true,
"autoep_size": ep, "preset_model": ...}``, ``module_inject/auto_ep_config.py``), Megatron-Core
``--expert-model-parallel-size``, torchtitan (FSDP2) ``expert_parallel_degree``.

Memory (:func:`model_states`). X = L x n_experts x one expert's parameters; a rank holds the rest,
N - X, and X / ep of the experts. ZeRO shards the rest over the dp ranks, as for a dense model,
and the experts over the expert-data-parallel group (DeepSpeed ``runtime/zero/stage_1_and_2.py``
``_configure_moe_settings``: an MoE parameter group's ``partition_count`` is the size of
``expert_dp_process_group``); each part is ``hybrid.model_states``, the dense formula, applied
twice. So what ZeRO shards (optimizer states from stage 1, gradients from stage 2) ends at
X / dp per rank whatever ep is; ep removes the replicated copies: the 16-bit expert weights (and
ZeRO-0/1's gradients) shrink from X to X / ep per GPU, with no gather as ZeRO-3 would need.

Activations: ep does not change them. With balanced routing each of a rank's n_experts / ep
experts receives T k / n_experts rows from each of the ep ranks: T k rows in all, what one GPU
processes without ep (``moe_acts``: the received rows are what the experts save; the all-to-all
saves nothing). At a capacity factor c (GShard, Lepikhin et al. 2020, arXiv 2006.16668; Switch
Transformer, Fedus et al. 2021, arXiv 2101.03961: expert capacity = c x tokens x k / experts)
the rows are ``moe_acts.dispatched_rows`` at c. The planner states c = 1.0:
DeepSpeed-MoE's default (``deepspeed/moe/layer.py``: ``capacity_factor=1.0``), and what a dropless
dispatcher (Megatron-Core's default, ``--moe-expert-capacity-factor`` unset, its MoE README;
DeepSpeed 0.19.8's AutoEP, whose ``drop_mask`` is all false)
processes under balanced routing. Assumption: balanced routing. A real router is not balanced:
the busiest rank then processes more rows (dropless) or drops them (c = 1), and the all-to-all
and the experts wait for it; not modelled (optimistic).

FLOPs (:func:`flops_model`): the experts a token visits, 6 x active parameters x tokens, through
the dense formula (``recompute_cost.step_flops``) on a stand-in whose MLP width is top_k x F (+
the shared expert). Not counted: the router's d x n_experts matmul (0.02 % of Mixtral-8x7B's
active FLOPs, 0.7 % of Qwen3-30B-A3B's), and queries wider than d_model (Qwen3-30B-A3B's 4,096
over 2,048) are priced at d_model as the dense formula prices every model.

Searched (:func:`degrees`): ep > 1 dividing n_experts and dp, with tp = pp = cp = 1, ZeRO 0-2
(DeepSpeed's native MoE refuses ZeRO-3, ``runtime/engine.py`` ``_validate_zero3_moe_compatibility``),
optimizer offload allowed, no parameter offload, no hybrid sharding. Not searched: ep with tp,
pp or cp (Megatron-Core's expert tensor parallelism and 5-D mesh), AutoEP under ZeRO-3, FSDP2
with ep (torchtitan), overlapped all-to-all (``--overlap-moe-expert-parallel-comm``).
"""

from dataclasses import replace
from functools import lru_cache

from ..memory import accounting
from ..memory.models import ModelConfig
from ..memory.moe_acts import BALANCED, dispatched_rows
from . import hybrid
from .layout import Layout

# The routing the activations are counted at (memory.moe_acts.BALANCED: capacity factor 1.0, DeepSpeed-MoE's
# default, deepspeed/moe/layer.py; a dropless dispatcher under balanced routing moves the same rows)
ROUTING = BALANCED
CAPACITY_FACTOR = ROUTING.capacity_factor


def expert_params(cfg: ModelConfig, layers: int | None = None) -> int:
    """X: the routed experts' parameters of ``layers`` MoE layers (all of them by default)."""
    return (cfg.n_layers if layers is None else layers) * cfg.n_experts * cfg.expert_params() if cfg.moe else 0


def a2a_rows(cfg: ModelConfig, tokens: int) -> int:
    """Rows one rank dispatches (and its experts receive back) per MoE layer: ``dispatched_rows``
    of its ``tokens`` at :data:`ROUTING`, the rows the activations count."""
    return dispatched_rows(cfg, tokens, ROUTING)


def degrees(cfg: ModelConfig, tp: int, pp: int, cp: int, dp: int, zero: int, offload: str, hybrid_: str,
            asked: tuple | None = None) -> list[int]:
    """The ep degrees searched for one layout (1 always; see the module for the rest)."""
    out = [1]
    if not cfg.moe or tp * pp * cp > 1 or zero > 2 or offload == "optimizer+params" or hybrid_ != "none":
        return out if asked is None or 1 in asked else []
    out += [e for e in range(2, dp + 1) if dp % e == 0 and cfg.n_experts % e == 0]
    return [e for e in out if asked is None or e in asked]


def refusal(cfg: ModelConfig, lay: Layout) -> str:
    """Why ``lay.ep`` cannot be planned for ``cfg`` (empty when it can), one clause."""
    if lay.ep == 1:
        return ""
    if not cfg.moe:
        return f"ep={lay.ep}: {cfg.name} is dense (no experts); accepted: ep=1"
    if cfg.n_experts % lay.ep or lay.dp % lay.ep:
        return (f"ep={lay.ep} must divide the {cfg.n_experts} experts and dp={lay.dp}; accepted: "
                + ", ".join(map(str, degrees(cfg, 1, 1, 1, lay.dp, 0, "none", "none"))))
    if lay.tp * lay.pp * lay.cp > 1 or lay.hybrid != "none":
        return f"ep={lay.ep} is planned with tp=1, pp=1, cp=1 and no hybrid sharding only"
    if lay.zero > 2 or lay.offload == "optimizer+params":
        return (f"ep={lay.ep} at zero={lay.zero}, offload={lay.offload}: DeepSpeed's MoE runs ZeRO 0-2 "
                "(no ZeRO-3, no parameter offload); accepted: zero=0|1|2")
    return ""


def model_states(cfg: ModelConfig, n_local: int, lay: Layout) -> accounting.States:
    """Per-GPU model states of ``n_local`` parameters (the whole model at tp = pp = 1) with
    ``lay.ep`` > 1: the rest over dp, the rank's experts over the dp / ep expert-data-parallel
    ranks (see the module); host and drive bytes likewise."""
    x = expert_params(cfg)
    rest = hybrid.model_states(n_local - x, lay)
    mine = hybrid.model_states(x // lay.ep, replace(lay, dp=lay.dp // lay.ep, ep=1))
    return accounting.States(rest.params + mine.params, rest.grads + mine.grads, rest.optimizer + mine.optimizer,
                             rest.host + mine.host, rest.nvme + mine.nvme)


def split_params(cfg: ModelConfig, psi: int, lay: Layout) -> list[tuple[int, int]]:
    """(local parameters, ranks they are data-parallel over) of one GPU: ``[(psi, dp x cp)]``, or
    with ep > 1 the rest over dp and the rank's experts over dp / ep (what gradients reduce over)."""
    if lay.ep == 1:
        return [(psi, lay.shards)]
    x = expert_params(cfg)
    return [(psi - x, lay.shards), (x // lay.ep, lay.expert_shards)]


@lru_cache(maxsize=64)
def flops_model(cfg: ModelConfig) -> ModelConfig:
    """The dense stand-in whose FLOPs are ``cfg``'s active FLOPs: the MLP is the top_k experts a
    token visits (and the shared expert), one SwiGLU of width top_k x F (+ F_s); ``cfg`` if dense."""
    if not cfg.moe:
        return cfg
    return replace(cfg, n_experts=0, top_k=0, shared_expert_ffn=0, ffn=cfg.top_k * cfg.ffn + cfg.shared_expert_ffn)


def deepspeed_keys(cfg: ModelConfig, lay: Layout) -> dict:
    """DeepSpeed 0.19.8's AutoEP section for ``lay.ep`` > 1 (``module_inject/auto_ep_config.py``;
    presets ``mixtral`` and ``qwen3_moe``: ``auto_ep_presets``), else nothing."""
    if lay.ep == 1:
        return {}
    return {"expert_parallel": {"enabled": True, "autoep_size": lay.ep, "preset_model": cfg.model_type}}


def fsdp_keys(lay: Layout) -> dict:
    """The FSDP2-side name of ``lay.ep`` (torchtitan), else nothing."""
    if lay.ep == 1:
        return {}
    return {"expert_parallel": f"torchtitan: parallelism.expert_parallel_degree = {lay.ep} (experts' "
                               f"all-to-all over {lay.ep} ranks; FSDP2 shards the rest)"}


def assumptions(cfg: ModelConfig) -> list[str]:
    """The planner's stated figures for a mixture of experts (none for a dense model)."""
    if not cfg.moe:
        return []
    return [f"mixture of experts ({cfg.n_experts} experts, top-{cfg.top_k}): balanced routing at capacity factor "
            f"{CAPACITY_FACTOR:g} (DeepSpeed-MoE's default; dropless dispatch processes the same rows); compute "
            "by active parameters (the router's matmul not counted); ep searched with tp = pp = cp = 1 and ZeRO "
            "0-2 only; the all-to-all (dispatch and combine, forward and backward) exposed, not overlapped"]
