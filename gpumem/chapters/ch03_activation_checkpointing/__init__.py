"""Chapter 03, activation checkpointing (重计算, recomputation): keep a few tensors, re-run the
rest in backward; measured on CPU, traced at Llama-3 sizes, priced in FLOPs and seconds.

- ``claims``       the note's section 2 (and its 70B figures) in the ledger (``claims.CLAIMS``)
- ``diagrams``     the opening numbers, the X -> A -> B -> C -> D event diagram, result tables
- ``experiments``  ``checkpointing``: every plan measured (bytes, FLOPs, events), as ``run`` calls it
- ``frameworks``   the plans under their names in PyTorch, HF, DeepSpeed, Megatron-LM, torchtitan
- ``plots``        event timeline, memory timelines per plan, the memory-vs-recompute frontier
- ``scale``        8B / 70B / 405B per GPU under ZeRO-3, seconds at a stated share of peak, traced vs formula
- ``labcheck``     lab 03's ``check()``
- ``QUIZ``         the chapter's quiz

Modules load on first use (``ch.diagrams``), so a process that needs one of them (a rank, a grader)
does not pay for the rest: the quiz's draw, the tracer, matplotlib.
"""

from gpumem.course.registry import lazy_submodules

__all__ = ["claims", "diagrams", "experiments", "frameworks", "labcheck", "opsaves", "plots", "scale", "QUIZ"]
__getattr__ = lazy_submodules(__name__, __all__)
