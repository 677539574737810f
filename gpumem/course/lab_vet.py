"""Rules for the definitions a lab carries to its fresh grading process (:mod:`.lab_fresh`), read from
their source before that process starts. Reviews r16 passed every lab from the blank notebook with
code that ran *while the definitions were rebuilt*, before any guard was up (a class body or a
default argument that replaced ``json.dumps``), or that patched a library while graded.

:func:`problem` returns the first rule a definition breaks, in one line, or None:

* **nothing runs when a definition is made**: a decorator is one the course knows to be inert
  (:data:`DECORATORS`: ``functools.lru_cache``/``cache``, ``torch.no_grad()``, ``staticmethod``,
  ``property`` and its ``.setter``, ``dataclass``); a default argument is a literal or a dotted name
  whose value is data (not a function, class or module: capturing one before the guard swaps it was
  r16's lab 01 route); annotations are names, strings and subscripts; a class body holds only
  methods, literal or dotted-name assignments and its docstring, no ``metaclass=`` and none of the
  hooks that run at class creation (``__init_subclass__``, ``__set_name__``, ...);
* **graded code leaves libraries as they are** (:mod:`.lab_patches`): no assignment, ``setattr``
  or in-place method on anything reached from a name holding a library's object (``json.dumps = ...``,
  ``os.environ[...] = ...``, ``m = math; m.isclose = ...``, ``TABLE.clear()``), no import of a private
  module (``_signal``) and none by computed name (``__import__``, ``importlib``);
* **graded code does not read its own text back** (:mod:`.lab_text`).
"""

import ast
import builtins
import dataclasses
import functools

from .lab_patches import _foreign, _patches, value_problem  # noqa: F401 -- value_problem: lab_fresh's
from .lab_text import problem as source_read

HOOKS = frozenset({"__init_subclass__", "__set_name__", "__class_getitem__", "__prepare__", "__mro_entries__"})
_PROPERTY_PARTS = ("setter", "getter", "deleter")


def _decorators() -> tuple:
    found = [functools.lru_cache, functools.cache, staticmethod, classmethod, property, dataclasses.dataclass]
    try:
        import torch
        from torch.autograd.function import once_differentiable
        found += [torch.no_grad, torch.inference_mode, torch.enable_grad, once_differentiable]
    except ImportError:                    # noqa: PERF203 -- torch is always there in the course
        pass
    return tuple(found)


DECORATORS = _decorators()


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


_BUILD = frozenset({"float", "int", "range", "complex"})     # float("inf"), range(4): data, built in


def _literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Invert)):
        return _literal(node.operand)
    if isinstance(node, ast.BinOp) and not isinstance(node.op, ast.MatMult):
        return _literal(node.left) and _literal(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BUILD \
            and not node.keywords and all(_literal(a) for a in node.args):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k) for k in node.keys) and all(_literal(v) for v in node.values)
    return False


def _value(parts: list[str], ns: dict):
    obj = ns[parts[0]] if parts[0] in ns else getattr(builtins, parts[0])
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def _data(node: ast.AST, ns: dict) -> str | None:
    """Why a default value is not inert (None: a literal, or a dotted name whose value is data)."""
    if _literal(node):
        return None
    parts = _dotted(node)
    if parts is None:
        return f"`{ast.unparse(node)}` is computed when the definition is made"
    try:
        value = _value(parts, ns)
    except Exception:                      # noqa: BLE001 -- any failure: not something we can vouch for
        return f"`{ast.unparse(node)}` is not a name the notebook holds"
    if callable(value) or type(value).__name__ == "module":
        return f"`{ast.unparse(node)}` is a function, class or module held before grading starts"
    return None


def _annotation(node: ast.AST | None) -> bool:
    if node is None or isinstance(node, ast.Constant) or _dotted(node) is not None:
        return True
    if isinstance(node, ast.Subscript):
        return _annotation(node.value) and _annotation(node.slice)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation(node.left) and _annotation(node.right)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_annotation(e) for e in node.elts)
    return False


def _decorator(node: ast.AST, ns: dict, props: set) -> str | None:
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call else node
    parts = _dotted(target)
    text = ast.unparse(node)
    if parts is None or (call and not all(_literal(a) for a in [*call.args, *(k.value for k in call.keywords)])):
        return f"its decorator `@{text}` runs code when the definition is made"
    if len(parts) == 2 and parts[0] in props and parts[1] in _PROPERTY_PARTS and not call:
        return None
    try:
        value = _value(parts, ns)
    except Exception:                      # noqa: BLE001
        return f"its decorator `@{text}` is not one the grading process can rebuild"
    if not any(value is d for d in DECORATORS):
        return (f"its decorator `@{text}` runs your code or a library's when the definition is made (the "
                "grading process takes lru_cache, cache, no_grad, staticmethod, classmethod, property, dataclass)")
    return None


def _function(node, ns: dict, props: set) -> str | None:
    for d in node.decorator_list:
        if why := _decorator(d, ns, props):
            return why
    args = node.args
    for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
        if why := _data(default, ns):
            return f"its default {why}: write the value itself, or look it up inside the function"
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    if not all(_annotation(a.annotation) for a in every if a is not None) or not _annotation(node.returns):
        return "an annotation calls something when the definition is made: use names or strings"
    return None


