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
    they count, with another value they do not. ``tiled_backward`` loads 5 (by hand from its
    source: 0, 1.0, 2, ``...``, None; -1 and -2 are ``-`` applied to 1 and 2): one changed still
    names the copy (review r8, below), three of the five changed is the learner's own code."""
    from gpumem.memory import flash_tiled
    copy = mechanical_copy(flash_tiled, nops=False)
    fn = copy.tiled_backward
    assert labblock.prints().match(fn.__code__, fn.__globals__) == "flash_tiled.tiled_backward"
    numbers = {k: v for k, v in fn.__globals__.items() if k in fn.__code__.co_names and type(v) in (int, float)}
    assert set(map(abs, numbers.values())) == {0, 1, 2}                # 1 and 1.0 are one constant
    changed = {k: (v + 10 if type(v) is int else v + 10.0) for k, v in numbers.items()}
    assert labblock.prints().match(fn.__code__, dict(fn.__globals__, **changed)) == ""
    one = {k: 7 for k, v in numbers.items() if v == 0 and type(v) is int}
    assert one and labblock.prints().match(fn.__code__, dict(fn.__globals__, **one)) == "flash_tiled.tiled_backward"


class _Defaults(ast.NodeTransformer):
    """Review r8's mut3: every number, string and None a function's body uses becomes a keyword-only
    default (``def f(..., *, _k0=2)``), read with LOAD_FAST like a parameter (docstrings kept)."""

    def visit_FunctionDef(self, fn):
        consts: dict = {}
        outer = self

        class _Body(_Hoist):
            def visit_FunctionDef(self, n):
                return outer.visit_FunctionDef(n)

        body = _Body()
        body.k = consts
        fn.body = [body.visit(st) for st in fn.body]
        for (_, value), name in consts.items():
            fn.args.kwonlyargs.append(ast.arg(name))
            fn.args.kw_defaults.append(ast.Constant(value))
        return fn


def defaults_copy(module) -> types.ModuleType:
    tree = ast.fix_missing_locations(_Defaults().visit(ast.parse(inspect.getsource(module))))
    m = types.ModuleType(module.__name__ + "_mine")
    m.__package__, m.__file__ = module.__package__, "mine.py"
    exec(compile(tree, "<mine>", "exec"), m.__dict__)
    return m


def test_the_range_len_paste_of_chapter_04s_backward_is_named():
    """Review r8 cheat B: ``tiled_backward`` pasted with ``range(0, s_q, bq)`` written
    ``range(len(()), s_q, bq)``. Its body loads six constants, by hand from its source: 0, 1.0, 2,
    ``...``, None and True (-1 and -2 are ``-`` applied to 1 and 2); the paste loads no 0, and one
    missing of six no longer blinds the watch."""
    from gpumem.memory import flash_tiled
    prints = labblock.prints()
    by_hand = {0, 1.0, 2, ..., None, ("bool", True)}
    assert prints.consts[prints.names.index("flash_tiled.tiled_backward")] == by_hand
    src = inspect.getsource(flash_tiled.tiled_backward)
    assert "range(0, s_q, bq)" in src
    g = dict(vars(flash_tiled))
    exec(src.replace("range(0, s_q, bq)", "range(len(()), s_q, bq)").replace("def tiled_backward", "def mine"), g)
    assert prints.match(g["mine"].__code__, g) == "flash_tiled.tiled_backward"
    assert copy_watch.held_copies(prints, {"mine": g["mine"]}) == "flash_tiled.tiled_backward"


def _under_watch(prints, fn, *args):
    """What :meth:`Prints.copied` says of ``fn``'s frame when it is called (a profile hook, as the
    labs' guards read it: the parameters bound to defaults are the frame's)."""
    seen = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code is fn.__code__ and not seen:
            seen.append(prints.copied(frame))
    import sys
    sys.setprofile(hook)
    try:
        fn(*args)
    except Exception:
        pass
    finally:
        sys.setprofile(None)
    return seen[0] if seen else None


