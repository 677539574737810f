"""Before a lab is graded in a kernel, read every cell the kernel ran for reaches into the grader.

Since review r16 a lab in a kernel is graded in a fresh process (:mod:`.lab_fresh`), and these rules
(:func:`_reach`) are read on what is carried there only, the learner's other cells being theirs;
:func:`refuse_if_reached`, reading every cell, applies where a kernel grades in itself
(``check_lab(..., apart=False)``). What follows is that reading.

Reviews r13 and r14 passed labs from a cell that reached into the grader while it ran: a closure
cell of lab 04's watch swapped through ``sys.modules``, a frame walk to its verdict, lab 02's work
handle found through ``weakref.finalize._registry`` ... Each lab's guards refuse the routes found so
far, one by one. This module refuses the tools themselves, in every cell the kernel has run, before
anything is graded: :func:`first_reach` runs :func:`gpumem.course.lab_reach.first_reach` over
IPython's own record of the cells (``history_manager.input_hist_parsed``: magics already turned into
Python, cells deleted or re-run since included). No cell is exempt: the labs' given cells use none
of the refused tools (lab 02's shows the grader's source with ``drawing.show_source``), and a list of
exempt cells read from a notebook on disk would be the learner's to edit. ``globals()`` and
``locals()`` are allowed here: the check cell passes the notebook's namespace, and the names a cell
sees are its own.

A cell that starts a process is refused too (:mod:`gpumem.course.lab_process`: ``subprocess``,
``os.fork``, ``!cmd``, ``%%bash`` ...): review r13 passed labs 03 and 05 with a helper started from a
cell, detached, with an environment of its own, that answered the grader through a pipe; no lab
needs a process of the learner's own. So is a private name (``_x``) of a gpumem module any cell
imported (review r15 of lab 04: a grader's table changed during the call). A cell magic's body,
``%timeit``'s statement and the code a cell hands to IPython to run (``get_ipython().run_cell(...)``,
which stores no history) are read as well when they are literal strings; a body built at run time
and a record shorter than the cells the kernel ran are refused, since what they ran cannot be read.
A file of the learner's own that a cell runs (a ``%run`` script) is read like a cell, and a loaded
module of the learner's own (from outside gpumem and the installed Python) refuses grading: the labs'
code lives in cells. Without a kernel (the course's tests, plain Python) nothing is read: the tests'
learners live in test files, and each lab's own guards still apply.

Like ``lab_reach``, this raises the bar; it proves nothing. A cell can reach the grader by routes no
list names; the labs' run-time guards and the grader seal stay in place behind it. Out of its reach:
a second kernel or a terminal on the same machine (no cell of this kernel starts them), and a module
of the learner's that takes itself out of ``sys.modules`` and erases its own file.
"""

import ast
import importlib.util
import linecache
import os
import sys
from pathlib import Path

from gpumem.course import genuine, lab_origin, lab_reach
from gpumem.course.lab_process import starts_process

# IPython's ways to run a source held in a string (their first string argument is read as Python;
# a cell magic's body is its third)
_TIMERS = ("timeit", "time", "prun")          # line magics whose argument is a Python statement
_RUNNERS = {"run_cell": 0, "run_cell_async": 0, "run_cell_magic": 2, "ex": 0, "ev": 0, "run_code": 0,
            "run_source": 0, "runsource": 0, "run_ast_nodes": 0, "safe_execfile": None,
            "safe_run_module": None, "safe_execfile_ipy": None}
ALLOWED = ("globals", "locals", "gc", "inspect", lab_reach.PACKAGE, lab_reach.COURSE)   # graded defs: lab_kernel


class Reached(RuntimeError):
    """A cell the kernel ran reaches into the grader: nothing is graded."""


def refuse_if_reached() -> None:
    """Raise :class:`Reached`, naming the cell and its line, when a cell the kernel ran reaches into
    the grader (module docstring); nothing without a kernel."""
    why = first_reach()
    if why:
        raise Reached(f"{why}. Nothing was graded: restart the kernel, take that cell out, run your "
                      "cells again and check")


