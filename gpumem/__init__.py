"""gpumem: the library behind the *Fitting 70B* course. Every number the notebooks show is
computed here. Three layers, imports one way (``tests/test_layout.py`` enforces it)::

    chapters/   one folder per chapter: claims, quiz, lab check, diagrams, plots, experiments
       |
    course/     the machinery: quizzes, lab grading and generation, ledger, drawing, env check
       |
    memory/     engine: formulas (no torch) and exact traces of a training step
    timing/     engine: seconds (hardware, collectives, pipeline schedules)
    runs/       engine: N ranks, ZeRO from scratch, DeepSpeed engines and ops
       |
    units, errors

``cli`` and ``cli_verbs`` (``python -m gpumem``) sit on top. Importing ``gpumem`` itself does
nothing else; import what you use (``from gpumem.memory import accounting``).
"""

__version__ = "0.1.0"
