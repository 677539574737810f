"""Lab 05's grader truth, and what :mod:`.lab_guard` refuses while the learner's code runs.

No table of answers lives here: each expected count is the library's own
(:func:`gpumem.memory.accounting.model_states`, split by role with its recipe), each step time the
time engine's (:func:`gpumem.timing.offload_time.step_time`), computed after the learner's call
returns. Both refuse while that call runs (:mod:`.lab_guard`), so neither this module nor a copy of
it can answer from inside the learner's code; the hand count they are checked against lives in
``tests/test_lab05_adversarial.py``. The answers also refuse any caller but the course's own
grading code (:data:`ENTRIES`), before grading too.
"""

import os
import sys
from types import MappingProxyType

from ...course.copy_watch import graders_only
from ...memory import accounting, ds_estimators, offload_cost
from ...runs import ds_offload
from ...timing import grad_swap, offload_time

# rung -> (ZeRO stage, offload, device), in accounting's vocabulary; the ladder's order
# read-only (review r18: graded code rewrote it through dict.update(ref.RUNGS, ...))
RUNGS = MappingProxyType({"zero3": (3, "none", "cpu"), "zero2+opt-cpu": (2, "optimizer", "cpu"),
                          "zero3+opt-cpu": (3, "optimizer", "cpu"), "zero3+opt-nvme": (3, "optimizer", "nvme"),
                          "zero3+opt+params-cpu": (3, "optimizer+params", "cpu"),
                          "zero3+opt+params-nvme": (3, "optimizer+params", "nvme")})
DEVICES = ("gpu", "cpu", "nvme")
ROLES = ("params", "grads", "master", "optimizer")
REFUSAL = "count it yourself: gpumem's accounting is off while lab 05 is graded"
AUDIT = "gpumem.lab05.answer"     # raised by each answer's own body: refused while the learner's call runs
# the answers run only below lab 05's check() (or a course test), with nothing but the course's own
# code in between (:func:`gpumem.course.copy_watch.from_grader`): no table made at definition time
ENTRIES = {(os.path.join(os.path.dirname(os.path.abspath(__file__)), "labcheck.py"), "check")}


def rung_bytes(n_params: int, ranks: int, rung: str) -> dict[str, dict[str, int]]:
    """Per-rank bytes, device -> role -> bytes (only roles with bytes): the library's per-device
    count (``accounting.model_states``), each device's bytes split by role with the recipe."""
    sys.audit(AUDIT)
    graders_only("lab_reference.rung_bytes", ENTRIES)
    zero, offload, device = RUNGS[rung]
    st = accounting.model_states(n_params, "mixed", ranks, zero, offload, device)
    recipe, s = accounting.RECIPE["mixed"], accounting.shard(n_params, ranks)
    per = dict(recipe.optimizer)
    states = {"master": per["master fp32"] * s, "optimizer": (per["m fp32"] + per["v fp32"]) * s}
    if offload == "none":
        return {"gpu": {"params": st.params, "grads": st.grads, **states}}
    out: dict[str, dict[str, int]] = {"gpu": {}, "cpu": {}, "nvme": {}}
    side = out[device]
    side.update(states, grads=accounting.optimizer_grad_bytes(recipe) * s)
    if offload == "optimizer+params":
        side["params"] = recipe.params * s
    for role, b in (("params", st.params), ("grads", st.grads)):
        if b:
            out["gpu"][role] = b
    rest = st.host - (sum(side.values()) if device == "cpu" else 0)     # ZeRO-3's 16-bit partition
    if rest:
        out["cpu"]["grads"] = out["cpu"].get("grads", 0) + rest
    assert sum(out["nvme"].values()) == st.nvme and sum(out["gpu"].values()) == st.total
    return {d: roles for d, roles in out.items() if roles}


def totals(bytes_by_role: dict) -> dict[str, int]:
    """Device -> bytes, summed over roles (devices without bytes are 0)."""
    return {d: sum((bytes_by_role.get(d) or {}).values()) for d in DEVICES}


def step_seconds(n_params: int, ranks: int, rung: str, compute_s: float, links: offload_time.Links,
                 micro_batches: int = 1) -> float:
    """Stock DeepSpeed's step time of a rung (:func:`gpumem.timing.offload_time.step_time`) whose
    step accumulates gradients over ``micro_batches`` (``compute_s`` covers them all)."""
    sys.audit(AUDIT)
    graders_only("lab_reference.step_seconds", ENTRIES)
    zero, offload, device = RUNGS[rung]
    return offload_time.step_time(n_params, "mixed", zero, ranks, offload, device, compute_s, links,
                                micro_batches=micro_batches)["stock"]


def choose(n_params: int, ranks: int, gpu_budget: int, host_budget: int, step_budget_s: float,
           compute_s: float, links: offload_time.Links, micro_batches: int = 1, count=rung_bytes) -> str | None:
    """The rung that fits both memory budgets and the step-time budget leaving the GPU the most
    room (fewest bytes there), the faster one between equals; None if no rung meets all three."""
    sys.audit(AUDIT)
    graders_only("lab_reference.choose", ENTRIES)
    fits = []
    for rung in RUNGS:
        t = totals(count(n_params, ranks, rung))
        secs = step_seconds(n_params, ranks, rung, compute_s, links, micro_batches)
        if t["gpu"] <= gpu_budget and t["cpu"] <= host_budget and secs <= step_budget_s:
            fits.append((t["gpu"], secs, rung))
    return min(fits)[2] if fits else None


# the library's own counts of what the lab asks for, and where the learner's namespace may hold them;
# part 3 asks for the time mechanism, so the time engine's schedules and traffic counts refuse too
BLOCKED = ((accounting, "model_states"), (ds_offload, "swap_files"), (ds_offload, "swap_bytes"),
           (ds_offload, "placement"), (ds_offload, "by_device"),
           (ds_estimators, "compare"), (ds_estimators, "printed_tables"),
           (offload_time, "step_time"), (offload_time, "stock_schedule"), (offload_time, "ideal_schedule"),
           (offload_time, "break_even_tokens"), (offload_cost, "traffic_parts"),
           (offload_cost, "offload_traffic"), (offload_cost, "gradient_trip"),
           (grad_swap, "exposed_seconds"), (grad_swap, "waits"), (grad_swap, "buffers"),
           (grad_swap, "backward_seconds"))
