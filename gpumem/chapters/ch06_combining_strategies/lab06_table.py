"""Lab 06: a table of answers is not a search.

Review r26 harvested the planner's fastest layouts for the grader's own draws (about 100 winners from
50 seeds, in minutes, by running ``labcheck.cases`` and ``planner.plan`` offline) and wrote a
``choose_plan`` that prices only those layouts with the lab's pieces: it passed every row of 11 of 15
fresh checks (rebuilt for review r28: 11 of 15 again; drawing shipped Hugging Face models beside the
Llamas, or a memory fraction per case, still let 10 of 15 pass, since a family's winners repeat).
The layouts that win are few, so no draw defeats such a table; its size limits it. A search needs
the values of its levers, not the answers: the lab's own search holds 102 bytes of literal data and
647 bytecode instructions, the harvested table 11,000 bytes.

:func:`problem` measures what ``choose_plan`` holds: the numbers and strings its code loads
(strings by their UTF-8 bytes; docstrings aside, unless some code reads ``__doc__``), the plain
values and default arguments it reads, through every function and class of the learner's it reaches
(decorated ones unwrapped), and the bytecode instructions of that code (a table written as a chain of
``if`` statements loads few distinct constants but many instructions). Over :data:`CHARS` or
:data:`INSTRUCTIONS` the check stops with a row saying so.

What it does not stop (review r29): the information, not the characters, sets a table's size, and
about 35 bits pack one layout. r29 packed all 115 winners into 292 Unicode characters (about 800
UTF-8 bytes: refused now); packed into printable ASCII the whole table needs about 740 bytes with its
decoder, but some 50 winners fit in the limit, and the 55 most frequent of r26's passed 3 of 11
fresh checks offline. An honest search with a few debug messages held 442 bytes (r29), so the limit
cannot go much lower. Drawing a constraint per case (a lever value the team's stack lacks) would
multiply the winners a table must hold; not done.
"""

import dis
import inspect
import sys
import types

from gpumem.course import genuine

CHARS = 500              # literal bytes; the lab's search holds 102, a table of 100 layouts ~11,000, packed ~600
INSTRUCTIONS = 2500      # bytecode instructions; the lab's search has 647
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


def _items(fn, ns: dict) -> tuple[list, int]:
    """([(bytes, what)] of literal data, bytecode instructions) of ``fn`` and all of the learner's it
    reaches (through decorators such as ``functools.lru_cache``, with default arguments: review r29)."""
    fn = inspect.unwrap(fn)
    codes, seen, items, docs = [fn.__code__], set(), [], []
    values = [("defaults", fn.__defaults__), ("defaults", fn.__kwdefaults__)]
    instructions, reads_doc = 0, False
    while codes:
        code = codes.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        instructions += sum(1 for _ in dis.get_instructions(code))
        reads_doc |= "__doc__" in code.co_names
        for i, const in enumerate(code.co_consts):
            if isinstance(const, types.CodeType):
                codes.append(const)
            elif i or not isinstance(const, str):       # a function's first constant is its docstring
                items.append((_chars(const), f"{repr(const)[:40]} in {code.co_name}"))
            else:
                docs.append((_chars(const), f"the docstring of {code.co_name}"))
        for name in code.co_names:
            if name in seen or name not in ns:
                continue
            seen.add(name)
            value = ns[name]
            if _learners(value) and isinstance(value, type):
                for key, attr in vars(value).items():
                    attr = getattr(attr, "__func__", attr)
                    if isinstance(attr, types.FunctionType):
                        codes.append(attr.__code__)
                    elif key not in _CLASS_OWN:
                        values.append((f"{name}.{key}", attr))
            elif _learners(inspect.unwrap(value)):
                value = inspect.unwrap(value)
                codes.append(value.__code__)
                values += [(f"{name}'s defaults", value.__defaults__), (f"{name}'s defaults", value.__kwdefaults__)]
            elif not callable(value) and not isinstance(value, types.ModuleType) and not _library(name, value):
                values.append((name, value))
    items += [(_chars(v), where) for where, v in values] + (docs if reads_doc else [])
    return [i for i in items if i[0]], instructions


def measure(fn, ns: dict) -> tuple[int, int]:
    """(literal bytes, bytecode instructions) of ``fn`` and all of the learner's it reaches."""
    items, instructions = _items(fn, ns)
    return sum(n for n, _ in items), instructions


def problem(fn, ns: dict) -> str:
    """'' or why ``choose_plan`` holds more than a search needs."""
    items, instructions = _items(fn, ns)
    chars = sum(n for n, _ in items)
    if chars > CHARS:
        top = "; ".join(f"{n:,} B: {what}" for n, what in sorted(items, reverse=True)[:3])
        return (f"choose_plan and what it reads hold {chars:,} bytes of literal data (numbers and strings, "
                f"docstrings aside), more than a search needs ({CHARS}; the lab's own search holds about 100): a "
                f"table of answers is not a search (if most of it is messages, shorten them). The largest: {top}")
    if instructions > INSTRUCTIONS:
        return (f"choose_plan and what it calls run to {instructions:,} bytecode instructions, more than a search "
                f"needs ({INSTRUCTIONS:,}; the lab's own search has about 650): a table of answers written as "
                "code is not a search")
    return ""
