"""A learner's source as the grading process builds it: docstrings and comments emptied, every line
kept in its place (review r34 of lab 06: 138 layouts written as a helper's docstring and read back
with ``inspect.getdoc`` passed every row, 183 bytes of literal data by the table rule, which counts
docstrings only where code names ``__doc__``; comments read back with ``inspect.getsource`` are the
same route). The labs' prompts ask for functions, not text: what a docstring or a comment says stays
in the notebook, where the learner reads it, and never reaches the graded code.
"""

import ast
import inspect
import io
import tokenize

# cell name -> the text the grading process built it from (:func:`.lab_fresh.rebuild`), for the table
# rule's count of the source (:mod:`.literal_size`): kept apart from ``linecache``, which the learner's
# code can read and rewrite
CARRIED: dict[str, str] = {}


def _docstrings(tree: ast.AST) -> list[tuple[int, int, int, int]]:
    """(line, byte column, end line, end byte column) of every docstring: a string constant that is
    the first statement of a module, class or function."""
    spans = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                spans.append((first.lineno, first.col_offset, first.end_lineno, first.end_col_offset))
    return spans


def bare(source: str) -> str:
    """``source`` with each docstring replaced by ``""`` (its lines left empty) and each comment
    removed; every other character, and every line's number, as it was. A source that does not parse
    or tokenize is returned as it is (running it says why)."""
    try:
        tree = ast.parse(source)
        comments = [t.start for t in tokenize.generate_tokens(io.StringIO(source).readline)
                    if t.type == tokenize.COMMENT]
    except (SyntaxError, tokenize.TokenError, IndentationError, ValueError):
        return source
    lines = [line.encode() for line in source.splitlines(True)]
    for row, col in sorted(comments, reverse=True):             # character columns: cut the comment off
        text = lines[row - 1].decode()
        end = "\n" if text.endswith("\n") else ""
        lines[row - 1] = (text[:col].rstrip() + end).encode()
    for line, col, end_line, end_col in sorted(_docstrings(tree), reverse=True):   # byte columns
        head, tail = lines[line - 1][:col], lines[end_line - 1][end_col:]
        lines[line - 1:end_line] = [head + b'""' + (b"\n" if end_line > line else tail)] + \
            [b"\n"] * (end_line - line - 1) + ([tail] if end_line > line else [])
    return b"".join(lines).decode()


def masked(text: str) -> list[str]:
    """The lines ``linecache`` holds for a cell in the grading process: as many as the cell's, all
    empty (review r37 of lab 06: a table in an ``if False:`` block was read back through
    ``inspect.linecache.getlines``, past :mod:`.lab_text`'s names). Line numbers stay right; no text
    of the learner's is readable there. The grader reads it from :data:`CARRIED` (:func:`source`)."""
    return ["\n"] * len(text.splitlines())


def source(obj) -> str:
    """``inspect.getsource(obj)``, read from :data:`CARRIED` where the grading process built ``obj``
    (its ``linecache`` lines are :func:`masked`), else from ``linecache`` as usual."""
    code = getattr(inspect.unwrap(obj), "__code__", None)
    text = CARRIED.get(code.co_filename) if code is not None else None
    if text is None:
        return inspect.getsource(obj)
    return "".join(inspect.getblock(text.splitlines(True)[code.co_firstlineno - 1:]))
