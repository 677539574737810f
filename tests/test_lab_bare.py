"""The grading process builds a learner's definitions with docstrings and comments emptied
(gpumem.course.lab_bare): review r34 of lab 06 kept 138 layouts in a helper's docstring, read them
with ``inspect.getdoc`` and passed 14/14 rows; comments read with ``inspect.getsource`` are the same
route. Code, line numbers and strings that are not docstrings stay as written."""

import inspect
import linecache

from gpumem.course import lab_fresh
from gpumem.course.lab_bare import bare

CELL = ('import ast\nimport inspect\n\n\ndef layouts():\n    """[{\'tp\': 2, \'pp\': 4}, {\'tp\': 8, \'pp\': 1}]"""\n\n\n'
        "def notes():\n    # [{'tp': 4, 'pp': 2}]\n    return 0\n\n\n"
        "def pool():  # a comment after the signature\n"
        "    kept = ast.literal_eval(inspect.getdoc(layouts) or '[]')\n"
        "    noted = [l.strip('# ') for l in inspect.getsource(notes).splitlines() if l.strip().startswith('#')]\n"
        "    return kept, noted, '# a string, not a comment', \"\"\"a string, not a docstring\"\"\"\n")


def test_bare_empties_docstrings_and_comments_and_keeps_every_line():
    out = bare(CELL)
    assert len(out.splitlines()) == len(CELL.splitlines())
    assert "'tp': 2" not in out and "'tp': 4" not in out and "a comment after" not in out
    assert "'# a string, not a comment'" in out and '"""a string, not a docstring"""' in out
    assert bare("def broken(:\n    pass\n") == "def broken(:\n    pass\n"       # running it says why


def test_the_grading_process_reads_no_table_from_a_docstring_or_a_comment():
    name = "<bare.ipynb cell 1>"
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(True), name)
    ns: dict = {}
    exec(compile(CELL, name, "exec"), ns)
    assert ns["pool"]()[:2] == ([{"tp": 2, "pp": 4}, {"tp": 8, "pp": 1}], ["[{'tp': 4, 'pp': 2}]"])  # in the kernel
    fresh = lab_fresh.rebuild(lab_fresh.payload("lab06_choose_plan", ns, show=False))
    assert fresh["pool"]() == ([], [], "# a string, not a comment", "a string, not a docstring")
    assert fresh["pool"].__code__.co_firstlineno == ns["pool"].__code__.co_firstlineno
    assert "#" not in inspect.getsource(fresh["notes"])
