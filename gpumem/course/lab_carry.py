"""What a lab's check carries to the fresh process it grades in (:mod:`.lab_fresh`): the learner's
definitions as source text, never as live objects.

:func:`carry` starts from every function and class a notebook cell defined (found in the namespace
the check cell passes; a decorated one through its ``__wrapped__``) and follows the global names
their code reads, at any depth:

* a function or class of a cell: the ``def``/``class`` statement, decorators included, cut out of
  its cell's source (IPython keeps it in ``linecache``; a ``def`` under ``if``/``try`` or in a
  ``%%time`` cell is found by compiling the cells' sources and matching the code) and padded with
  blank lines so that line numbers stay those of the cell; a ``name = lambda ...`` line likewise;
  a second name for a function (``first_try = estimate_peak``) or a class's bound method
  (``checkpoint = MyCheckpoint.apply``) as that assignment;
* a module: ``import <its name> as <name>``; a function or class of an installed module (``sqrt``,
  ``torch.exp2``): imported from it, when the module really holds that object;
* a plain value (numbers, infinities included, strings, bytes, ``None``, tuples, lists, dicts and
  sets of them, a torch dtype), or a table a gpumem module holds: written out.

Anything else (a tensor, a model, an object made by a call, a ``functools.partial``) is left behind
with its type (:attr:`Carried.left`): rebuilding it would mean running the cell that made it, what
the fresh process is for not doing. The lab's text says so: make such things inside your function.
"""

import ast
import builtins
import linecache
import math
import os
import sys
import types
from dataclasses import dataclass, field

from . import genuine

SKIP = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})   # IPython's own names
_PLAIN = (int, bool, str, bytes, type(None))
_VALUE_CHARS = 100_000
_LIBRARIES = ("torch", "torch.nn.functional", "torch.linalg", "math", "operator", "functools", "itertools")


@dataclass
class Carried:
    """The carried program: ``values`` (name -> source line, run first), ``defs`` (name -> (cell
    file name, source padded to the cell's lines, the name the source defines), in an order that
    runs), ``after`` (name -> an assignment run last), ``left`` (name -> why not carried)."""
    values: dict = field(default_factory=dict)
    defs: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    left: dict = field(default_factory=dict)

    def cells(self) -> dict[str, str]:
        """Each cell's file name -> its carried lines (the rest blank), for ``linecache``."""
        out: dict[str, list[str]] = {}
        for filename, source, _ in self.defs.values():
            lines = source.splitlines(True)
            have = out.setdefault(filename, [])
            have.extend(["\n"] * (len(lines) - len(have)))
            for i, line in enumerate(lines):
                if line.strip():
                    have[i] = line if line.endswith("\n") else line + "\n"
        return {name: "".join(lines) for name, lines in out.items()}


def _unwrapped(obj):
    seen = 0
    while hasattr(obj, "__wrapped__") and seen < 10 and not isinstance(obj, type):
        obj, seen = obj.__wrapped__, seen + 1
    return obj


def _in_memory(name: str) -> bool:
    return not os.path.isfile(name) and bool(linecache.getlines(name))


def _codes(code: types.CodeType):
    yield code
    yield from (c for const in code.co_consts if isinstance(const, types.CodeType) for c in _codes(const))


def _class_code(cls: type) -> types.CodeType | None:
    """A code object of one of the class's own methods (None: none, as a dataclass of fields only)."""
    for value in vars(cls).values():
        for part in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
            code = getattr(_unwrapped(part), "__code__", None)
            if isinstance(code, types.CodeType) and code.co_filename not in ("<string>",) and not genuine.trusted(
                    code.co_filename):            # "<string>": a dataclass's generated methods (review r18)
                return code
    return None


def _is_cell_def(obj) -> bool:
    """A function or class a cell defined: its module is the notebook's (``__main__``; ``builtins``
    where the course's tests run cells with ``exec``), not a module file's."""
    obj = _unwrapped(obj)
    module = getattr(obj, "__module__", None)
    if module not in ("__main__", "builtins", None) and module in sys.modules:
        return False
    if isinstance(obj, type):
        return getattr(builtins, obj.__name__, None) is not obj
    code = getattr(obj, "__code__", None)
    return isinstance(obj, types.FunctionType) and isinstance(code, types.CodeType) \
        and not os.path.isfile(code.co_filename)