def first_reach() -> str | None:
    """The first cell the kernel ran that reaches into the grader, in one line, or None."""
    lab_origin.note_kernel()
    sh = lab_origin.shell()
    if sh is None:
        return None
    manager = getattr(sh, "history_manager", None)
    history = getattr(manager, "input_hist_parsed", None)
    raw = getattr(manager, "input_hist_raw", None)
    ran = getattr(sh, "execution_count", 0)
    if not isinstance(history, list) or not isinstance(raw, list) or min(len(history), len(raw)) < ran:
        return (f"the kernel's record of its cells holds {len(history or ())} of the {ran} it ran (a cell "
                "changed IPython's history)")
    own = own_modules()
    if own:
        return (f"a module of your own is loaded ({own[0]}): while a lab is graded, your code lives in the "
                "notebook's cells (a copy of gpumem in a folder of yours would answer for it)")
    seen: set = set()         # the four records mostly hold the same text: each text is read once
    records = [(n, src) for n, src in _records(sh, history, raw)
               if isinstance(src, str) and src.strip() and not (src in seen or seen.add(src))]
    bound = frozenset().union(*(gpumem_names(src) for _, src in records))
    for number, source in records:
        why = _reach(source, ours=bound)
        if why:
            return f"cell [{number}] ({_first_line(source)}), {why}"
    return None


def own_modules() -> list[str]:
    """``name (file)`` of each loaded Python module whose file is neither gpumem's nor the installed
    Python's (review r15 of lab 08: gpumem copied to a folder under another name, imported before the
    check, ran the answers). Compiled extensions (``.so``: DeepSpeed's ops built under the course's
    cache) are not Python a learner writes and are left out."""
    out = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        # torch.classes names a bare "_classes.py": a module's own name, not a file of the learner's
        if isinstance(path, str) and path.endswith(".py") and os.path.isabs(path) and not genuine.trusted(path):
            out.append(f"{name} from {path}")
    return sorted(out)


def _records(sh, history: list, raw: list):
    """Every record IPython keeps of the cells it ran, each with its cell's number: the parsed and
    the typed history, the ``_i<n>`` names in the notebook's namespace, and the source its
    compiler put in ``linecache`` under each cell's file name. A cell that rubs itself out of one
    record is still read in the others."""
    yield from enumerate(history)
    yield from enumerate(raw)
    names = getattr(sh, "user_ns", None) or {}
    for key, value in list(names.items()):
        if isinstance(key, str) and key[:2] == "_i" and key[2:].isdigit():
            yield int(key[2:]), value
    for filename, number in list((getattr(getattr(sh, "compile", None), "_filename_map", None) or {}).items()):
        entry = linecache.cache.get(filename)
        if entry and len(entry) > 2 and isinstance(entry[2], list):
            yield number, "".join(entry[2])


def _reach(source: str, depth: int = 0, ours: frozenset = frozenset()) -> str | None:
    """``lab_reach``'s verdict on ``source`` with :data:`ALLOWED` let through, and on every string
    the source hands IPython to run."""
    why = lab_reach.first_reach(source, allow=ALLOWED) or _history_named(source) or starts_process(source) \
        or _private_of_gpumem(source, ours)
    if why or depth > 3:
        return why
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run_line_magic"
                and len(node.args) > 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value in _TIMERS
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            statement = _statement(node.args[1].value)
            inner = _reach(statement, depth + 1, ours)
            if inner:
                return f"line {node.lineno}: %{node.args[0].value}'s statement: " + inner.split("; the lab")[0]
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in _RUNNERS):
            continue
        line = f"line {node.lineno}: "
        if _RUNNERS[node.func.attr] is None:
            return line + f"runs a file through IPython ({node.func.attr}), which the grader cannot read"
        at = _RUNNERS[node.func.attr]
        arg = node.args[at] if len(node.args) > at else None
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            return line + f"hands IPython code built at run time ({node.func.attr}), which the grader cannot read"
        inner = _reach(arg.value, depth + 1, ours)
        if inner:
            return line + f"the code it hands IPython ({node.func.attr}): " + inner.split("; the lab")[0]
    for line, path, how in _files_run(tree):     # a learner's own file, imported or %run: read it too
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return f"line {line}: {how} {path}, which the grader cannot read"
        inner = _reach(text, depth + 1, ours)
        if inner:
            return f"line {line}: {how} {path}, whose " + inner.split("; the lab")[0]
    return None


