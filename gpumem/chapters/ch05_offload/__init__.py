"""Chapter 05, CPU and NVMe offload (卸载, offload): move model states off the accelerator, measure
what each link moves and what a step then costs.

- ``claims``       the note's section 3 (speeds, what NVMe may hold, the 155 ms example) in the ledger
- ``diagrams``     the ladder, per-device bytes, step-time breakdown and prediction tables
- ``experiments``  ``offload``: the ladder and real DeepSpeed offload on CPU ranks, as ``run`` calls it
- ``options``      ``run offload``'s own flags (torch-free)
- ``plots``        the ladder, per-device stacked bars, step-time stacked bars, the 70B cost picture
- ``scenarios``    the note's section 3 scenarios: 8B on one GPU, the tokens offload frees room for
- ``labcheck``     lab 05's ``check()``
- ``QUIZ``         the chapter's quiz

Modules load on first use (``ch.diagrams``), so that ``python -m gpumem``'s parser, which reads
``options``, stays torch-free.
"""

from gpumem.course.registry import lazy_submodules

__all__ = ["claims", "diagrams", "experiments", "labcheck", "options", "plots", "quiz", "scenarios", "QUIZ"]
__getattr__ = lazy_submodules(__name__, __all__)
