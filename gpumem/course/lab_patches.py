"""Graded code leaves libraries as they are (:mod:`.lab_vet`'s second rule, read on the source of
what :mod:`.lab_fresh` carries): no assignment, ``del``, ``setattr`` or ``delattr`` on anything reached
from a name that holds a library's object, and no method call that changes it in place
(:data:`MUTATORS`: ``.update``, ``.clear`` ...). A name holds a library's object when an import bound
it, the notebook's namespace holds a module under it, or it was assigned a reference to such an
object (``R = Report``, ``box = [labplace][0]``, ``m = math``: review r17). No import of a private
module (``_signal``) or by computed name (``__import__``, ``importlib``), no read of a library's private
name (``torch._C``, ``torch.utils._python_dispatch``: review r19) but :data:`PRIVATE_OK`; a carried
import or value line names no private name (``from torch._C import ...``, review r17 of lab 01). A
name bound to ``type(...)`` holds a library's class as far as these rules go (review r19 of lab 02). A
mutator called on a type with a library's object first (``dict.update(lib.TABLE, ...)``) is refused too.
"""

import ast


def _foreign(tree: ast.AST, ns: dict) -> set[str]:
    """Names that hold a library's objects: bound by an import, or a module, class or function of a
    library's that the notebook holds (``from gpumem.course.grading import Report``, review r17)."""
    names = {n for n, v in ns.items() if isinstance(n, str) and (type(v).__name__ == "module" or (
        callable(v) and getattr(v, "__module__", None) not in (None, "__main__", "builtins")))}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    while True:             # a second name for a library's object is the library's (r17: `R = Report`)
        more = set()
        for node in ast.walk(tree):
            value = getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) \
                else node.iter if isinstance(node, (ast.For, ast.comprehension)) else None
            if value is None or not _reference(value, names):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            more |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)} - names
        if not more:
            return names
        names |= more


def _reference(node: ast.AST, names: set) -> bool:
    """Does ``node`` refer to (not compute from) an object of ``names``: a name, an attribute or item
    of one, a list or tuple holding one, either branch of a conditional."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        return _reference(node.value, names)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return any(_reference(e, names) for e in node.elts)
    if isinstance(node, ast.IfExp):
        return _reference(node.body, names) or _reference(node.orelse, names)
    if isinstance(node, ast.BoolOp):
        return any(_reference(v, names) for v in node.values)
    # a class by its instance (review r19 of lab 02: T = type(torch.empty(0)); T.isnan = ...)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"


# private names of libraries graded code may read: autograd's engine (lab 02's queue_callback), and
# torch.cuda._sleep (lab 05's GPU part). Any other is refused (review r19: torch._C._dispatch_library
# re-registered aten's `all`, lab 04; torch.utils._python_dispatch hid a re-run from the tracer, lab 03)
PRIVATE_OK = frozenset({"_execution_engine", "_sleep"})
MUTATORS = frozenset({"update", "clear", "pop", "popitem", "setdefault", "append", "extend", "insert", "remove",
                      "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",
                      "__setitem__", "__delitem__", "__setattr__", "__delattr__", "sort", "reverse", "putenv",
                      "unsetenv",
                      "__init__", "__post_init__"})     # r20: a frozen library dataclass re-initialised in place


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _reads_by_name(node: ast.AST) -> str | None:
    """An attribute read by a name no rule can see (review r18): a ``match`` class pattern's keyword
    (``case object(f_locals=x)``), a ``string.Formatter``, a format template built at run time or one
    whose field reads an attribute (``"{0.__self__}"``)."""
    if isinstance(node, ast.MatchClass) and node.kwd_attrs:
        return f"line {node.lineno} reads .{node.kwd_attrs[0]} through a match pattern"
    if isinstance(node, (ast.Attribute, ast.alias)) and getattr(node, "attr", getattr(node, "name", "")) == "Formatter":
        return f"line {node.lineno} uses string.Formatter, which reads attributes by name"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("format", "format_map"):
        template = node.func.value
        if not (isinstance(template, ast.Constant) and isinstance(template.value, str)):
            return f"line {node.lineno} formats with a template built at run time"
        names = [f.split("}")[0].split(":")[0].split("!")[0] for f in template.value.split("{")[1:]
                 if not f.startswith("{")]                      # "{:.2f}" reads nothing; "{0.x}" does
        if any("." in n or "[" in n for n in names):
            return f"line {node.lineno} formats with a field that reads an attribute or item"
    return None


def _private(node: ast.AST, foreign: set[str]) -> str | None:
    """A library's private name read (``torch._C``, ``getattr(torch, "_C")``), but :data:`PRIVATE_OK`."""
    if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
            and node.attr not in PRIVATE_OK and _reference(_root(node.value), foreign):
        name = ast.unparse(node)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
            and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
            and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__") \
            and node.args[1].value not in PRIVATE_OK and _reference(_root(node.args[0]), foreign):
        name = ast.unparse(node)
    else:
        return None
    return f"line {node.lineno} reads `{name[:60]}`, a library's private name: graded code uses public names"


def _patches(tree: ast.AST, foreign: set[str]) -> str | None:
    for node in ast.walk(tree):
        if why := _reads_by_name(node) or _private(node, foreign):
            return why
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(p.startswith("_") and p != "__future__" for m in mods for p in m.split(".")) or \
                    any(m.split(".")[0] == "importlib" for m in mods):
                return f"line {node.lineno} imports {mods[0]}: graded code imports public modules by name only"
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if not isinstance(t, (ast.Attribute, ast.Subscript)):
                continue
            base = t
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if _reference(base, foreign) or isinstance(base, ast.Call):
                return (f"line {node.lineno} changes `{ast.unparse(t)}`, part of a library: graded code leaves "
                        "libraries as they are")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            # a type's own method with the library's object first (review r20 of lab 05:
            # dict.update(accounting.RECIPE, ...) swapped a recipe while graded)
            if _reference(_root(node.func.value), foreign) or (
                    isinstance(node.func.value, ast.Name) and node.func.value.id in ("dict", "list", "set", "bytearray")
                    and node.args and _reference(node.args[0], foreign)):
                return (f"line {node.lineno} calls `{ast.unparse(node.func)}`, which changes part of a library: "
                        "graded code leaves libraries as they are")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "__import__":
                return f"line {node.lineno} calls __import__: graded code imports public modules by name only"
            if node.func.id in ("setattr", "delattr") and node.args:
                base = node.args[0]
                while isinstance(base, (ast.Attribute, ast.Subscript)):
                    base = base.value
                if not isinstance(base, ast.Name) or base.id in foreign:     # a call's result: r18
                    return f"line {node.lineno} calls {node.func.id} on `{ast.unparse(node.args[0])}`, part of a library"
    return None


def value_problem(line: str) -> str | None:
    """What is wrong with a carried value or import line (:mod:`.lab_carry` writes them): a private
    module or name (review r17 of lab 01: ``from torch._C import DisableTorchFunction`` captured the
    switches the guard turns off, before it did)."""
    for node in ast.walk(ast.parse(line)):
        names = [a.name for a in node.names] + [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.attr] if isinstance(node, ast.Attribute) else []
        private = next((p for n in names for p in n.split(".") if p.startswith("_")), None)
        if private:
            return f"it is {ast.unparse(node)[:60]!s}, a private name ({private}): graded code uses public names"
    return None
