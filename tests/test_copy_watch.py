"""The labs' shared copy watch (gpumem.course.copy_watch) against review r7's mechanical copy:
the chapters' code re-executed with every number and string moved into a module global and a
no-op call before every statement. The copy behaves the same; the watch must still name it, and
must still pass code that only resembles the answer (each lab's solution: tests/test_labs.py)."""

import ast
import inspect
import types

import pytest

from gpumem.chapters.ch04_flash_attention import labblock
from gpumem.chapters.ch06_combining_strategies import lab06_guard
from gpumem.course import copy_watch


def _nop():
    pass


class _Hoist(ast.NodeTransformer):
    """Numbers, strings and None become module globals ``_k0, _k1, ...`` (docstrings and f-strings kept)."""

    def __init__(self):
        self.k: dict = {}

    def visit_Constant(self, n):
        if n.value is None or (isinstance(n.value, (int, float, str)) and not isinstance(n.value, bool)):
            name = self.k.setdefault((type(n.value), n.value), f"_k{len(self.k)}")
            return ast.copy_location(ast.Name(name, ast.Load()), n)
        return n

    def visit_JoinedStr(self, n):
        return n

    def visit_Expr(self, n):
        return n if isinstance(n.value, ast.Constant) else self.generic_visit(n)


class _Nops(ast.NodeTransformer):
    """``_nop()`` before every statement of every function's blocks."""

    def generic_visit(self, n):
        super().generic_visit(n)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(n, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt) and not isinstance(n, ast.Module):
                setattr(n, field, [x for s in block for x in (ast.Expr(ast.Call(ast.Name("_nop", ast.Load()), [], [])), s)])
        return n


def mechanical_copy(module, nops=True, hoist=True) -> types.ModuleType:
    tree = ast.parse(inspect.getsource(module))
    g = {"_nop": _nop}
    if nops:
        tree = _Nops().visit(tree)
    if hoist:
        h = _Hoist()
        tree = h.visit(tree)
        g |= {name: key[1] for key, name in h.k.items()}
    m = types.ModuleType(module.__name__ + "_mine")
    m.__package__ = module.__package__
    m.__dict__.update(g)
    exec(compile(ast.fix_missing_locations(tree), "<mine>", "exec"), m.__dict__)
    return m


def _hits(prints: copy_watch.Prints, copy: types.ModuleType) -> set[str]:
    found = set()
    for value in vars(copy).values():
        fns = [value] + [v for v in vars(value).values()] if isinstance(value, type) else [value]
        for fn in fns:
            code = getattr(fn, "__code__", None)
            if isinstance(code, types.CodeType):
                found |= {hit for c in copy_watch.nested(code) if (hit := prints.match(c, fn.__globals__))}
    return found


@pytest.mark.parametrize("nops, hoist", [(True, False), (False, True), (True, True)])
def test_a_mechanical_copy_of_chapter_04s_backward_is_named(nops, hoist):
    from gpumem.memory import flash_tiled
    assert "flash_tiled.tiled_backward" in _hits(labblock.prints(), mechanical_copy(flash_tiled, nops, hoist))


def test_a_mechanical_copy_of_the_planner_search_is_named():
    from gpumem.planner import search
    hits = _hits(lab06_guard.prints(), mechanical_copy(search))
    assert any(h.startswith("planner.search.") for h in hits), hits


def test_held_copies_finds_the_mechanical_copy_in_a_namespace():
    from gpumem.memory import flash_tiled
    copy = mechanical_copy(flash_tiled)
    ns = {"mine": copy.tiled_backward, "helpers": [copy]}
    assert copy_watch.held_copies(labblock.prints(), ns).startswith("flash_tiled.")


def test_a_hoisted_constant_counts_only_with_its_value():
    """The constants a body loads still have to be there: hoisted into a global with the same value
    they count, with another value they do not (the learner's own code that reads like the answer)."""
    from gpumem.memory import flash_tiled
    copy = mechanical_copy(flash_tiled, nops=False)
    fn = copy.tiled_backward
    assert labblock.prints().match(fn.__code__, fn.__globals__) == "flash_tiled.tiled_backward"
    changed = {k: (v + 1 if type(v) is int else v + "x" if type(v) is str else v)
               for k, v in fn.__globals__.items() if k.startswith("_k")}
    assert labblock.prints().match(fn.__code__, dict(fn.__globals__, **changed)) == ""