def test_constants_moved_into_keyword_defaults_still_count():
    """Review r8's mut3 (every constant of a library function a keyword-only default) passed labs
    05 and 06: defaults were not loaded constants. They count now, from the function (held_copies)
    and from its running frame (the guards' profile hooks); with other values they do not."""
    from gpumem.planner import search
    from gpumem.chapters.ch05_offload import lab_guard
    from gpumem.chapters.ch05_offload import lab_reference as ref
    from gpumem.memory import offload_cost
    copy = defaults_copy(ref)
    fn = copy.rung_bytes
    assert fn.__kwdefaults__ and "mixed" in fn.__kwdefaults__.values()
    prints = lab_guard.prints()
    assert prints.match(fn.__code__, fn.__globals__) == ""                 # the body loads none of them
    assert copy_watch.held_copies(prints, {"mine": fn}) == "the grader's answer lab_reference.rung_bytes"
    assert _under_watch(prints, fn, 4000, 4, "zero3") == "the grader's answer lab_reference.rung_bytes"
    other = {k: (v + "x" if isinstance(v, str) else v) for k, v in fn.__kwdefaults__.items()}
    fn.__kwdefaults__ = other
    assert copy_watch.held_copies(prints, {"mine": fn}) == ""
    engine = defaults_copy(offload_cost).traffic_parts
    assert copy_watch.held_copies(prints, {"mine": engine}) == "gpumem.memory.offload_cost.traffic_parts"
    hits = {copy_watch.held_copies(lab06_guard.prints(), {"f": f}) for f in vars(defaults_copy(search)).values()
            if isinstance(f, types.FunctionType)}
    assert {"planner.search.layouts_of", "planner.search._states_ok"} <= hits


def test_a_closure_value_counts_as_a_constant():
    """A constant held in a closure cell counts as loaded, as a default does: the backward's 0, 1.0
    and 2 (three of its six; ``-1`` and 1 too) read from an enclosing function's parameters."""
    from gpumem.memory import flash_tiled

    class _Cells(ast.NodeTransformer):
        def visit_Constant(self, n):
            name = {(int, 0): "ZERO", (int, 1): "ONE", (int, 2): "TWO", (float, 1.0): "UNIT"}.get((type(n.value), n.value))
            return ast.copy_location(ast.Name(name, ast.Load()), n) if name else n

    fn = _Cells().visit(ast.parse(inspect.getsource(flash_tiled.tiled_backward)).body[0])
    maker = ast.parse("def make(ZERO, ONE, TWO, UNIT):\n    return tiled_backward\n")
    maker.body[0].body.insert(0, fn)
    g = dict(vars(flash_tiled))
    exec(compile(ast.fix_missing_locations(maker), "<mine>", "exec"), g)
    prints = labblock.prints()
    mine = g["make"](0, 1, 2, 1.0)
    assert mine.__closure__ and prints.match(mine.__code__, g) == ""      # the body loads none of the three
    assert copy_watch.held_copies(prints, {"mine": mine}) == "flash_tiled.tiled_backward"
    assert copy_watch.held_copies(prints, {"mine": g["make"](5, 6, 7, 8.5)}) == ""


def test_a_dead_store_before_every_statement_is_left_out():
    """Review r8's copy_pad: ``_pz = 0`` before every statement broke every run of 8 instructions."""
    from gpumem.memory import flash_tiled
    lines = inspect.getsource(flash_tiled.tiled_backward).splitlines(True)
    padded = [lines[0]] + [" " * (len(x) - len(x.lstrip())) + "_pz = 0\n" + x
                           if x.strip() and not x.strip().startswith(('"""', "dq, dk", "for ", "else", "elif", ")"))
                           and x.rstrip().endswith((")", "]")) and "=" in x else x for x in lines[1:]]
    g = dict(vars(flash_tiled))
    exec("".join(padded).replace("def tiled_backward", "def mine"), g)
    assert sum("_pz = 0" in x for x in padded) >= 5
    assert labblock.prints().match(g["mine"].__code__, g) == "flash_tiled.tiled_backward"


def test_no_function_of_the_library_is_taken_for_another():
    """False positives: no function of gpumem (each module's code compiled afresh) matches a
    protected body of labs 04, 05, 06 or 08 other than one of its own name (the library's
    ``offload_traffic`` shares 0.96 of ``finetune.grouped``'s shingles, and none of its strings)."""
    import importlib
    import pkgutil
    import gpumem
    from gpumem.chapters.ch05_offload import lab_guard
    from gpumem.chapters.ch08_finetuning import lab_guard as lab08_guard
    all_prints = [labblock.prints(), lab_guard.prints(), lab06_guard.prints(), lab08_guard.prints()]
    wrong = []
    for info in pkgutil.walk_packages(gpumem.__path__, "gpumem."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for code in copy_watch.nested(copy_watch.fresh(module.__file__)):
            for prints in all_prints:
                hit = prints.match(code, vars(module))
                if hit and hit.rsplit(".", 1)[-1] != code.co_qualname.rsplit(".", 1)[-1]:
                    wrong.append((info.name, code.co_qualname, hit))
    assert wrong == []
