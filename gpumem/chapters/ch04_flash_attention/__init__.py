"""Chapter 04, FlashAttention: attention's s x s scores measured, then removed by tiling with an
online softmax, and recomputed in backward.

- ``claims``       the note's score-matrix arithmetic and FlashAttention row in the ledger; ``kept_table``
- ``diagrams``     the opening numbers, online softmax step by step, causal tiles, the measured results
- ``traffic``      FLOPs and HBM traffic (upper and lower bound), the paper's Figure 2 beside the model,
                   attention's share of a layer's time
- ``experiments``  ``attention``: naive vs SDPA vs tiled, peak and saved bytes per s (``run attention``);
                   ``gqa_saved``: what each kernel saves with grouped-query attention
- ``options``      ``run attention``'s flags (torch-free)
- ``frameworks``   SDPA backends, flash_attn, Hugging Face's attn_implementation, which GPUs run FA2
- ``plots``        bytes against s on log axes with the s^2 and s laws and chapter 01's formula
- ``labcheck``     lab 04's ``check()``
- ``QUIZ``         the chapter's quiz

Submodules are imported when first used, so that ``options`` stays torch-free.
"""

from gpumem.course.registry import lazy_submodules

__all__ = ["claims", "diagrams", "experiments", "frameworks", "labcheck", "options", "plots", "quiz", "traffic", "QUIZ"]
__getattr__ = lazy_submodules(__name__, __all__)
