"""Seconds, beside the bytes of :mod:`gpumem.memory`: the time engine (torch-free).

Being built (issue 19). Today it holds the hardware each figure of time comes from, every figure
with its source (:mod:`.hardware`), the collectives' alpha-beta cost with the group's placement on
nodes (:mod:`.collectives`), and the pipeline schedules (:mod:`.schedules`). The chapters and the
planner still take their seconds from ``gpumem.memory.speed``, ``offload_cost`` and
``planner_cost``; moving them here is the next step of that issue.
"""