def _statement(line: str) -> str:
    """``%timeit -n 3 -r 1 f(x)`` -> ``f(x)``: the magic's options (one taking a value takes the
    next word when it is not attached, ``-n 3``) left out."""
    words, out, skip = line.split(), [], False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word.startswith("-") and not out:
            skip = word in ("-n", "-r", "-p")
        else:
            out = words[i:]
            break
    return " ".join(out)


def _files_run(tree: ast.AST):
    """(line, file, how) of each file of the learner's own that ``tree`` runs: a module it imports
    (loaded by now) whose file is not gpumem's or the installed Python's, and a ``%run`` script."""
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "run_line_magic" and len(node.args) > 1
              and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args[:2])):
            magic, arg = node.args[0].value, node.args[1].value.split()
            if magic == "run" and arg:
                yield node.lineno, str(Path(arg[-1] if arg[0].startswith("-") else arg[0]).expanduser()), "runs"
            if magic in ("load_ext", "reload_ext") and arg:
                names = [arg[0]]
        for k, name in enumerate(names):
            loaded = sys.modules.get(name)
            if loaded is None and k == 0:
                # a module that took itself out of sys.modules: read where Python would find it now.
                # One found nowhere is let through (a cell that failed on a mistyped import), so a
                # module that also erased its file (review r15 of lab 01) is a stated gap
                yield from _unloaded(node.lineno, name)
                continue
            path = getattr(loaded, "__file__", None)
            if isinstance(path, str) and not genuine.trusted(path):
                yield node.lineno, path, "imports"


def _unloaded(line: int, name: str):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        spec = None
    if spec is not None and isinstance(spec.origin, str) and spec.has_location and not genuine.trusted(spec.origin):
        yield line, spec.origin, "imports"


def _history_named(source: str) -> str | None:
    """A cell that names IPython's records of the cells (``In``, ``_ih``, ``_i3`` ...)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and (node.id in ("In", "_ih", "_i", "_ii", "_iii", "Out", "_oh")
                                           or (node.id[:2] == "_i" and node.id[2:].isdigit())):
            return f"line {node.lineno}: uses {node.id}, IPython's record of the cells the kernel ran"
    return None


def _private_of_gpumem(source: str, bound: frozenset = frozenset()) -> str | None:
    """A private name (``_x``) of a gpumem module a cell imported (in this source, or ``bound``: the
    names any cell of the kernel imported from gpumem): the grader's tables and state (review r15 of
    lab 04: ``labops._SAME.update(...)`` during the call blinded the watch). The labs' cells use
    gpumem's public names only."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    ours = set(bound) | gpumem_names(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == lab_reach.PACKAGE:
            private = next((a.name for a in node.names if a.name.startswith("_")), None)
            if private:
                return f"line {node.lineno}: imports {private}, a private name of {node.module}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and _root(node.value) in ours:
            return f"line {node.lineno}: uses .{node.attr}, a private name of gpumem's"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in lab_reach.BY_NAME \
                and len(node.args) > 1 and _root(node.args[0]) in ours and isinstance(node.args[1], ast.Constant) \
                and str(node.args[1].value).startswith("_"):
            return f"line {node.lineno}: uses {node.args[1].value}, a private name of gpumem's, by name"
    return None


def gpumem_names(source: str) -> set:
    """The names ``source`` binds to gpumem's modules and objects by its imports."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {(a.asname or a.name.split(".")[0]) for a in node.names if a.name.split(".")[0] == lab_reach.PACKAGE}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == lab_reach.PACKAGE:
            out |= {a.asname or a.name for a in node.names}
    return out


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _first_line(source: str) -> str:
    line = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    return line if len(line) <= 40 else line[:37] + "..."
