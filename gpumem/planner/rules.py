"""Which layouts some framework runs: the rules the search keeps and ``plan --layout`` enforces.

DeepSpeed 0.19.8 (``allowed``): ZeRO-2 and 3 are refused with pipeline parallelism
(``runtime/pipe/engine.py``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism");
AutoTP is not combined with pipeline stages (its mesh is 2-D, data x tensor:
``utils/groups.py`` ``_init_tp_mesh_device``), so tensor x pipeline layouts are
Megatron-DeepSpeed's, planned without offload; pure bf16 (``bf16_optimizer_states``) needs
ZeRO 1-3; offload follows ``accounting.check_offload``.

Megatron-Core (``megatron_core``: layouts with context parallelism or virtual stages, which only
it runs): ZeRO 0 or 1 (its distributed optimizer) and no offload; ring attention needs a flash
kernel and a sequence divisible by 2 cp (the load-balanced causal split,
``megatron/core/utils.py`` ``get_batch_on_this_cp_rank``); the interleaved schedule needs
pp > 1, micro-batches a multiple of pp and the layers a multiple of pp x vp
(``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_pipelining_with_interleaving``; ``transformer_block.get_num_layers_to_build``).

Hybrid sharding (``hybrid``): ZeRO-3 without pipeline or context parallelism, its shard group a
proper divisor of the data-parallel ranks, and what :func:`gpumem.planner.hybrid.allowed_hybrid`
says DeepSpeed's MiCS / ZeRO++ and FSDP2 accept.
"""

from ..errors import UsageError
from ..memory import accounting
from ..memory.models import ModelConfig
from .hybrid import allowed_hybrid


def allowed(recipe: str, zero: int, pp: int, offload: str, device: str, tp: int = 1) -> bool:
    """Whether DeepSpeed accepts the combination (see the module)."""
    if pp > 1 and zero >= 2:
        return False
    if pp > 1 and tp > 1 and offload != "none":
        return False   # Megatron-DeepSpeed 3-D layouts are planned without offload
    if recipe == "pure-bf16" and zero == 0:
        return False
    try:
        accounting.check_offload(zero, offload, device)
    except UsageError:
        return False
    return True


def megatron_core(cfg: ModelConfig, seq: int, zero: int, offload: str, attention: str, pp: int, cp: int,
                  vp: int, n_micro: int) -> str | None:
    """Why Megatron-Core refuses a layout with ``cp`` or ``vp`` above 1, or None (see the module)."""
    if zero > 1 or offload != "none":
        return "Megatron-Core layouts shard at most the optimizer (zero 0 or 1) and do not offload"
    if cp > 1 and (attention != "flash" or seq % (2 * cp)):
        return f"ring attention needs a flash kernel and a sequence divisible by 2 x cp = {2 * cp}"
    if vp > 1:                             # name only the conditions that fail (review r19 of lab 06)
        failed = [need for ok, need in ((pp > 1, "pp > 1"),
                                        (pp <= 1 or n_micro % pp == 0, f"micro-batches ({n_micro}) a multiple of pp ({pp})"),
                                        (cfg.n_layers % (pp * vp) == 0,
                                         f"the {cfg.n_layers} layers a multiple of pp x vp = {pp * vp}")) if not ok]
        if failed:
            return "the interleaved schedule needs " + " and ".join(failed)
    return None


def hybrid(lay) -> str | None:
    """Why hybrid sharding refuses ``lay`` (a ``Layout`` with ``hybrid`` set), or None."""
    if lay.zero != 3 or lay.pp > 1 or lay.cp > 1:
        return "hybrid sharding is ZeRO-3 without pipeline or context parallelism"
    if not 1 < lay.group < lay.dp or lay.dp % lay.group:
        return f"the shard group ({lay.group}) must divide dp ({lay.dp}) and be between 2 and dp - 1"
    return allowed_hybrid(lay)
