"""Chapter 05, CPU and NVMe offload (卸载, offload): move model states off the accelerator, measure
what each link moves and what a step then costs.

- ``claims``       the note's section 3 (speeds, what NVMe may hold, the 155 ms example) in the ledger
- ``diagrams``     the ladder, per-device bytes, step-time breakdown and prediction tables
- ``experiments``  ``offload``: the ladder and real DeepSpeed offload on CPU ranks, as ``run`` calls it
- ``options``      ``run offload``'s own flags (torch-free)
- ``plots``        the ladder, per-device stacked bars, step-time stacked bars, the 70B cost picture
- ``labcheck``     lab 05's ``check()``
- ``QUIZ``         the chapter's quiz

Modules load on first use (``ch.diagrams``), so that ``python -m gpumem``'s parser, which reads
``options``, stays torch-free.
"""

import importlib

__all__ = ["claims", "diagrams", "experiments", "labcheck", "options", "plots", "quiz", "QUIZ"]


def __getattr__(name: str):
    """Import a submodule (or the quiz) when a notebook first asks for it."""
    if name == "QUIZ":
        return importlib.import_module(".quiz", __name__).QUIZ
    if name in __all__:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
