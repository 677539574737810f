"""DeepSpeed ZeRO-3's gather schedule: the replay lives in the engine's memory layer
(``gpumem.memory.zero3_schedule``), since ZeRO-3's working set, which every chapter, ``estimate``
and the planner count, is read from it. This name stays for the distributed runs and chapter 02."""

from ..memory.zero3_schedule import (DEFAULTS, attribute, fetch_order, llama_params, owner,  # noqa: F401
                                     peak_gathered, persistent, reuse_gap, simulate, steady_peak,
                                     step_volume)
