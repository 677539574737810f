"""Chapter 01, memory anatomy: the note's 660 GB scenario recomputed by formula, exact trace and
measurement.

- ``claims``    the note's scenario table in the ledger (``claims.CLAIMS``), judged per GPU
                by the traced peak against usable memory
- ``steps``     the chapter's traced steps and timelines, computed once (cached) and shared
- ``diagrams``  the scenario box, the recipe box and the recipes' framework names, who holds
                what when, the AdamW workspace table, memory and time at scale, the explorer
- ``plots``     activations against sequence length; a step's memory timeline; the peak by
                category, unsharded or per GPU under ZeRO-3
- ``labcheck``  lab 01's ``check()`` and the layer code the lab prints (``layer_source``)
- ``your_model`` section 9: Qwen2.5-72B and Mixtral-8x7B beside Llama-3-70B, counted from their
                configs and traced with transformers' own code (imported on its own: it loads
                transformers)
- ``QUIZ``      the chapter's quiz

Modules load on first use (``ch.diagrams``), so a process that needs one of them (a rank, a grader)
does not pay for the rest: the quiz's draw, the tracer, matplotlib.
"""

from gpumem.course.registry import lazy_submodules

__all__ = ["claims", "diagrams", "labcheck", "plots", "steps", "QUIZ"]
__getattr__ = lazy_submodules(__name__, __all__)
