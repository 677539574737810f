"""What lab 02 sends to its ranks: the learner's ``install_zero2_hooks`` as source text, with the
helpers it reads by name from the learner's other cells (review r18: a helper written in its own
cell, ``def pad_to(n, world)``, was "not defined" on the ranks), and where a rank's error happened.

A helper travels when the function (or a helper it reads, and so on) names it and the notebook holds
it as one of these: a function defined in the same namespace, decorated or not (its source), a
module or a library's function or class (import lines, as :mod:`gpumem.course.lab_carry` writes them), or a plain
value: a number, string, boolean, or a list, tuple, dict or set of them (an assignment). Anything
else (a class of the notebook's, a tensor) stays behind, and a rank that needs it says ``name 'x' is
not defined`` with the line that asked (:func:`where`).
"""

import ast
import inspect
import re
import textwrap
import types

from gpumem.course import lab_bare
from gpumem.course.lab_carry import import_line, literal

RANK_FILE = "<your install_zero2_hooks>"       # the name the ranks compile the bundle under


def _names(code: types.CodeType) -> list[str]:
    """Global names a code object and the code nested in it read, in order of first use."""
    found = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += _names(const)
    return list(dict.fromkeys(found))


def _defaults(text: str) -> list[str]:
    """Names a ``def``'s default values and decorators read (read when the ``def`` runs, not in its code)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    return [n.id for f in tree.body if isinstance(f, ast.FunctionDef)
            for d in (*f.args.defaults, *f.args.kw_defaults, *f.decorator_list) if d is not None
            for n in ast.walk(d) if isinstance(n, ast.Name)]


def bundle(fn, ns: dict, source: str) -> str:
    """``source`` (the function's own text) preceded by the helpers it reads from ``ns``."""
    lines, defs, seen, todo = [], [], {fn.__name__}, _names(fn.__code__) + _defaults(source)
    while todo:
        name = todo.pop(0)
        if name in seen or name not in ns:
            continue
        seen.add(name)
        value = ns[name]
        try:                                                           # a decorated helper: the learner's
            own = inspect.unwrap(value) if callable(value) else value
        except ValueError:
            own = value
        if isinstance(own, types.FunctionType) and own.__globals__ is fn.__globals__:
            try:
                text = textwrap.dedent(lab_bare.source(value))
            except (OSError, TypeError):
                continue
            defs.append(text)
            todo += _names(own.__code__) + _defaults(text)
        elif line := (f"{name} = {text}" if (text := literal(value)) is not None else None) \
                or import_line(name, value):  # a plain value first: 2 is also some gpumem module's attribute
            lines.append(line)
    head = "\n".join(lines) + "\n" if lines else ""
    return "\n\n".join([head, *defs, source] if head else [*defs, source])


def where(detail: str, source: str) -> str:
    """' (line N of the code sent to the ranks: `text`)' for the innermost line of the learner's code
    in a rank's traceback, or '' when the error did not happen there."""
    lines = re.findall(rf'File "{re.escape(RANK_FILE)}", line (\d+)', detail or "")
    text = source.splitlines()
    if not lines or not 0 < int(lines[-1]) <= len(text):
        return ""
    n = int(lines[-1])
    return f" (your code on the ranks, line {n}: `{text[n - 1].strip()[:80]}`)"


def gpumem_imports(source: str) -> list[str]:
    """Modules of ``gpumem`` the learner's source imports (the lab asks for torch.distributed alone)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [n for n in names if n.split(".")[0] == "gpumem"]
    return found


# memory that neither torch's allocator nor Python's (traced by tracemalloc) hands out: the probe
# cannot weigh what hooks keep there (review r33: every gradient kept in an mmap.mmap made at install,
# written through torch.frombuffer views, passed 27/27; review r35: in a dist.HashStore, 27/27, and an
# mmap reached through a module that imports it, rich.progress, 26/27). So the hooks' code imports only
# torch and a few modules of the standard library, and of torch.distributed reads only the collectives,
# the rank and world size and the names the lab's own checks meet; no key-value store, by any route.
MODULES = ("torch", "math", "functools", "collections", "itertools", "operator", "typing", "dataclasses", "time", "sys",
           "contextlib", "statistics", "numbers", "enum", "heapq", "bisect", "weakref", "abc", "warnings", "__future__")
DIST = ("get_world_size", "get_rank", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
        "all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "barrier", "reduce", "ReduceOp", "Work",
        "group", "is_initialized", "get_backend", "distributed_c10d")
UNWEIGHED = ("mmap", "memmap", "open_memmap", "SharedMemory", "ShareableList")


def _dist_names(tree) -> set[str]:
    """The names ``torch.distributed`` is bound to in ``tree`` (``import torch.distributed as dist``...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            names |= {a.asname or a.name for a in node.names if a.name == "distributed"}
    return names


def _reaches(node, dist: set[str]) -> str:
    """What of ``node`` the hooks may not use: a module outside :data:`MODULES`, a name of
    torch.distributed outside :data:`DIST`, a store, or memory the probe cannot weigh ('' if none)."""
    if isinstance(node, ast.Import):
        return next((a.name for a in node.names if a.name.split(".")[0] not in MODULES), "")
    if isinstance(node, ast.ImportFrom):
        if (node.module or "").split(".")[0] not in MODULES or node.level:
            return node.module or "a relative import"
        if node.module == "torch.distributed":
            return next((a.name for a in node.names if a.name not in DIST), "")
        return next((a.name for a in node.names if a.name in UNWEIGHED or a.name.endswith("Store")), "")
    if isinstance(node, ast.Attribute):
        base = node.value
        on_dist = isinstance(base, ast.Name) and base.id in dist or isinstance(base, ast.Attribute) and \
            base.attr == "distributed" and isinstance(base.value, ast.Name) and base.value.id == "torch"
        if on_dist and node.attr not in DIST or node.attr in UNWEIGHED or node.attr.endswith("Store") or \
                node.attr.startswith(("to_sparse", "sparse_", "_saved", "_nested")) or "nested" in node.attr:
            return node.attr              # review r37: a sparse tensor, or an autograd node's saved result, unweighed
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith("Store"):
        return node.value
    return ""


def unweighed(source: str) -> str:
    """'' or, for the first line of ``source`` (the code sent to the ranks) that reaches past what the
    hooks need (:func:`_reaches`), why it is refused, with the line's text."""
    tree = ast.parse(source)
    dist, text = _dist_names(tree), source.splitlines()
    own = source[:source.rfind("\ndef ") + 1].count("\n") if "\ndef " in source else 0   # the learner's def
    for node in sorted(ast.walk(tree), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
        what = _reaches(node, dist)
        if what:
            where = f"line {node.lineno - own} of your function" if node.lineno > own else \
                f"line {node.lineno} of the code sent to the ranks"       # review r37 #3: the learner's numbering
            line = f"{where} (`{text[node.lineno - 1].strip()[:80]}`)"
            return (f"{line}: {what} is outside what the hooks may use (torch's tensors and collectives, and "
                    f"{', '.join(MODULES[1:6])}... of the standard library): memory kept outside torch and "
                    "Python's allocator, or in a store, is memory the grader cannot weigh: keep shards and buckets "
                    "in torch tensors")
    return ""
