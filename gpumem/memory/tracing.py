"""Exact memory traces of one training step: the names chapters, the command line and tests use.

``gpumem.memory.tracer`` traces one step under PyTorch's MemTracker on fake (or real) tensors
(``trace_step``, ``PeakTracker``, ``Trace``); ``gpumem.memory.trace_compose`` composes a
full-depth trace from three shallow ones (``trace_fast``). This module gathers both.
"""

from .trace_compose import trace_fast  # noqa: F401
from .tracer import (CATEGORIES, MasterWeightAdamW, Moment, PeakTracker, Trace, build,  # noqa: F401
                     make_optimizer, param_dtype, trace_step, training_step, validate)
