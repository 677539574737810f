"""Chapter 02, ZeRO: the collectives, per-rank math for stages 0-3, ZeRO from scratch (with the
peak gradient bytes of ZeRO-1 and ZeRO-2 measured during backward), real DeepSpeed on CPU ranks,
the ZeRO-3 gather trace with each gather labelled by the phase it serves, its time at 70B, and
the note's DeepSpeed config examined.

- ``claims``          the note's ZeRO table, gather count and volume (``claims.claims(result, trace)``)
- ``diagrams``        per-stage boxes and data flow, the collectives, the gather sequence, run tables
- ``tables``          GPUs, peak gradient bytes, ZeRO-3 time, DeepSpeed's estimators, frameworks
- ``zero3_tables``    one steady ZeRO-3 step at 70B, DeepSpeed's schedule keys, gathers by phase
- ``plots``           the gather/release timeline
- ``experiments``     ``zero`` and ``gather_trace``, as the notebook and ``run`` call them
- ``scratch_ranks``   rank functions of the from-scratch runs and the collectives, the one-process reference
- ``ds_ranks``        rank functions of the DeepSpeed runs and the gather trace
- ``ds_config_note``  the note's DeepSpeed config run on real DeepSpeed, and corrected
- ``labcheck``        lab 02's ``check()`` (ZeRO-2 gradient hooks)
- ``QUIZ``            the chapter's quiz

Modules load on first use (``ch.diagrams``), so a process that needs one of them (a rank, a grader)
does not pay for the rest: the quiz's draw, the tracer, matplotlib.
"""

from gpumem.course.registry import lazy_submodules

__all__ = ["claims", "diagrams", "ds_config_note", "ds_ranks", "experiments", "labcheck", "plots",
           "scratch_ranks", "tables", "zero3_tables", "QUIZ"]
__getattr__ = lazy_submodules(__name__, __all__)
