"""Lab 05's reference answers, and what :mod:`.lab_guard` refuses while the learner's code runs.

The answers refuse any caller but the course's own grading code (:data:`ENTRIES`), before grading
too, and a copy of their code run under another name is refused while the learner's call runs
(:mod:`gpumem.course.copy_watch`).

The ladder (:data:`RUNGS`) is DeepSpeed 0.19.8's offload options for a ZeRO-3 (or ZeRO-2) run,
mixed recipe (bf16 parameters and gradients, fp32 master, Adam's fp32 m and v). Per rank, with
s = ceil(Psi / N) shard parameters, the bytes by device and role (:func:`rung_bytes`):

=========================  ======================  ===========================  ===================
rung                       GPU                     CPU (host)                   NVMe
=========================  ======================  ===========================  ===================
zero3                      params 2s grads 2s      -                            -
                           master 4s optim 8s
zero2+opt-cpu              params 2 Psi            grads 4s master 4s optim 8s  -
zero3+opt-cpu              params 2s               grads 6s master 4s optim 8s  -
zero3+opt-nvme             params 2s               grads 2s                     grads 4s master 4s optim 8s
zero3+opt+params-cpu       -                       params 2s grads 6s master    -
                                                   4s optim 8s
zero3+opt+params-nvme      -                       grads 2s                     params 2s grads 4s
                                                                                master 4s optim 8s
=========================  ======================  ===========================  ===================

Where DeepSpeed 0.19.8 puts them (``deepspeed/runtime/zero/``): an offloaded optimizer gets its
own fp32 gradient partition beside master, m and v (``stage_1_and_2.py`` 934-944, ``stage3.py``
1342-1344; DeepSpeedCPUAdam reads it); ZeRO-2 copies each reduced bucket's slice straight into it
and keeps no 16-bit gradient partition on the GPU (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``);
ZeRO-3 allocates its 16-bit gradient partition (``grad_partitions_flat_buffer``) on
``self.device``, the CPU whenever the optimizer is offloaded (lines 333, 791), and never swaps it.
:func:`gpumem.memory.accounting.model_states` gives the same totals per device (tests compare).
"""

import os
import sys

from ...course.copy_watch import graders_only
from ...memory import accounting, ds_estimators, offload_cost
from ...runs import ds_offload
from ...timing import offload_time

# rung -> (ZeRO stage, offload, device), in accounting's vocabulary; the ladder's order
RUNGS = {"zero3": (3, "none", "cpu"), "zero2+opt-cpu": (2, "optimizer", "cpu"),
         "zero3+opt-cpu": (3, "optimizer", "cpu"), "zero3+opt-nvme": (3, "optimizer", "nvme"),
         "zero3+opt+params-cpu": (3, "optimizer+params", "cpu"),
         "zero3+opt+params-nvme": (3, "optimizer+params", "nvme")}
DEVICES = ("gpu", "cpu", "nvme")
ROLES = ("params", "grads", "master", "optimizer")
REFUSAL = "count it yourself: gpumem's accounting is off while lab 05 is graded"
AUDIT = "gpumem.lab05.answer"     # raised by each answer's own body: refused while the learner's call runs
# the answers run only below lab 05's check() (or a course test), with nothing but the course's own
# code in between (:func:`gpumem.course.copy_watch.from_grader`): no table made at definition time
ENTRIES = {(os.path.join(os.path.dirname(os.path.abspath(__file__)), "labcheck.py"), "check")}


def rung_bytes(n_params: int, ranks: int, rung: str) -> dict[str, dict[str, int]]:
    """Per-rank bytes, device -> role -> bytes (only roles with bytes), by hand (module table)."""
    sys.audit(AUDIT)
    graders_only("lab_reference.rung_bytes", ENTRIES)
    zero, offload, device = RUNGS[rung]
    s = -(-n_params // ranks)
    params = 2 * (s if zero == 3 else n_params)
    if offload == "none":
        return {"gpu": {"params": params, "grads": 2 * s, "master": 4 * s, "optimizer": 8 * s}}
    out: dict[str, dict[str, int]] = {"gpu": {}, "cpu": {}, "nvme": {}}
    states = out[device]
    states.update(master=4 * s, optimizer=8 * s, grads=4 * s)          # the offloaded optimizer's side
    if zero == 3:                                                      # the 16-bit gradient partition
        out["cpu"]["grads"] = out["cpu"].get("grads", 0) + 2 * s
    (out[device] if offload == "optimizer+params" else out["gpu"])["params"] = params
    return {d: roles for d, roles in out.items() if roles}


def totals(bytes_by_role: dict) -> dict[str, int]:
    """Device -> bytes, summed over roles (devices without bytes are 0)."""
    return {d: sum((bytes_by_role.get(d) or {}).values()) for d in DEVICES}


def step_seconds(n_params: int, ranks: int, rung: str, compute_s: float, links: offload_time.Links) -> float:
    """Stock DeepSpeed's step time of a rung (:func:`gpumem.timing.offload_time.step_time`)."""
    sys.audit(AUDIT)
    graders_only("lab_reference.step_seconds", ENTRIES)
    zero, offload, device = RUNGS[rung]
    return offload_time.step_time(n_params, "mixed", zero, ranks, offload, device, compute_s, links)["stock"]


def choose(n_params: int, ranks: int, gpu_budget: int, host_budget: int, step_budget_s: float,
           compute_s: float, links: offload_time.Links, count=rung_bytes) -> str | None:
    """The rung that fits both memory budgets and the step-time budget leaving the GPU the most
    room (fewest bytes there), the faster one between equals; None if no rung meets all three."""
    sys.audit(AUDIT)
    graders_only("lab_reference.choose", ENTRIES)
    fits = []
    for rung in RUNGS:
        t = totals(count(n_params, ranks, rung))
        secs = step_seconds(n_params, ranks, rung, compute_s, links)
        if t["gpu"] <= gpu_budget and t["cpu"] <= host_budget and secs <= step_budget_s:
            fits.append((t["gpu"], secs, rung))
    return min(fits)[2] if fits else None


# the library's own counts of what the lab asks for, and where the learner's namespace may hold them
BLOCKED = [(accounting, "model_states"), (ds_offload, "swap_files"), (ds_offload, "swap_bytes"),
           (ds_offload, "placement"), (ds_offload, "by_device"),
           (ds_estimators, "compare"), (ds_estimators, "printed_tables")]