def _statements(source: str):
    """Every ``def``/``class``/assignment a cell runs at its top, inside ``if``/``try``/``with``/``for``
    blocks too (not inside functions or classes). Magic lines (``%%time``, ``!ls``) are blanked."""
    try:
        body = list(ast.parse(_blanked(source)).body)
    except SyntaxError:
        return
    while body:
        node = body.pop(0)
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for part in ("body", "orelse", "finalbody", "handlers"):
                body[:0] = [n for n in getattr(node, part, []) if isinstance(n, ast.AST)]


def _cut(lines: list[str], node: ast.stmt) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
    indent = node.col_offset
    body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[start - 1:node.end_lineno]]
    return "\n" * (start - 1) + "".join(body)


def _texts(filename: str):
    """(file name, source) of the cell that compiled ``filename``, then of every other cell known."""
    if _in_memory(filename):
        yield filename, "".join(linecache.getlines(filename))
    for name in list(linecache.cache):
        if name != filename and _in_memory(name):
            yield name, "".join(linecache.getlines(name))
    from .lab_origin import shell
    raw = getattr(getattr(shell(), "history_manager", None), "input_hist_raw", None) or []
    for n, text in enumerate(list(raw)):
        if isinstance(text, str):
            yield f"<history cell {n}>", text


def _matches(node, code: types.CodeType, filename: str, source: str) -> bool:
    """Does the statement compile to ``code`` (same bytecode, names, constants)? Compiled alone (as
    IPython compiles each statement of a cell) and with its whole cell (as ``exec`` does): CPython's
    bytecode for ``math.f()`` depends on whether the same compile imports ``math`` (review r18)."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
    for text in (_cut(source.splitlines(True), node), _blanked(source)):
        try:
            compiled = compile(text, filename, "exec")
        except SyntaxError:
            continue
        if any(c.co_name == code.co_name and first <= c.co_firstlineno <= node.end_lineno and genuine.same(c, code)
               for c in _codes(compiled)):
            return True
    return False


def _blanked(source: str) -> str:
    """The cell with its magic and shell lines (``%%time``, ``!ls``) blank."""
    return "".join(("\n" if line.lstrip().startswith(("%", "!")) else line) for line in source.splitlines(True))


def _def_source(obj) -> tuple[str, str] | str:
    """(cell file, padded source) of the def/class/lambda statement that made ``obj``, or why not."""
    fn = _unwrapped(obj)
    if "<locals>" in getattr(fn, "__qualname__", ""):
        return "a function made inside another function (write it with `def` at the top of a cell)"
    code = _class_code(fn) if isinstance(fn, type) else getattr(fn, "__code__", None)
    kinds = (ast.ClassDef,) if isinstance(fn, type) else (ast.FunctionDef, ast.AsyncFunctionDef)
    wanted = getattr(fn, "__name__", "")
    for filename, source in _texts(code.co_filename if code is not None else ""):
        lines = source.splitlines(True)
        for node in _statements(source):
            if wanted == "<lambda>" and isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
                hit = code is not None and _matches(node, code, filename, source)
            elif isinstance(node, kinds) and node.name == wanted:
                hit = code is None or _matches(node, code, filename, source)
            else:
                continue
            if hit:
                return filename, _cut(lines, node)
    return "its def statement was not found in the cells this kernel ran"


def import_line(name: str, obj) -> str | None:
    """``import`` line that gives ``name`` the same object in a fresh process, or None."""
    if isinstance(obj, types.ModuleType):
        mod = getattr(obj, "__name__", None)
        return f"import {mod} as {name}" if isinstance(mod, str) and sys.modules.get(mod) is obj else None
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(mod, str) and isinstance(qual, str) and mod in sys.modules and mod != "__main__" \
            and all(part.isidentifier() for part in qual.split(".") + mod.split(".")):
        found = sys.modules[mod]
        for part in qual.split("."):
            found = getattr(found, part, None)
        if found is obj:
            return f"import {mod}\n{name} = {mod}.{qual}"
    for mod in _LIBRARIES + tuple(sorted(m for m in list(sys.modules) if m.startswith("gpumem."))):
        for attr, value in list(getattr(sys.modules.get(mod), "__dict__", {}).items()):
            if value is obj and attr.isidentifier() and not attr.startswith("_"):
                return f"import {mod}\n{name} = {mod}.{attr}"
    return None


def literal(value, depth: int = 0) -> str | None:
    """Python source for a plain value (None where it is not one)."""
    torch = sys.modules.get("torch")
    if depth > 20:
        return None
    if torch is not None and isinstance(value, torch.dtype):
        return f"__import__('torch').{str(value).removeprefix('torch.')}"
    if type(value) is float:
        return repr(value) if math.isfinite(value) else f"float('{value}')"
    if type(value) is complex or type(value) in _PLAIN:
        return repr(value) if type(value) is not complex or all(map(math.isfinite, (value.real, value.imag))) else None
    if type(value) in (tuple, list, set, frozenset):
        parts = [literal(v, depth + 1) for v in value]
        if None in parts:
            return None
        body = ", ".join(parts) + ("," if type(value) is tuple and len(parts) == 1 else "")
        return {tuple: f"({body})", list: f"[{body}]", set: f"{{{body}}}" if parts else "set()",
                frozenset: f"frozenset([{body}])"}[type(value)]
    if type(value) is dict:
        items = [(literal(k, depth + 1), literal(v, depth + 1)) for k, v in value.items()]
        return None if any(None in kv for kv in items) else "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    return None


def _names_read(source: str, filename: str) -> tuple[set, set]:
    """(names the definition's own statement reads when it runs, names any of its code reads)."""
    try:
        top = compile(source, filename, "exec")
    except SyntaxError:
        return set(), set()
    return set(top.co_names), set().union(*(c.co_names for c in _codes(top)))


def _bound_method(name: str, obj, ns: dict) -> tuple[str, str] | None:
    """(class name in ns, line) for ``name = SomeClass.method`` of a cell's class."""
    owner, attr = getattr(obj, "__self__", None), getattr(obj, "__name__", None)
    if isinstance(owner, type) and isinstance(attr, str) and _is_cell_def(owner):
        holder = next((n for n, v in ns.items() if v is owner and isinstance(n, str) and n.isidentifier()), None)
        if holder is not None and getattr(owner, attr, None) == obj:
            return holder, f"{name} = {holder}.{attr}"
    return None


def carry(ns: dict) -> Carried:
    """The learner's definitions in ``ns`` and what they read, as source (module docstring)."""
    out, needs = Carried(), {}
    todo = [n for n, v in ns.items() if isinstance(n, str) and not n.startswith("_") and n not in SKIP
            and (_is_cell_def(v) or _bound_method(n, v, ns))]
    seen: set = set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in ns:
            continue
        seen.add(name)
        obj = ns[name]
        own = getattr(_unwrapped(obj), "__name__", name)
        if (bound := _bound_method(name, obj, ns)) is not None:
            out.after[name] = bound[1]
            todo.append(bound[0])
        elif _is_cell_def(obj) and own != name and own != "<lambda>" and ns.get(own) is obj:
            out.after[name] = f"{name} = {own}"          # a second name for a carried definition
            todo.append(own)
        elif _is_cell_def(obj):
            found = _def_source(obj)
            if isinstance(found, str):
                out.left[name] = found
                continue
            filename, source = found
            out.defs[name] = (filename, source, name if own == "<lambda>" else own)
            now, read = _names_read(source, filename)
            needs[name] = now - {name, own}
            todo.extend(sorted(n for n in read if n in ns and n not in seen and n not in SKIP
                               and not (hasattr(builtins, n) and not _is_cell_def(ns[n]))))
        elif isinstance(obj, types.ModuleType) and isinstance(getattr(obj, "__file__", None), str) \
                and not genuine.trusted(obj.__file__):
            out.left[name] = (f"a module of your own ({obj.__file__}): the grading process has the installed "
                              "libraries only; put its code in a cell")
        elif (line := import_line(name, obj) or (f"{name} = {text}" if (text := literal(obj)) is not None
                                                  and len(text) <= _VALUE_CHARS else None)) is not None:
            out.values[name] = line
        else:
            out.left[name] = f"a {type(obj).__module__}.{type(obj).__qualname__}"
    out.defs = _ordered(out.defs, needs)
    return out


def _ordered(defs: dict, needs: dict) -> dict:
    """Definitions ordered so that each runs after those its statement reads (decorators, defaults,
    base classes); otherwise in the namespace's order. A cycle keeps that order."""
    done: dict = {}
    pending = list(defs)
    while pending:
        ready = [n for n in pending if not (needs.get(n, set()) & set(pending) - {n})] or pending[:1]
        done[ready[0]] = defs[ready[0]]
        pending.remove(ready[0])
    return done