def _class(node: ast.ClassDef, ns: dict) -> str | None:
    if node.keywords:
        return f"class {node.name} passes `{node.keywords[0].arg}=`: it runs code when the class is made"
    for d in node.decorator_list:
        if why := _decorator(d, ns, set()):
            return why
    if not all(_dotted(b) is not None for b in node.bases):
        return f"class {node.name}'s bases are computed when the class is made"
    for base in node.bases:
        if why := _base(base, ns):
            return f"class {node.name}: {why}"
    props: set = set()
    for i, stmt in enumerate(node.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if stmt.name in HOOKS:
                return f"class {node.name} defines {stmt.name}, which runs when a class is made"
            if stmt.name.startswith("__") and stmt.name.endswith("__") and stmt.name not in DUNDERS:
                return (f"class {node.name} defines {stmt.name}, which the grader would run outside the watched "
                        "call (when it prints, compares or drops your object): return plain values instead")
            if why := _function(stmt, ns, props):
                return f"{node.name}.{stmt.name}: {why}"
            if any(_dotted(d) == ["property"] for d in stmt.decorator_list):
                props.add(stmt.name)
        elif isinstance(stmt, ast.Pass) or (i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        elif isinstance(stmt, ast.AnnAssign) and _annotation(stmt.annotation) and \
                (stmt.value is None or _data(stmt.value, ns) is None):
            continue
        elif isinstance(stmt, ast.Assign) and _data(stmt.value, ns) is None:
            continue
        else:
            return (f"class {node.name}'s body runs `{ast.unparse(stmt)[:60]}` when the class is made: "
                    "keep to methods and plain values")
    return None


DUNDERS = frozenset({"__init__", "__post_init__", "__call__"})


def _base(node: ast.AST, ns: dict) -> str | None:
    """Why a base class would run code when the class is made or used (an ``Enum``'s metaclass calls
    the members' ``__init__``, review r17 of lab 02), or None: a plain class, an ``nn.Module``, an
    autograd ``Function``, or a class of the notebook's that passed these rules."""
    try:
        base = _value(_dotted(node), ns)
    except Exception:                      # noqa: BLE001
        return f"its base `{ast.unparse(node)}` is not a class the notebook holds"
    torch = __import__("sys").modules.get("torch")
    if not isinstance(base, type):
        return f"its base `{ast.unparse(node)}` is not a class"
    if torch is not None and issubclass(base, torch.Tensor):
        return (f"its base `{ast.unparse(node)}` makes tensors whose own code runs wherever the grader "
                "handles them (a tensor subclass): return plain tensors")
    function_meta = type(torch.autograd.Function) if torch is not None else type
    if type(base) not in (type, function_meta):
        return f"its base `{ast.unparse(node)}` has a metaclass ({type(base).__name__}) that runs code when a class is made"
    return None


def problem(source: str, ns: dict) -> str | None:
    """The first rule (module docstring) a carried definition's source breaks, or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return f"its source does not parse ({err.msg})"
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            why = _function(stmt, ns, set())
        elif isinstance(stmt, ast.ClassDef):
            why = _class(stmt, ns)
        elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Lambda):
            why = next((w for d in stmt.value.args.defaults if (w := _data(d, ns))), None)
        elif isinstance(stmt, ast.Assign) and (_dotted(stmt.value) is not None or _literal(stmt.value)):
            why = None                        # the alias lines the carrier writes
        else:
            why = f"it runs `{ast.unparse(stmt)[:60]}` when the definition is made"
        if why:
            return why
    return _nested(tree, ns) or _patches(tree, _foreign(tree, ns)) or source_read(tree, ns)


def _nested(tree: ast.Module, ns: dict) -> str | None:
    """Classes made inside a function (r21 of lab 02: a tensor subclass whose ``isnan`` lied): each
    base is a class the notebook holds that is no tensor, or a class this source defines; review r22
    of lab 02 got past a base looked up only in the notebook with a local alias (``T = torch.Tensor``)
    and with ``type(name, bases, namespace)``."""
    torch = __import__("sys").modules.get("torch")
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" \
                and len(node.args) + len(node.keywords) >= 3:
            return "`type(name, bases, namespace)` makes a class while your code runs: write a class statement"
        if not isinstance(node, ast.ClassDef) or node in tree.body:
            continue
        for base in node.bases:
            dotted = _dotted(base)
            if dotted is not None and len(dotted) == 1 and dotted[0] in own:
                continue
            try:
                value = _value(dotted, ns) if dotted else None
            except Exception:              # noqa: BLE001 -- a local name the notebook does not hold
                value = None
            if not isinstance(value, type):
                return (f"class {node.name} (inside a function): its base `{ast.unparse(base)}` is not a class "
                        "the notebook holds: name the class itself (or define yours at the top level)")
            if torch is not None and issubclass(value, torch.Tensor):
                return (f"class {node.name} (inside a function): its base `{ast.unparse(base)}` makes tensors "
                        "whose own code runs wherever the grader handles them (a tensor subclass): use plain tensors")
            if why := _base(base, ns):               # review r26 of lab 08: abc.ABC's metaclass, __del__
                return f"class {node.name} (inside a function): {why}"
        if node.keywords:
            return f"class {node.name} (inside a function) passes `{node.keywords[0].arg}=`: it runs code when made"
        hooked = next((f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and f.name.startswith("__") and f.name.endswith("__") and f.name not in DUNDERS), None)
        if hooked:
            return (f"class {node.name} (inside a function) defines {hooked}, which the grader would run outside "
                    "the watched call (when it prints, compares or drops your object): return plain values instead")
    return None
