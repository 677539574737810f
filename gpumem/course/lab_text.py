"""Graded code may not read its own source text back (review r35 and r36 of lab 06).

A table of answers kept where the compiler drops it (a string statement after the first, an ``if
False:`` block, a local variable's annotation, an annotation's *name*) was read back at run time with
``inspect.getsource`` or ``linecache`` and parsed: 14/14 and 13/14 rows, the table rule measuring
only the code. :mod:`.literal_size` now also counts the built text's constants and names that the code
does not hold; this module closes the route itself: :func:`problem` refuses, in a carried
definition, reading source text through the modules that hand it out (``linecache``, ``tokenize``,
``traceback``'s frame and line readers, ``inspect``'s source, frame and stack readers,
``warnings.formatwarning``). No lab's task reads its own text. What remains is any other route to a
file name and its lines (this list proves nothing; the size rule backs it).
"""

import ast
import types

MODULES = ("linecache", "tokenize")                   # read lines of source, all of them
READERS = {"inspect": {"getsource", "getsourcelines", "findsource", "getcomments", "getdoc", "getblock", "stack",
                       "trace", "getframeinfo", "getouterframes", "getinnerframes", "currentframe"},
           "traceback": None,                         # None: every name (extract_stack, format_exc, ... read lines)
           "warnings": {"formatwarning", "showwarning"}}


def _bound(tree: ast.AST, ns: dict) -> dict[str, str]:
    """Local name -> module name, for the modules above: imported in ``tree`` or held in ``ns``."""
    out = {k: v.__name__ for k, v in ns.items() if isinstance(v, types.ModuleType) and v.__name__ in READERS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update({(a.asname or a.name).split(".")[0]: a.name for a in node.names if a.name in READERS})
    return out


def _refused(module: str, name: str) -> bool:
    names = READERS.get(module, ())
    return module in READERS and (names is None or name in names)


def problem(tree: ast.AST, ns: dict) -> str | None:
    """None, or the first line of ``tree`` that reads source text and why it is refused."""
    bound = _bound(tree, ns)
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Import):
            what = next((a.name for a in node.names if a.name.split(".")[0] in MODULES), None)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            what = module if module.split(".")[0] in MODULES else next(
                (f"{module}.{a.name}" for a in node.names if _refused(module, a.name)), None)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            what = f"{bound[node.value.id]}.{node.attr}" if _refused(bound[node.value.id], node.attr) else None
        elif isinstance(node, ast.Name) and isinstance(ns.get(node.id), types.ModuleType) and \
                ns[node.id].__name__ in MODULES:
            what = ns[node.id].__name__
        if what:
            return (f"line {node.lineno} reads source text ({what}): graded code is measured by what it runs, "
                    "and what it reads back from its cell's text is a table kept outside the rule")
        if (grader := _grader(node, ns)):
            return (f"line {node.lineno} reaches into the grader ({grader}): graded code may use the course's "
                    "engine (gpumem.memory, timing, planner ...), not its grading machinery")
    return None


def _grader(node, ns: dict) -> str | None:
    """The grading machinery (``gpumem.course``, which keeps the cells' text for its own reads: review
    r38 of lab 06 read a dead table back through ``lab_bare.source``) named by ``node``, if any."""
    if isinstance(node, ast.Import):
        return next((a.name for a in node.names if a.name.startswith("gpumem.course")), None)
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if module.startswith("gpumem.course") or (module == "gpumem" and any(a.name == "course" for a in node.names)):
            return module + ("" if module.startswith("gpumem.course") else ".course")
    if isinstance(node, ast.Name) and isinstance(ns.get(node.id), types.ModuleType) and \
            ns[node.id].__name__.startswith("gpumem.course"):
        return ns[node.id].__name__
    if isinstance(node, ast.Attribute) and node.attr in ("CARRIED", "lab_bare"):
        return node.attr
    return None
