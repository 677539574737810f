"""What a learner's function holds as literal data: a table of answers is not a mechanism.

A grader that draws its cases from a few families can be passed by a table of the right answers
harvested offline, from the library or from the grader's own draws (lab 06, review r26: about 100
of the planner's winning layouts; lab 01, review r29: byte-count coefficients fitted to the
library's measurements, pasted as two dict literals). Such a table is large where the mechanism
is small. :func:`measure` counts what a function holds: the numbers and strings its code loads
(numbers by their digits, strings by their UTF-8 bytes; docstrings aside unless some code reads
``__doc__``), the plain values, class attributes, default arguments and annotations it reads, the
characters of its names beyond :data:`NAME_FREE` (review r32: a table packed into a method's name,
read back through ``dir``), through every function and class of the learner's it reaches
(decorated ones unwrapped), and the bytecode instructions of that code (a table written as a chain
of ``if`` statements loads few distinct constants but many instructions). Values the course's
library holds under the same name are not the learner's and are not counted. :func:`problem` says, in one line, when a limit is passed.

What it does not stop: the information, not the characters, sets a table's size; a table packed
several bits a character into a string, with a decoder, can fit where a dict literal does not. Each
lab sets limits that its own solution clears several times over and says so in its prompt.
"""

import ast
import builtins
import dis
import inspect
import linecache
import os
import sys
import types
from collections import Counter

from . import genuine
from .lab_bare import CARRIED
from .literal_dead import all_codes, dead_nodes

NAME_FREE = 24     # characters of a name that are not data (a descriptive name is shorter); the rest count
_CLASS_OWN = frozenset({"__doc__", "__module__", "__qualname__", "__dict__", "__weakref__", "__annotations__",
                        "__dataclass_fields__", "__dataclass_params__", "__match_args__"})


def _chars(value, depth: int = 0) -> int:
    """Characters of literal data in a constant or a plain value (numbers by their digits)."""
    if depth > 20 or value is None or isinstance(value, bool):
        return 0
    if isinstance(value, (int, float, complex)):
        return len(repr(value).lstrip("-"))
    if isinstance(value, str):                 # review r29: one CJK or emoji character holds up to 20 bits
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(k, depth + 1) + _chars(v, depth + 1) for k, v in value.items())
    if isinstance(value, (tuple, list, set, frozenset)):
        return sum(_chars(v, depth + 1) for v in value)
    held = getattr(value, "__dict__", None)    # an object's attributes (a SimpleNamespace holding a table),
    if isinstance(held, dict) and not isinstance(value, (type, types.ModuleType, types.FunctionType)) \
            and not type(value).__module__.startswith("gpumem"):       # not the library's own objects
        return _chars(held, depth + 1)
    return 0


def _learners(value) -> bool:
    """A function or class a notebook cell (or the learner's own text) defined, not an installed one."""
    if isinstance(value, types.FunctionType):
        return not genuine.genuine(value.__code__)
    if not isinstance(value, type) or value.__module__ == "builtins":
        return False
    module = sys.modules.get(value.__module__)          # a cell's class: __main__, or no installed file
    return module is None or value.__module__ == "__main__" or not getattr(module, "__file__", None)


def _library(name: str, value) -> bool:
    """A value the course's library holds under that name (``from gpumem.memory.gpus import X``,
    carried to the grading process as its text): not the learner's data (review r29)."""
    return any(getattr(m, name, None) == value for key, m in list(sys.modules.items())
               if key.startswith("gpumem.") and m is not None and name in vars(m))


def _notes(value) -> tuple:
    """The annotations of a function or class (review r31: a table of answers written as a string
    annotation, ``def notes(fit: "..."):``, is a constant of the defining cell, not of the function)."""
    held = vars(value).get("__annotations__") if isinstance(value, type) else getattr(value, "__annotations__", None)
    return tuple(held.values()) if isinstance(held, dict) else ()


def _cells(fn) -> list[tuple[str, object]]:
    """(name, value) of each variable ``fn`` closes over (review r29's fit held its coefficients so)."""
    out = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            out.append((name, cell.cell_contents))
        except ValueError:           # a cell not yet filled
            continue
    return out


