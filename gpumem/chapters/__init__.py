"""The chapters, one folder each, and the one registry of what they provide.

A chapter's folder holds everything of that chapter: its claims, quiz, lab check, diagrams,
plots and experiments (rank functions included). Notebooks import a chapter as one name::

    from gpumem.chapters import ch02_zero as ch

Adding a chapter adds its folder and one entry to :data:`CHAPTERS`; nothing else in the course
changes. Chapters import the engine (``gpumem.memory``, ``gpumem.runs``) and the course
machinery (``gpumem.course``), never another chapter (``tests/test_layout.py`` enforces it).
"""

import importlib
from pathlib import Path

from gpumem.course.registry import Chapter, Experiment, resolve

CHAPTERS: tuple[Chapter, ...] = (
    Chapter("00", "ch00_setup", quiz="quiz:QUIZ"),
    Chapter("01", "ch01_memory_anatomy", quiz="quiz:QUIZ",
            labs={"lab01_memory_calculator": "labcheck:check"}),
    Chapter("02", "ch02_zero", quiz="quiz:QUIZ", labs={"lab02_zero2_hooks": "labcheck:check"},
            experiments=(
                Experiment("zero", "experiments:zero", "diagrams:zero_results_table",
                           "ZeRO 0-3 from scratch and real DeepSpeed on CPU ranks"),
                Experiment("gather-trace", "experiments:gather_trace", "diagrams:gather_counts_table",
                           "DeepSpeed ZeRO-3's fetches, all-gathers and releases"))),
    Chapter("03", "ch03_activation_checkpointing", quiz="quiz:QUIZ",
            labs={"lab03_checkpoint_budget": "labcheck:check"},
            experiments=(Experiment("checkpointing", "experiments:checkpointing", "diagrams:checkpointing_table",
                                    "every checkpoint plan: bytes saved, peak, FLOPs and event order"),)),
    Chapter("04", "ch04_flash_attention", quiz="quiz:QUIZ", labs={"lab04_online_softmax": "labcheck:check"},
            experiments=(Experiment("attention", "experiments:attention", "diagrams:attention_table",
                                    "naive vs SDPA vs tiled attention: peak and saved bytes per sequence length",
                                    options="options:add_options"),)),
    Chapter("05", "ch05_offload", quiz="quiz:QUIZ", labs={"lab05_offload_budget": "labcheck:check"}, experiments=(Experiment("offload", "experiments:offload", "diagrams:offload_table", "bandwidth ladder and real DeepSpeed CPU/NVMe offload on CPU ranks", options="options:add_options"),)),
    Chapter("06", "ch06_combining_strategies", quiz="quiz:QUIZ", labs={"lab06_choose_plan": "labcheck:check"},
            experiments=(Experiment("plan-proof", "experiments:plan_proof", "diagrams:plan_proof_table",
                                    "a planned DeepSpeed config run on CPU ranks: measured vs planned bytes",
                                    min_ranks=2),)),
    Chapter("07", "ch07_must_understand", quiz="quiz:QUIZ"),
    Chapter("08", "ch08_finetuning", quiz="quiz:QUIZ", labs={"lab08_finetune_recipe": "labcheck:check"}),
)


def experiments() -> dict[str, tuple[Chapter, Experiment]]:
    """Every registered experiment by name, with the chapter it belongs to."""
    return {e.name: (ch, e) for ch in CHAPTERS for e in ch.experiments}


def run_experiment(name: str, **kwargs) -> dict:
    """Run a registered experiment (``python -m gpumem run NAME`` calls this)."""
    chapter, exp = experiments()[name]
    return resolve(chapter.target(exp.run))(**kwargs)


def render_experiment(name: str, result: dict) -> str:
    """Render a registered experiment's result as the terminal table its chapter defines."""
    chapter, exp = experiments()[name]
    return resolve(chapter.target(exp.table))(result)


def lab_checks() -> dict[str, str]:
    """Lab stem (``lab02_zero2_hooks``) -> absolute ``module:function`` of its check."""
    return {lab: ch.target(fn) for ch in CHAPTERS for lab, fn in ch.labs.items()}


def load_lab(lab: str) -> None:
    """Import the lab's check and every ``lab*`` module of its chapter's folder (its guards, tables
    and references), so that the fresh grading process records them before any learner code runs
    (:mod:`gpumem.course.lab_intact`)."""
    module = lab_checks()[lab].split(":")[0]
    package = importlib.import_module(module.rpartition(".")[0])
    importlib.import_module(module)
    for path in sorted(Path(package.__file__).parent.glob("lab*.py")):
        importlib.import_module(f"{package.__name__}.{path.stem}")


def check_lab(lab: str, ns: dict, show: bool = True, apart: bool | None = None, **options):
    """Grade a lab from its notebook's namespace; every lab's last cell calls this. Refused
    (:class:`~gpumem.course.grader_seal.GraderChanged`) where the grading machinery was changed,
    and in a kernel (:class:`~gpumem.course.lab_history.Reached`) after a cell that reached into it.
    ``apart`` (default: in a kernel) grades in a fresh process from the source of the learner's
    definitions (:mod:`gpumem.course.lab_fresh`), where no cell of the kernel has run. ``options``
    (plain values, e.g. ``seed=0`` to repeat a draw) go to the lab's check."""
    checks = lab_checks()
    if lab not in checks:
        raise KeyError(f"no lab {lab!r}; registered: {', '.join(checks)}")
    from gpumem.course.grader_seal import refuse_if_changed
    from gpumem.course.lab_history import refuse_if_reached
    from gpumem.course.lab_orphans import in_kernel
    refuse_if_changed(lab)                 # a patched Report or grading function: nothing is graded
    if in_kernel() if apart is None else apart:    # what is carried is read there (lab_fresh.refusal)
        from gpumem.course.lab_fresh import grade_apart
        from gpumem.course.grading import Report, Row
        # what only the kernel can show (lab 01: chains the learner measured and tabulated there)
        kernel_refusal = getattr(importlib.import_module(checks[lab].split(":")[0]), "kernel_refusal", None)
        if kernel_refusal is not None and (why := kernel_refusal()):
            report = Report(lab, [Row("check", "what this kernel measured", "error", why)])
            if show:
                print(report.summary())
            return report
        return grade_apart(lab, ns, show=show, options=options)
    refuse_if_reached()                    # in a kernel, graded in it: not after a cell that reached into it
    report = resolve(checks[lab])(ns, show=show, **options)
    refuse_if_changed(lab)                 # ... nor when the learner's code patched it while graded
    return report


def quizzes() -> list:
    """Every chapter's quiz, in chapter order (chapter 07 grades them)."""
    return [resolve(ch.target(ch.quiz)) for ch in CHAPTERS if ch.quiz]
