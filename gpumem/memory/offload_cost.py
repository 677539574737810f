"""What offloading moves: bytes per step on each link, counted from the chapter 01 accounting.

Offloading trades memory for traffic: every step a rank's model states cross PCIe, an NVMe drive
and the CPU's memory. This module counts those bytes from :mod:`gpumem.memory.accounting`;
:mod:`gpumem.timing.offload_time` divides them by the links' bandwidths and schedules them.

Per rank and per step, with s = ceil(Psi / N) parameters in the rank's shard, p16 the bytes of one
parameter on the GPU (2 for the bf16 recipes, 4 for fp32), g32 the bytes of the gradient the CPU
optimizer reads (4 with an fp32 master, :func:`~gpumem.memory.accounting.optimizer_grad_bytes`)
and one micro-batch per step (:func:`traffic_parts` and :func:`offload_traffic` take more):

======================  ===================  ==================  ========================  ===============
stage + offload         d2h (down)           h2d (up)            NVMe read                 NVMe write
======================  ===================  ==================  ========================  ===============
none                    0                    0                   0                         0
ZeRO-1/2 optimizer cpu  g32 * s              p16 * s             0                         0
ZeRO-3 optimizer cpu    (p16 + g32) * s      2 * p16 * s         0                         0
ZeRO-3 optimizer nvme   (p16 + g32) * s      2 * p16 * s         nvme states               nvme states
ZeRO-3 opt+params cpu   (p16 + g32) * s      3 * p16 * s         0                         0
ZeRO-3 opt+params nvme  (p16 + g32) * s      3 * p16 * s         nvme states + p16 * s     nvme states
======================  ===================  ==================  ========================  ===============

The gradient trip as DeepSpeed 0.19.8 runs it (:func:`gradient_trip`). At ZeRO-1/2 the engine
widens each reduced slice to fp32 *on the GPU* and copies the fp32 tensor down
(``stage_1_and_2.py``: ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` and
``copy_grads_in_partition`` call ``.to(fp32)`` before ``copy_(non_blocking=True)``): g32 down.
At ZeRO-3 (``stage3.py``, ``partition_grads``, lines 2006-2049) the 16-bit partition is copied
into the host-resident ``grad_partitions_flat_buffer`` (line 2025, p16 down; on the CPU whenever
the optimizer is offloaded, lines 333 and 791), brought back (line 2028,
``grad_buffer.to(grad_partition.device)``, p16 up), and at the accumulation boundary
``_offload_grad_partition_at_boundary`` (lines 1443-1457) widens that GPU copy to fp32 and copies
it down (``fp32_grad_tensor.copy_(grad_buffer.to(dtype=fp32))``, g32 down; on NVMe, line 1453
does the same before ``swap_out_gradients``): 6 B down and 2 B up in the mixed recipe. Each later
micro-batch adds a p16 round trip (lines 2031-2039: up, add, back down). All of it runs on one
CUDA stream, ``reduce_and_partition_stream`` (line 1669), so the copies follow one another
(``grad_trip`` in :func:`gpumem.timing.offload_time.step_time`). ZeRO-1/2 with m > 1 micro-batches
(stage_1_and_2.py ``async_accumulate_grad_in_cpu_via_gpu``): p16 down every micro-batch, up before
each later one. The ZeRO-Offload paper (arXiv:2101.06840) sends fp16 gradients once at every
stage: ``grads="paper"``.

"nvme states" is what :func:`~gpumem.memory.accounting.model_states` puts on the drive (opt+params:
master, m, v 12 B + fp32 gradient 4 B + bf16 parameters 2 B = 18 s). Backward writes the fp32
gradient (``swap_out_gradients``), the step reads it with the states and writes the states and the
updated 16-bit shard back; the shard is read for forward and again for backward (DeepSpeed
releases gathered parameters after use): read 12 + 4 + 2 x 2 = 20 s, write 4 + 12 + 2 = 18 s.
"""

from ..errors import UsageError, one_of, positive_int
from . import accounting
from .accounting import DEVICES, OFFLOADS, RECIPES

GRAD_TRIPS = ("deepspeed", "paper")


