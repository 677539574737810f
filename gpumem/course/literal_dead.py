"""What a learner's cell text holds that no reached code runs (:func:`dead_nodes`), for the table
rule (:mod:`.literal_size`), which counts its constants in full, each occurrence.

Review r38 of lab 06: a table of 138 layouts in an ``if False:`` block, made of values the live code
holds once each, passed every row. The grading process keeps the cells' text for its own reads
(:data:`.lab_bare.CARRIED`), and graded code can read it back; the table rule had counted only the
values the code does not hold, so the table measured 394 B. Text that never runs is now charged in
full, so reading it back gains nothing, whatever the route.
"""

import ast
import dis
import types


def all_codes(codes: list) -> list:
    """``codes`` and every code object nested in their constants."""
    out, todo = [], list(codes)
    while todo:
        code = todo.pop()
        out.append(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return out


def _folded(expr) -> tuple[bool, object]:
    """(True, value) where the compiler folds ``expr`` to one constant (``False``, ``1 - 1``, ``not
    True``, ``__debug__``, a tuple of constants), else (False, None)."""
    try:
        code = compile(ast.Expression(body=expr), "<expr>", "eval")
    except (SyntaxError, ValueError, TypeError):
        return False, None
    ops = [i for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP")]
    if [i.opname for i in ops] != ["LOAD_CONST", "RETURN_VALUE"]:
        return False, None
    return True, ops[0].argval


def _false(test) -> bool | None:
    """Whether an ``if``/``while`` test is falsy, where the compiler folds it to a constant (review r39
    #3 of lab 06: ``if 1 - 1:`` had been read as live), else None."""
    folded, value = _folded(test)
    return (not value) if folded else None


def _docstring(node, field: str, i: int, stmt) -> bool:
    return (i == 0 and field == "body" and isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                               ast.AsyncFunctionDef))
            and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str))


def dead_nodes(tree, filename: str, reached: set, classes: set) -> list:
    """Every node of the text that no reached code runs, its constants then counted in full, each
    occurrence (review r38 of lab 06: a table of 138 layouts in an ``if False:`` block, made of values
    the live code holds once each, read back from the grading process's copy of the text, measured 394 B
    when only values the code does not hold were counted): an expression statement the compiler
    folds to a constant, not a docstring (a string, or a tuple of the code's own values, anywhere),
    the branch a constant test never takes, a local variable's annotation, what follows a return,
    raise, break or continue in its block, a function no reached code object
    is (by name and first line), and a class the code does not reach."""
    out, gone = [], set()

    def drop(node):
        for n in ast.walk(node):
            if id(n) not in gone:
                gone.add(id(n))
                out.append(n)

    def visit(node, in_function: bool, in_class: bool = False):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            name = "<lambda>" if isinstance(node, ast.Lambda) else node.name
            if not in_class and (filename, name, first) not in reached and (filename, name, node.lineno) not in reached:
                return drop(node)          # a reached class's methods count as reached (properties, ...)
            in_function = True
        elif isinstance(node, ast.ClassDef) and node.name not in classes:
            return drop(node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            if isinstance(node, (ast.If, ast.While)) and _false(node.test) == (field == "body"):
                for stmt in block:
                    drop(stmt)
                continue
            ended = False
            for i, stmt in enumerate(block):      # an expression statement the compiler folds: dropped
                if ended or (isinstance(stmt, ast.Expr) and not _docstring(node, field, i, stmt)
                             and _folded(stmt.value)[0]):
                    drop(stmt)
                    continue
                ended = isinstance(stmt, (ast.Return, ast.Raise, ast.Break, ast.Continue))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.AnnAssign) and in_function:
                drop(child.annotation)
            if id(child) not in gone:
                visit(child, in_function, isinstance(node, ast.ClassDef))
    visit(tree, False)
    return out
