"""Pinned host buffers DeepSpeed's NVMe swappers allocate per rank, beside the model states.

The figures are DeepSpeed 0.19.8's config defaults (``offload_param.buffer_count``,
``offload_param.buffer_size``, ``offload_optimizer.buffer_count``, ``zero_optimization.sub_group_size``);
the planner's configs emit them (:mod:`.config`) and its host budget counts them (:mod:`.search`).
"""

from ..memory import accounting
from ..memory.models import ModelConfig
from .memory import Layout, local_params


PARAM_BUFFERS = 5                 # offload_param.buffer_count (DeepSpeed's default)
PARAM_BUFFER_MIN = 100_000_000    # offload_param.buffer_size default (elements)
OPT_BUFFERS = 4                   # offload_optimizer.buffer_count (DeepSpeed's default)
SUB_GROUP = 1_000_000_000         # zero_optimization.sub_group_size (DeepSpeed's default)


def offload_buffers(cfg: ModelConfig, lay: Layout) -> dict:
    """Pinned host buffers DeepSpeed's NVMe swappers allocate per rank (bytes), beside the
    model states ``states_part`` places. Parameters on NVMe: ``buffer_count`` buffers of
    ``buffer_size`` 16-bit elements, and ``buffer_size`` must hold the largest parameter's
    partition (``param_buffer_size``, what the planner's configs emit); optimizer on NVMe:
    ``buffer_count`` fp32 buffers of the largest sub-group (<= ``sub_group_size``)."""
    out = {"param_swap": 0, "optimizer_swap": 0, "param_buffer_size": 0}
    if lay.device != "nvme":
        return out
    lp = local_params(cfg, lay.tp, lay.pp)
    if lay.offload == "optimizer+params":
        size = param_buffer_size(lp["largest"], lay.shards)
        out["param_buffer_size"] = size
        out["param_swap"] = PARAM_BUFFERS * size * accounting.RECIPE[lay.recipe].params
    out["optimizer_swap"] = OPT_BUFFERS * min(SUB_GROUP, accounting.shard(lp["params"], lay.shards)) * 4
    return out


def param_buffer_size(largest: int, dp: int) -> int:
    """``offload_param.buffer_size``: DeepSpeed's 1e8 elements, raised to the largest parameter's
    partition (ceil(largest / dp)) rounded up to a whole million."""
    need = accounting.shard(largest, dp)
    return max(PARAM_BUFFER_MIN, -(-need // 1_000_000) * 1_000_000)
