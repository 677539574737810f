"""Chapter 06, combining strategies: the planner (``gpumem.planner``) asked the note's
questions, its plans drawn and priced, and one plan run for real on CPU ranks.

- ``scenarios``    the note's 7B / 70B / 405B scenarios and the layouts it proposes
- ``claims``       the note's section 4 and summary table in the ledger (``claims.CLAIMS``)
- ``diagrams``     ranked plans, a plan's memory box and breakdowns, the proof table, configs
- ``plots``        per-GPU memory bars and step-time bars of the ranked plans; predicted against
                   published tokens/s of the validation runs
- ``widget``       the interactive planner (model, GPU, count, sequence, batch)
- ``experiments``  ``plan-proof``: a planned DeepSpeed config run on CPU ranks (``proof_ranks``)
- ``labcheck``     lab 06's ``check()``
- ``timing_cells`` the time model's cells: one collective on three group shapes, the pipeline
                   schedules, the note's slow-network rule on node types
- ``topology``     two nodes drawn from their node type, a layout's groups and the links they cross
- ``validation_cells`` the published runs priced: every row's layout, filled-in fields, rank, the
                   search's best, the calibration
- ``ranking_cells`` why the top plan wins: top against runner-up term by term, the answer's
                   sensitivity to its stated figures, the note's rules asked with every lever
- ``moe_cells``    planning a mixture of experts: Mixtral-8x7B with and without expert
                   parallelism, and where its all-to-all goes
- ``QUIZ``         the chapter's quiz (``quiz_topology``: its questions that need the topology;
                   ``quiz_ranking``: predict the planner's top family on a drawn cluster)

Modules load on first use (``ch.diagrams``), so a process that needs one of them (a rank, a grader)
does not pay for the rest: the quiz's draw, the tracer, matplotlib.
"""

from gpumem.course.registry import lazy_submodules

__all__ = ["claims", "diagrams", "experiments", "labcheck", "moe_cells", "plots", "ranking_cells", "scenarios", "timing_cells",
           "topology", "validation_cells", "widget", "QUIZ"]
__getattr__ = lazy_submodules(__name__, __all__)
