"""The planner: every training layout of a model on a set of GPUs, what fits, ranked by step time
(torch-free). It reads bytes from :mod:`gpumem.memory` and seconds from :mod:`gpumem.timing`.

Modules:

* :mod:`.search`: the question's enumeration and ranking (``plan``, ``Result``, ``Plan``,
  ``candidates``, DeepSpeed's rules in ``allowed``);
* :mod:`.memory`: per-GPU bytes of one layout (``Layout``, ``per_gpu``, ``states_part``);
* :mod:`.cost`: seconds of one step of a layout, term by term (``step_seconds``);
* :mod:`.config`: the layout as DeepSpeed / Megatron-DeepSpeed / FSDP2 switches;
* :mod:`.evaluate`: one given layout priced and ranked (``plan --layout``; ``evaluate``);
* :mod:`.placement`: the node a GPU is planned in and where each group's ranks sit;
* :mod:`.advice`: what to change when nothing fits; :mod:`.stage_split`: uneven pipeline splits.

``from gpumem import planner; planner.plan("llama-3-70b", 64, seq=8192)`` is the public entry.
"""

from .config import deepspeed_config, fsdp_equivalent, megatron_args, model_code
from .cost import step_seconds
from .evaluate import LayoutResult, evaluate, parse_layout
from .memory import Layout, per_gpu
from .search import (DEFAULT_TOKENS, HOST_PER_NODE, MICRO_BATCHES, NVME_PER_NODE, OFFLOAD_CHOICES, RECIPES, TIE,
                     Plan, Result, allowed, assumptions, candidates, fits_any, parallel_degrees, plan, rank_key,
                     tie_bucket)

__all__ = ["DEFAULT_TOKENS", "HOST_PER_NODE", "MICRO_BATCHES", "NVME_PER_NODE", "OFFLOAD_CHOICES", "RECIPES", "TIE",
           "Layout", "LayoutResult", "Plan", "Result", "allowed", "assumptions", "candidates",
           "deepspeed_config", "evaluate", "fits_any", "fsdp_equivalent", "megatron_args", "model_code",
           "parallel_degrees", "parse_layout", "per_gpu", "plan", "rank_key", "step_seconds", "tie_bucket"]
