"""Chapter 01, memory anatomy: the note's 660 GB scenario recomputed by formula, exact trace and
measurement.

- ``claims``    the note's scenario table in the ledger (``claims.CLAIMS``)
- ``diagrams``  the scenario box, the recipe box, the scenario explorer widget
- ``plots``     activations against sequence length; a traced step's peak by category
- ``labcheck``  lab 01's ``check()``
- ``QUIZ``      the chapter's quiz
"""

from . import claims, diagrams, labcheck, plots
from .quiz import QUIZ

__all__ = ["claims", "diagrams", "labcheck", "plots", "QUIZ"]