def _check(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str):
    n_params = positive_int(n_params, "parameter count")
    gpus = positive_int(gpus, "GPU count")
    if zero not in (0, 1, 2, 3):
        raise UsageError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero!r}")
    one_of(recipe, RECIPES, "recipe")
    one_of(offload, OFFLOADS, "offload")
    one_of(device, DEVICES, "offload device")
    accounting.check_offload(zero, offload, device)
    return n_params, gpus


def gradient_trip(recipe: str, zero: int, grads: str = "deepspeed", micro_batches: int = 1) -> dict[str, int]:
    """Bytes per shard parameter the gradients cross PCIe per step, ``down`` and ``up`` (the module
    says where in DeepSpeed's source each copy is)."""
    one_of(grads, GRAD_TRIPS, "gradient-trip model")
    m = positive_int(micro_batches, "micro-batches per step")
    r = accounting.RECIPE[one_of(recipe, RECIPES, "recipe")]
    if grads == "paper":
        return {"down": r.params, "up": 0}
    wide = accounting.optimizer_grad_bytes(r)
    if zero < 3:   # stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu: 16-bit down each micro-batch,
        return {"down": (m * r.params if m > 1 else 0) + wide, "up": (m - 1) * r.params}   # up after the first
    return {"down": m * r.params + wide, "up": m * r.params}


def traffic_parts(n_params: int, recipe: str, zero: int, gpus: int, offload: str, device: str,
                  grads: str = "deepspeed", micro_batches: int = 1) -> dict[str, int]:
    """Bytes one rank moves per step, by purpose: ``grad_down``, ``grad_up`` (:func:`gradient_trip`),
    ``param_fetch`` (ZeRO-3 parameters offloaded: the shard up in every forward and backward),
    ``param_update`` (optimizer only offloaded: the updated 16-bit shard up after the step),
    ``nvme_param_read`` (the fetches' reads from the drive), ``nvme_state_read``, ``nvme_write`` and,
    of it, ``nvme_grad_write`` (the fp32 gradient, written during backward)."""
    n_params, gpus = _check(n_params, recipe, zero, gpus, offload, device)
    m = positive_int(micro_batches, "micro-batches per step")
    keys = ("grad_down", "grad_up", "param_fetch", "param_update", "nvme_param_read", "nvme_state_read",
            "nvme_write", "nvme_grad_write")
    out = dict.fromkeys(keys, 0)
    if offload == "none":
        return out
    s = accounting.shard(n_params, gpus)
    p16 = accounting.RECIPE[recipe].params
    trip = gradient_trip(recipe, zero, grads, m)
    out["grad_down"], out["grad_up"] = trip["down"] * s, trip["up"] * s
    params_off = offload == "optimizer+params"
    out["param_fetch" if params_off else "param_update"] = (2 * m if params_off else 1) * p16 * s
    if device == "nvme":
        states = accounting.model_states(n_params, recipe, gpus, zero, offload, device).nvme
        on_drive = p16 * s if params_off else 0             # the 16-bit shard's own file
        out["nvme_write"] = states
        out["nvme_grad_write"] = accounting.optimizer_grad_bytes(accounting.RECIPE[recipe]) * s
        out["nvme_state_read"] = states - on_drive
        out["nvme_param_read"] = out["param_fetch"] if params_off else 0
    return out


def offload_traffic(n_params: int, recipe: str, zero: int, gpus: int, offload: str,
                    device: str, grads: str = "deepspeed", micro_batches: int = 1) -> dict[str, int]:
    """Bytes one rank moves per step over each link: ``h2d``, ``d2h``, ``nvme_read``, ``nvme_write``
    (the sums of :func:`traffic_parts`; see the module's table). ``grads="deepspeed"`` follows
    DeepSpeed 0.19.8, ``grads="paper"`` the ZeRO-Offload paper (16-bit gradients down, once).
    Raises :class:`UsageError` for combinations DeepSpeed lacks."""
    one_of(grads, GRAD_TRIPS, "gradient-trip model")
    t = traffic_parts(n_params, recipe, zero, gpus, offload, device, grads, micro_batches)
    return {"h2d": t["grad_up"] + t["param_fetch"] + t["param_update"], "d2h": t["grad_down"],
            "nvme_read": t["nvme_param_read"] + t["nvme_state_read"], "nvme_write": t["nvme_write"]}
