"""Chapter verbs of the command line (estimate, trace, plan, run). Filled in per chapter."""


def register(sub) -> None:
    """Add the chapter verbs to the ``python -m gpumem`` sub-parsers."""
