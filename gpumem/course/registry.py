"""What a chapter provides to the rest of the course, as data: its quiz, its labs' checks and its
experiments. The list itself is ``gpumem.chapters.CHAPTERS``; the ``run`` verb, the labs and
chapter 07 look things up there.

Everything is named by ``"module:attribute"`` relative to the chapter's package and imported
only when used, so listing the experiments (the ``run`` verb's choices) imports no chapter, no
torch and no DeepSpeed.
"""

import importlib
from dataclasses import dataclass, field


def resolve(target: str):
    """``"package.module:attr"`` -> the object (imports the module)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def lazy_submodules(package: str, names: list[str]):
    """A package's ``__getattr__`` that imports its submodules (and ``QUIZ`` from ``quiz``) when
    first asked for: a chapter whose ``options`` module must stay torch-free for the command line
    writes ``__getattr__ = lazy_submodules(__name__, __all__)``."""
    def __getattr__(name: str):
        if name == "QUIZ":
            return importlib.import_module(".quiz", package).QUIZ
        if name in names:
            return importlib.import_module(f".{name}", package)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__


@dataclass(frozen=True)
class Experiment:
    """``python -m gpumem run NAME``: ``run(ranks=, device=, progress=[, model=], **options)``
    returns JSON-ready data; ``table(data)`` renders it for the terminal.

    ``options``, when given, names ``add_options(parser)`` in a torch-free module of the chapter:
    it adds the experiment's own flags (``--seqs``), whose values reach ``run`` as keyword
    arguments under their ``dest`` names. It is imported when the command line is built, so it
    must not import torch (the ``estimate`` timing test would catch it). ``min_ranks``: the
    fewest ranks it means anything on (a sharding proof needs two)."""
    name: str
    run: str
    table: str
    about: str
    options: str | None = None
    min_ranks: int = 1


@dataclass(frozen=True)
class Chapter:
    """One chapter's registry entry: its folder and the targets of its quiz, lab checks and experiments."""
    number: str                  # "02"
    folder: str                  # "ch02_zero": gpumem/chapters/<folder>/
    quiz: str | None = None      # "quiz:QUIZ"
    labs: dict[str, str] = field(default_factory=dict)          # lab stem -> "labcheck:check"
    experiments: tuple[Experiment, ...] = ()

    @property
    def package(self) -> str:
        return f"gpumem.chapters.{self.folder}"

    def target(self, relative: str) -> str:
        """A target relative to this chapter's package, made absolute (for :func:`resolve` and
        for ``gpumem.runs.launch.run``)."""
        return f"{self.package}.{relative}"
