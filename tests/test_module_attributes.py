"""Every ``module.name`` that gpumem's code reads off one of its own modules exists.

A CUDA-only branch never runs here: ``tracing.Llama`` (moved to ``gpumem.memory.llama``) broke
chapter 01's and 03's GPU measurements and the ``checkpointing`` experiment on CUDA, and only the
first H200 run (2026-12-04) found it. This reads the source instead of running it: for each
gpumem module imported under a name (``from . import tracing``, ``from gpumem.memory import
models``, ``import gpumem.x as y``), each attribute read off that name must be there after import.
"""

import ast
import importlib
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gpumem"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _aliases(tree: ast.AST, here: str, is_pkg: bool) -> dict[str, str]:
    """Local name -> gpumem module it is bound to, from the file's import statements."""
    out = {}
    base = here if is_pkg else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                src = f"{pkg}.{node.module}" if node.module else pkg
            else:
                src = node.module or ""
            if not src.startswith("gpumem"):
                continue
            for a in node.names:
                full = f"{src}.{a.name}"
                if importlib.util.find_spec(full.split(".")[0]) and _is_module(full):
                    out[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gpumem.") and a.asname:
                    out[a.asname] = a.name
    return out


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _reads(node: ast.AST, aliases: dict[str, str], shadowed: frozenset = frozenset()):
    """(name, attribute node) for each ``alias.attr`` read, skipping names a function rebinds
    (``def estimate(..., finetune=None)`` shadows the ``finetune`` module inside it)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        bound = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x}
        bound |= {t.id for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.For, ast.With, ast.AnnAssign))
                  for t in ast.walk(n) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        shadowed = shadowed | (bound - _imported_in(node))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.value.id in aliases and node.value.id not in shadowed:
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _reads(child, aliases, shadowed)


def _imported_in(func: ast.AST) -> set[str]:
    return {a.asname or a.name.split(".")[0] for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names}


def test_every_attribute_read_off_a_gpumem_module_exists():
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        here = _module_name(path)
        aliases = _aliases(tree, here, path.name == "__init__.py")
        for node in _reads(tree, aliases):
            mod = importlib.import_module(aliases[node.value.id])
            if not hasattr(mod, node.attr) and not _is_module(f"{mod.__name__}.{node.attr}"):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not missing, "\n".join(missing)


def test_the_check_finds_the_bug_it_was_written_for(tmp_path, monkeypatch):
    """The check itself: ``tracing.Llama`` in a module that imports ``tracing`` is reported."""
    tree = ast.parse("from gpumem.memory import tracing\nnet = tracing.Llama(cfg)\n")
    aliases = _aliases(tree, "gpumem.memory.fake", False)
    assert aliases == {"tracing": "gpumem.memory.tracing"}
    mod = importlib.import_module(aliases["tracing"])
    assert not hasattr(mod, "Llama") and hasattr(mod, "trace_step")
    assert [n.attr for n in _reads(tree, aliases)] == ["Llama"]
    shadow = ast.parse("from gpumem.memory import tracing\ndef f(tracing=None):\n    return tracing.Llama\n")
    assert list(_reads(shadow, aliases)) == []
