"""Chapter 02, ZeRO: per-rank math for stages 0-3, ZeRO from scratch and real DeepSpeed on CPU
ranks, the ZeRO-3 gather trace.

- ``claims``         the note's ZeRO table, gather count and volume (``claims.claims(result)``)
- ``diagrams``       per-stage boxes, the gather sequence, result tables
- ``plots``          the gather/release timeline
- ``experiments``    ``zero`` and ``gather_trace``, as the notebook and ``run`` call them
- ``scratch_ranks``  rank functions of the from-scratch runs, and the one-process reference
- ``ds_ranks``       rank functions of the DeepSpeed runs and the gather trace
- ``labcheck``       lab 02's ``check()``
- ``QUIZ``           the chapter's quiz
"""

from . import claims, diagrams, ds_ranks, experiments, labcheck, plots, scratch_ranks
from .quiz import QUIZ

__all__ = ["claims", "diagrams", "ds_ranks", "experiments", "labcheck", "plots", "scratch_ranks", "QUIZ"]
