"""The library's architecture, checked so that it outlives the change that made it.

Layers, imports one way (read from the source with ``ast``, lazy imports inside functions
included):

    app       gpumem.cli, cli_verbs, cli_plan, cli_plan_ft, gpumem.__main__   may import anything below
    chapters  gpumem.chapters.chNN_*                             its own chapter, the registry,
                                                                 course, engine, base
    registry  gpumem.chapters (its __init__)                     course, engine, base
    course    gpumem.course.*                                    engine, base
    runs      gpumem.runs.* (real runs on ranks)                 planner, timing, memory, base
    planner   gpumem.planner.* (layouts searched and priced)     timing, memory, base
    timing    gpumem.timing.* (seconds: hardware, collectives)   memory, base
    memory    gpumem.memory.*                                    base
    base      gpumem, gpumem.units, gpumem.errors, gpumem.scratch base
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PKG = ROOT / "gpumem"
RANK = {"base": 0, "memory": 1, "timing": 2, "planner": 3, "runs": 4, "course": 5, "registry": 6, "chapters": 7,
        "app": 8}
MAX_LINES = 300


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer(mod: str) -> str:
    parts = mod.split(".")
    if mod in ("gpumem", "gpumem.units", "gpumem.errors", "gpumem.scratch"):
        return "base"
    if len(parts) >= 2 and parts[1] in ("memory", "timing", "planner", "runs", "course"):
        return parts[1]
    if mod == "gpumem.chapters":
        return "registry"
    if len(parts) >= 3 and parts[1] == "chapters":
        return "chapters"
    if mod in ("gpumem.cli", "gpumem.cli_verbs", "gpumem.cli_plan", "gpumem.cli_plan_ft", "gpumem.cli_grade",
               "gpumem.__main__"):
        return "app"
    raise AssertionError(f"{mod} belongs to no layer: put it in memory/, timing/, planner/, runs/, course/ or a chapter")


def chapter_of(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[2] if len(parts) >= 3 and parts[1] == "chapters" else None


def imports_of(mod: str) -> set[str]:
    """gpumem modules that ``mod`` imports (``from pkg import sub`` counts as importing sub)."""
    path = MODULES[mod]
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES and "." in name:   # gpumem.memory.models.get -> module
                name = name.rsplit(".", 1)[0]
            if name in MODULES and name != mod:
                found.add(name)
    return found


GRAPH = {mod: imports_of(mod) for mod in MODULES}


def test_every_module_has_a_layer():
    for mod in MODULES:
        layer(mod)


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_run_one_way(mod):
    """A module imports only its own layer or lower ones; the engine never imports the course or
    a chapter; a chapter never imports another chapter."""
    mine = layer(mod)
    for dep in sorted(GRAPH[mod]):
        theirs = layer(dep)
        assert RANK[theirs] <= RANK[mine], f"{mod} ({mine}) imports {dep} ({theirs}): wrong direction"
        if mine in ("memory",):
            assert theirs in ("base", "memory"), f"{mod} imports {dep}"
        if mine == "planner":
            assert theirs in ("base", "memory", "timing", "planner"), f"{mod} imports {dep}"
        if mine == "chapters" and theirs == "chapters":
            assert chapter_of(dep) == chapter_of(mod), f"{mod} imports another chapter: {dep}"


def test_no_import_cycles():
    state: dict[str, int] = {}

    def visit(mod, path):
        state[mod] = 1
        for dep in GRAPH[mod]:
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, path + [dep])
        state[mod] = 2

    for mod in MODULES:
        if mod not in state:
            visit(mod, [mod])


def test_the_checker_sees_a_wrong_direction(tmp_path):
    """The rule can fail: a memory module importing the course is caught."""
    assert layer("gpumem.memory.accounting") == "memory"
    assert RANK[layer("gpumem.course.quiz")] > RANK[layer("gpumem.memory.accounting")]
    assert "gpumem.memory.accounting" in GRAPH["gpumem.memory.estimate"]   # relative imports resolved
    assert "gpumem.course.registry" in GRAPH["gpumem.chapters"]
    assert "gpumem.chapters.ch07_must_understand.pointers" in GRAPH["gpumem.chapters.ch07_must_understand"]  # from . import x
    assert layer("gpumem.planner.search") == "planner" and layer("gpumem.planner") == "planner"
    assert RANK["timing"] < RANK["planner"] < RANK["runs"]
    assert "gpumem.memory.models" in GRAPH["gpumem.planner.search"]   # from ..memory import models


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_modules_are_small_and_say_why(mod):
    path = MODULES[mod]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it (limit {MAX_LINES})"
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{path.relative_to(ROOT)} needs a module docstring"
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            assert ast.get_docstring(node), f"{mod}.{node.name} needs a docstring"


def test_each_chapter_is_one_folder_in_the_registry():
    from gpumem import chapters
    folders = sorted(p.name for p in (PKG / "chapters").iterdir() if p.is_dir() and p.name.startswith("ch"))
    assert [c.folder for c in chapters.CHAPTERS] == folders
    for ch in chapters.CHAPTERS:
        assert ch.folder.startswith(f"ch{ch.number}_")
        assert (ROOT / "notebooks" / f"{ch.folder[2:]}.ipynb").exists(), ch.folder
        if ch.quiz:
            assert chapters.resolve(ch.target(ch.quiz)).name == ch.folder[2:]
        for lab, fn in ch.labs.items():
            assert lab.startswith(f"lab{ch.number}_") and callable(chapters.resolve(ch.target(fn)))
            assert (ROOT / "solutions" / f"{lab}.ipynb").exists()
        for exp in ch.experiments:
            assert callable(chapters.resolve(ch.target(exp.run))), exp.name
            assert callable(chapters.resolve(ch.target(exp.table))), exp.name


def test_every_solution_is_registered():
    from gpumem import chapters
    assert sorted(p.stem for p in (ROOT / "solutions").glob("lab*.ipynb")) == sorted(chapters.lab_checks())


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_formulas_import_no_torch():
    """The accounting layer and the estimate verb's whole import chain stay torch-free."""
    code = ("import sys\n"
            "import gpumem.memory.accounting, gpumem.memory.activations, gpumem.memory.estimate\n"
            "import gpumem.memory.models, gpumem.memory.policies, gpumem.cli, gpumem.cli_verbs, gpumem.chapters\n"
            "import gpumem.memory.gpus, gpumem.timing.compute, gpumem.memory.megatron\n"
            "import gpumem.memory.recompute_plans, gpumem.memory.recompute_cost\n"
            "import gpumem.planner, gpumem.planner.memory, gpumem.planner.cost, gpumem.planner.search\n"
            "import gpumem.planner.config, gpumem.planner.advice, gpumem.planner.stage_split\n"
            "import gpumem.memory.offload_cost, gpumem.timing.offload_time, gpumem.timing.collectives\n"
            "import gpumem.timing.schedules, gpumem.timing.attention_time\n"
            "import gpumem.timing.hardware, gpumem.planner.evaluate, gpumem.planner.placement\n"
            "import gpumem.cli_plan\n"
            "import gpumem.cli as cli\n"
            "cli.build_parser()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'matplotlib')))\n")
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def _rank_modules() -> list[str]:
    """The chapter modules ranks are started on: ``launch.run("gpumem.chapters.<ch>.<module>:fn", ...)``."""
    found = set()
    for path in PKG.rglob("*.py"):
        found |= set(re.findall(r"[\"'](gpumem\.chapters\.\w+\.\w+):\w+[\"']", path.read_text()))
    return sorted(found)


def test_a_rank_loads_no_figures_and_no_quiz():
    """A rank starts in a fresh interpreter, and the suite starts a few hundred on 2 cores. Its
    chapter's package loads nothing it does not ask for: with every module loaded up front, a
    chapter 02 rank spent 0.6 s more CPU on matplotlib and the quiz's draw (2026-12-06)."""
    modules = _rank_modules()
    assert "gpumem.chapters.ch02_zero.ds_ranks" in modules and len(modules) >= 7, modules
    code = (f"import sys\nfor m in {modules!r}:\n    __import__(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib' or m.endswith('.quiz')))\n")
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
