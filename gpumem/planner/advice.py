"""When nothing fits: how far the closest layout misses, and the smallest change of each kind
that makes something fit (torch-free).

Changes tried, each alone, in the order a team would reach for them: allowing offload (when
the question excluded it), more GPUs of the same kind (whole nodes once past one node, up to
64 x), a GPU with more memory from the course's table (same count), and a shorter sequence
(halved, down to 128 tokens). The search stops at the first layout that fits
(the planner's ``fits_any``), so it is quick.

A global batch no layout can run (no data-parallel degree divides it): :func:`nearest_batches`
names the nearest batches below and above that some layout runs and fits. A capacity at or
below the reserve is refused (:func:`check_capacity`).
"""

from .. import units
from ..errors import UsageError
from ..memory import gpus as gpu_table
from ..memory.models import ModelConfig


def _more_gpus(gpus: int, per_node: int) -> list[int]:
    counts = [gpus * 2 ** k for k in range(1, 7)]
    if gpus < per_node:
        counts = sorted(set([c for c in range(gpus + 1, per_node + 1)] + counts))
    return counts


def advise(cfg: ModelConfig, gpus: int, g: gpu_table.GPU, capacity: int, seq: int, global_batch: int,
           reserve: gpu_table.Reserve, opts: dict, closest: dict, fits_any, all_offloads: tuple) -> dict:
    """What is missing and, per kind of change, the smallest one that fits. ``fits_any`` is the
    planner's first-fit search, ``all_offloads`` every offload choice (passed in: no import cycle)."""
    usable = gpu_table.usable(capacity, reserve)
    out = {"missing": closest.get("missing") if closest else None,
           "closest": closest.get("label") if closest else None, "usable": usable, "changes": []}

    def found(kind: str, value, lay) -> None:
        out["changes"].append({"change": kind, "value": value, "layout": lay.label()})

    if tuple(opts["offloads"]) != tuple(all_offloads):
        lay = fits_any(cfg, gpus, capacity, seq, global_batch, reserve, opts | {"offloads": tuple(all_offloads)})
        if lay:
            found("allow offload", f"{lay.offload} -> {lay.device}", lay)
    for n in _more_gpus(gpus, opts["gpus_per_node"]):
        lay = fits_any(cfg, n, capacity, seq, global_batch, reserve, opts)
        if lay:
            found("more GPUs", n, lay)
            break
    for other in sorted(gpu_table.REGISTRY.values(), key=lambda x: x.capacity):
        if other.capacity > capacity and other.bf16_flops:
            lay = fits_any(cfg, gpus, other.capacity, seq, global_batch, reserve, opts)
            if lay:
                found("a larger GPU", other.name, lay)
                break
    s = seq // 2
    while s >= 128:
        lay = fits_any(cfg, gpus, capacity, s, global_batch, reserve, opts)
        if lay:
            found("a shorter sequence", s, lay)
            break
        s //= 2
    return out


def least_capacity(reserve: gpu_table.Reserve) -> int | None:
    """The smallest capacity (bytes) that leaves a byte above ``reserve`` (None: none does)."""
    if reserve.fragmentation >= 1:
        return None
    c = int((reserve.context + reserve.nccl) / (1 - reserve.fragmentation))
    while gpu_table.usable(c, reserve) <= 0:
        c += 1
    return c


def check_capacity(capacity: int, reserve: gpu_table.Reserve) -> None:
    """Raise :class:`UsageError` when ``capacity`` leaves nothing above the reserve."""
    if gpu_table.usable(capacity, reserve) > 0:
        return
    least = least_capacity(reserve)
    accepted = f"more than {units.fmt(least - 1, 'GB', 3)}" if least else "none with this reserve"
    shown = f"{capacity:,} B" if capacity < 10**7 else units.fmt(capacity, "GB", 3)
    raise UsageError(f"GPU memory {shown} is not above the reserve of "
                     f"{units.fmt(reserve.of(capacity), 'GB', 3)} ({reserve.describe()}); accepted: {accepted}")


def nearest_batches(cfg: ModelConfig, gpus: int, capacity: int, seq: int, global_batch: int,
                    reserve: gpu_table.Reserve, opts: dict, fits_any, parallel_degrees, tries: int = 8) -> dict | None:
    """None when some layout's data-parallel degree divides ``global_batch``; else the advice: the
    degrees there are and the nearest global batches, below and above, that a layout runs and fits."""
    dps = sorted({dp for tp, pp, dp in parallel_degrees(cfg, gpus, opts["gpus_per_node"])
                  if not (opts.get("tp") and tp not in opts["tp"] or opts.get("pp") and pp not in opts["pp"])})
    if not dps or any(global_batch % dp == 0 for dp in dps):
        return None
    near = sorted({m for dp in dps for m in (global_batch // dp * dp, -(-global_batch // dp) * dp) if m > 0},
                  key=lambda m: (abs(m - global_batch), m))
    found: dict = {}
    for m in near[:tries]:
        side = m < global_batch
        if side not in found and fits_any(cfg, gpus, capacity, seq, m, reserve, opts):
            found[side] = m
    return {"global_batch": global_batch, "data_parallel": dps, "nearest": sorted(found.values()),
            "missing": None, "closest": None, "usable": gpu_table.usable(capacity, reserve), "changes": []}