def _keys(value, out: Counter, depth: int = 0) -> Counter:
    """How often each (type, value) of a number, string or bytes occurs in ``value``, through
    containers and code (each code object's constants once, as the compiler keeps them)."""
    if depth > 20:
        return out
    if isinstance(value, types.CodeType):
        for const in value.co_consts:
            _keys(const, out, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            _keys(k, out, depth + 1), _keys(v, out, depth + 1)
    elif isinstance(value, (tuple, list, set, frozenset)):
        for v in value:
            _keys(v, out, depth + 1)
    elif isinstance(value, (int, float, complex, str, bytes)) and not isinstance(value, bool):
        out[(type(value), value)] += 1
    return out


def _tree(filename: str, trees: dict):
    if filename not in trees:
        text = CARRIED.get(filename) or ("" if os.path.isfile(filename) else "".join(linecache.getlines(filename)))
        try:
            trees[filename] = ast.parse(text) if text else None
        except (SyntaxError, ValueError):
            trees[filename] = None
    return trees[filename]


def _unrun(codes: list, classes: set, held: Counter, names: set) -> list:
    """Review r35 of lab 06: literal data in the text of the cells that define what was reached, that
    the code does not hold (a string statement after the first, an ``if False:`` block, a local
    variable's annotation: the compiler drops them, ``inspect.getsource`` or ``linecache`` reads them
    back): text no reached code runs, every constant counted (:mod:`.literal_dead`; review r38: a dead
    table of the code's own values, read back from the grader's copy of the text, had cost only its
    distinct values), then each other constant whose value the code does not hold, and each name the
    code never uses, in full (r36: a table spelt as one annotation's name). The text is the one the
    grading process built from (:data:`.lab_bare.CARRIED`: only the carried definitions' lines), else
    ``linecache``'s for a cell (a file on disk is no cell's text)."""
    trees: dict = {}
    files = {code.co_filename for code in codes}
    files |= {name for name in CARRIED if any(isinstance(node, ast.ClassDef) and node.name in classes
                                              for node in ast.walk(_tree(name, trees) or ast.Module([], [])))}
    items = []
    reached = {(c.co_filename, c.co_name, c.co_firstlineno) for c in all_codes(codes)}
    for filename in sorted(files):
        dead = dead_nodes(_tree(filename, trees) or ast.Module([], []), filename, reached, classes)
        consts = [node for node in dead if isinstance(node, ast.Constant)]
        if consts:
            lines = sorted({node.lineno for node in consts})
            items.append((sum(_chars(node.value) for node in consts),
                          f"{len(consts):,} constants in code that never runs (lines {lines[0]}-{lines[-1]} of "
                          f"{filename}), each counted"))
        skip = {id(node) for node in consts}          # counted above; a dead name still counts below
        for node in ast.walk(_tree(filename, trees) or ast.Module([], [])):
            if id(node) in skip:
                continue
            spelt = node.id if isinstance(node, ast.Name) else node.arg if isinstance(node, ast.arg) else \
                node.attr if isinstance(node, ast.Attribute) else None
            if spelt is not None and spelt not in names and len(spelt) > 1:
                names.add(spelt)                     # counted once, as the distinct names are
                items.append((len(spelt), f"the name {spelt[:30]}... in the text of {filename}, not in its code"))
            if not isinstance(node, ast.Constant):
                continue
            if _keys(node.value, Counter()).keys() - held.keys():
                items.append((_chars(node.value), f"{repr(node.value)[:40]} in the text of {filename}, not in its code"))
    return items


def _items(fn, ns: dict) -> tuple[list, int]:
    """([(bytes, what)] of literal data, bytecode instructions) of ``fn`` and all of the learner's it
    reaches: globals it reads, variables it closes over, through decorators such as
    ``functools.lru_cache``, with default arguments (review r29)."""
    fn = inspect.unwrap(fn)
    codes, seen, items, docs, names = [fn.__code__], {id(fn)}, [], [], set()
    values = [("defaults", fn.__defaults__), ("defaults", fn.__kwdefaults__), ("annotations", _notes(fn)),
              ("attributes", dict(vars(fn)))]
    walked, classes, class_docs = [], set(), []      # what was looked into: its source is read too
    pending = _cells(fn)             # (name, value) reached, still to look into
    instructions, reads_doc = 0, False
    while codes or pending:
        while pending:
            name, value = pending.pop()
            if callable(value):              # a function or class reached twice is looked into once
                if id(value) in seen:
                    continue
                seen.add(id(value))
            if _learners(value) and isinstance(value, type):
                classes.add(value.__name__)
                class_docs.append(vars(value).get("__doc__"))
                values.append((f"{name}'s annotations", _notes(value)))
                docs.append((_chars(vars(value).get("__doc__")), f"the docstring of class {name}"))   # review r33
                names.update(k for k in vars(value) if k not in _CLASS_OWN)
                for key, attr in vars(value).items():
                    if len(key) > NAME_FREE:         # review r32: a table packed into a method's name, read by dir()
                        items.append((len(key) - NAME_FREE, f"{name}'s attribute name of {len(key)} characters"))
                    attr = getattr(attr, "__func__", attr)
                    if isinstance(attr, types.FunctionType):
                        codes.append(attr.__code__)
                        pending += _cells(attr)
                    elif key not in _CLASS_OWN:
                        values.append((f"{name}.{key}", attr))
            elif _learners(inspect.unwrap(value)):
                value = inspect.unwrap(value)
                codes.append(value.__code__)
                values += [(f"{name}'s defaults", value.__defaults__), (f"{name}'s defaults", value.__kwdefaults__),
                           (f"{name}'s annotations", _notes(value)), (f"{name}'s attributes", dict(vars(value)))]
                pending += _cells(value)
            elif not callable(value) and not isinstance(value, types.ModuleType) and not _library(name, value):
                values.append((name, value))
        if not codes:
            break
        code = codes.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        walked.append(code)
        instructions += sum(1 for _ in dis.get_instructions(code))
        items += [(len(n) - NAME_FREE, f"a name of {len(n)} characters in {code.co_name}")   # review r32
                  for n in {code.co_name, *code.co_varnames, *code.co_cellvars} if len(n) > NAME_FREE]
        names.update((code.co_name, *code.co_varnames, *code.co_cellvars, *code.co_names))
        reads_doc |= "__doc__" in code.co_names or "__doc__" in code.co_consts
        for i, const in enumerate(code.co_consts):
            if isinstance(const, types.CodeType):
                codes.append(const)
            elif i or not isinstance(const, str):       # a function's first constant is its docstring
                items.append((_chars(const), f"{repr(const)[:40]} in {code.co_name}"))
            else:
                docs.append((_chars(const), f"the docstring of {code.co_name}"))
        for name in code.co_names:
            if name not in seen and name in ns:
                seen.add(name)
                pending.append((name, ns[name]))
    items += [(_chars(v), where) for where, v in values] + (docs if reads_doc else [])
    held = Counter()
    for const in [*walked, *(v for _, v in values), *class_docs]:
        _keys(const, held)
    used = set(names) | {n for code in walked for n in (*code.co_freevars, *code.co_names)} | set(ns) | set(vars(builtins))
    items += _unrun(walked, classes, held, used)
    return [i for i in items if i[0]], instructions, names


def measure(fn, ns: dict) -> tuple[int, int]:
    """(literal bytes, bytecode instructions) of ``fn`` and all of the learner's it reaches."""
    items, instructions, _ = _items(fn, ns)
    return sum(n for n, _ in items), instructions


def name_chars(fn, ns: dict) -> int:
    """Characters of the distinct names ``fn`` and all of the learner's it reaches use: functions,
    their variables and the names they read, attributes of the learner's classes (review r33 of
    lab 01: a table split into 620 class attribute names of 24 characters, read back by ``dir``)."""
    return sum(len(n) for n in _items(fn, ns)[2])


def problem(fn, ns: dict, name: str, limits: tuple[int, int], own: tuple[int, int], does: str) -> str:
    """'' or one line saying why ``fn`` (graded as ``name``) holds more than ``does`` needs:
    ``limits`` = (literal bytes, instructions[, characters of names]) allowed, ``own`` = what the
    lab's solution holds."""
    items, instructions, names = _items(fn, ns)
    chars, noun = sum(n for n, _ in items), does.split()[-1]
    if chars > limits[0]:
        top = "; ".join(f"{n:,} B: {what}" for n, what in sorted(items, reverse=True)[:3])
        return (f"{name} and what it reads hold {chars:,} bytes of literal data (numbers and strings, docstrings "
                f"aside), more than {does} needs ({limits[0]}; the lab's own {noun} holds about {own[0]}): a table of "
                f"answers is not {does} (if most of it is messages, shorten them). The largest: {top}")
    if instructions > limits[1]:
        return (f"{name} and what it calls run to {instructions:,} bytecode instructions, more than {does} needs "
                f"({limits[1]:,}; the lab's own {noun} has about {own[1]}): a table of answers written as code is not {does}")
    spelt = sum(len(n) for n in names)
    if len(limits) > 2 and spelt > limits[2]:
        return (f"{name} and what it reads use {len(names):,} names of {spelt:,} characters in all, more than {does} "
                f"needs ({limits[2]:,}; the lab's own {noun} about {own[2]:,}): names can hold a table of answers too")
    return ""
