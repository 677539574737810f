"""The planner: every training layout of a model on a set of GPUs, what fits, ranked by step time
(torch-free). It reads bytes from :mod:`gpumem.memory` and seconds from :mod:`gpumem.timing`.

Modules:

* :mod:`.question`: what is asked (``Question`` = model, GPUs, sequence, batch + ``Cluster`` +
  ``Levers``); :mod:`.answer`: what comes back (``Result`` / ``Answer``, ``Plan``);
* :mod:`.search`: the enumeration (``plan``, ``answer``, ``candidates``); :mod:`.rules`: which
  framework runs what (DeepSpeed, Megatron-Core, hybrid sharding); :mod:`.ranking`: the order
  (ties within 0.5 % of the fastest, then headroom, recipe, offloaded bytes);
* :mod:`.memory`: per-GPU bytes of one layout (``Layout``, ``per_gpu``, ``states_part``);
* :mod:`.cost`: seconds of one step of a layout, term by term (``step_seconds``);
* :mod:`.config`: the layout as DeepSpeed / Megatron-DeepSpeed / FSDP2 switches;
* :mod:`.evaluate`: one given layout priced and ranked (``plan --layout``; ``evaluate``);
* :mod:`.placement`: the node a GPU is planned in and where each group's ranks sit;
* :mod:`.advice`: what to change when nothing fits; :mod:`.stage_split`: uneven pipeline splits;
* :mod:`.hybrid`: hybrid sharding (FSDP2 HSDP, ZeRO++ hpZ); :mod:`.layout`: the ``Layout`` itself;
* :mod:`.explain`: two plans term by term, the runner-up, sensitivity to the stated figures;
* :mod:`.validate` and :mod:`.practice`: published runs priced, and the top plan against each run.

``from gpumem import planner; planner.plan("llama-3-70b", 64, seq=8192)`` is the public entry.
"""

from .config import deepspeed_config, fsdp_equivalent, megatron_args, model_code
from .cost import step_seconds
from .evaluate import LayoutResult, evaluate, parse_layout
from .memory import Layout, per_gpu
from .question import Cluster, Levers, PLANNABLE_RECIPES, Question
from .ranking import TIE, rank, rank_of, tight, tight_limit
from .search import (DEFAULT_TOKENS, HOST_PER_NODE, MICRO_BATCHES, NVME_PER_NODE, OFFLOAD_CHOICES, RECIPES,
                     Answer, Plan, Result, allowed, answer, assumptions, candidates, fits_any, parallel_degrees, plan)

__all__ = ["DEFAULT_TOKENS", "HOST_PER_NODE", "MICRO_BATCHES", "NVME_PER_NODE", "OFFLOAD_CHOICES", "PLANNABLE_RECIPES",
           "RECIPES", "TIE", "Answer", "Cluster", "Layout", "LayoutResult", "Levers", "Plan", "Question", "Result",
           "allowed", "answer", "assumptions", "candidates", "deepspeed_config", "evaluate", "fits_any",
           "fsdp_equivalent", "megatron_args", "model_code", "parallel_degrees", "parse_layout", "per_gpu", "plan",
           "rank", "rank_of", "step_seconds", "tight", "tight_limit"]
