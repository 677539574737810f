"""The grading process builds a learner's definitions with docstrings and comments emptied
(gpumem.course.lab_bare): review r34 of lab 06 kept 138 layouts in a helper's docstring, read them
with ``inspect.getdoc`` and passed 14/14 rows; comments read with ``inspect.getsource`` are the same
route. Code, line numbers and strings that are not docstrings stay as written."""

import ast
import inspect
import linecache

import pytest

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


TABLE = repr([{"tp": 2 ** (i % 4), "pp": 1 + i % 9, "zero": i % 4} for i in range(60)])     # 660 bytes by the rule
DEAD = {   # review r35 of lab 06: text the compiler drops, read back with inspect.getsource
    "a string statement after the first": f"def layouts():\n    pass\n    {TABLE!r}\n",
    "an if False block": f"def layouts():\n    if False:\n        t = {TABLE}\n    return None\n",
    "a local annotation": f"def layouts():\n    t: {TABLE!r} = 0\n    return t\n",
    "a class body's if False block": f"class Layouts:\n    if False:\n        t = {TABLE}\n    def get(self):\n        return 0\n",
}
READER = ("import ast\nimport inspect\nimport linecache\n\n\ndef choose_plan(model, gpus, gpu, seq, global_batch, inter_node=None,\n"
          "                host_per_node=None, one_node=False, without=()):\n"
          "    text = {read}\n"
          "    return [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)]\n")


@pytest.mark.parametrize("where", list(DEAD))
def test_review_r35_a_table_the_compiler_drops_is_counted_from_the_text(where):
    """Review r35 of lab 06: 138 layouts in a string statement that is not a docstring, read with
    inspect.getsource and ast, passed 14/14 rows at 225 bytes by the rule, which counted only what
    the compiled code holds; an ``if False:`` block and a local annotation were the same route. The
    rule now also counts the constants of the built text that the code does not hold: the table
    reaches the graded function whole, and is counted whole."""
    from gpumem.chapters.ch06_combining_strategies import lab06_table
    from gpumem.course import literal_size
    read = ("''.join(linecache.getlines(inspect.getfile(Layouts.get)))" if where.startswith("a class")
            else "inspect.getsource(layouts)")              # a class's getsource fails where it is graded
    cell = DEAD[where] + "\n\n" + READER.format(read=read)
    name = f"<dead.ipynb cell {list(DEAD).index(where) + 2}>"
    linecache.cache[name] = (len(cell), None, cell.splitlines(True), name)
    ns: dict = {"__name__": "__main__"}
    exec(compile(cell, name, "exec"), ns)
    fresh = lab_fresh.rebuild(lab_fresh.payload("lab06_choose_plan", ns, show=False))
    assert any("'tp'" in repr(v) or v == "tp" for v in ns["choose_plan"]("m", 8, "g", 1, 1))    # in the kernel
    assert not any("'tp'" in repr(v) or v == "tp" for v in fresh["choose_plan"]("m", 8, "g", 1, 1))  # r37: not here
    linecache.cache.pop(name)                       # rewriting linecache does not hide the built text
    chars, _ = lab06_table.measure(fresh["choose_plan"], fresh)
    assert chars >= 0.9 * literal_size._chars(ast.literal_eval(TABLE)) == 594, chars   # less what the code holds too
    assert "bytes of literal data" in lab06_table.problem(fresh["choose_plan"], fresh)


@pytest.mark.parametrize("body, refused", [
    ("import inspect\n    return inspect.getsource(layouts)", "inspect.getsource"),
    ("from inspect import getsourcelines as g\n    return g(layouts)", "inspect.getsourcelines"),
    ("import linecache\n    return linecache.getlines('<x>')", "linecache"),
    ("return LC.getlines('<x>')", "linecache"),
    ("import traceback\n    return traceback.extract_stack()[-1].line", "traceback.extract_stack"),
    ("import inspect as i\n    return i.stack()[0].code_context", "inspect.stack"),
    ("import warnings\n    return warnings.formatwarning('', UserWarning, 'x', 1)", "warnings.formatwarning"),
    ("import tokenize\n    return tokenize", "tokenize"),
    ("import inspect\n    return torch.stack([torch.ones(1)]), inspect.signature(layouts)", None),
])
def test_review_r36_graded_code_may_not_read_its_own_text(body, refused):
    """Review r36 of lab 06: a table spelt as an annotation's name, read back with getsource and ast,
    passed the size rule (13/14). Reading source text back is refused before the grading process
    starts (gpumem.course.lab_text through lab_vet); torch.stack and inspect.signature are not."""
    import linecache as lc
    from gpumem.course import lab_vet
    source = f"def choose_plan(model):\n    {body}\n"
    why = lab_vet.problem(source, {"LC": lc, "torch": __import__("torch")})
    if refused is None:
        assert why is None, why
    else:
        assert why and f"reads source text ({refused})" in why and why.startswith("line "), why


def test_review_r37_the_grading_process_holds_no_cell_text_in_linecache():
    """Review r37 of lab 06: past lab_text's names, ``inspect.linecache.getlines(inspect.getfile(f))``
    read a table kept in an ``if False:`` block back from the text the grading process had put in
    linecache: 14/14. linecache now holds as many empty lines (line numbers stay right); the text is
    the grader's alone (lab_bare.CARRIED), and lab_bare.source reads it back for lab 02's ranks."""
    from gpumem.course import lab_bare
    cell = "def layouts():\n    if False:\n        t = [('tp', 2), ('pp', 4)]\n    return 0\n"
    name = "<r37.ipynb cell 5>"
    linecache.cache[name] = (len(cell), None, cell.splitlines(True), name)
    ns: dict = {"__name__": "__main__"}
    exec(compile(cell, name, "exec"), ns)
    fresh = lab_fresh.rebuild(lab_fresh.payload("lab06_choose_plan", ns, show=False))
    lines = linecache.getlines(inspect.getfile(fresh["layouts"]))
    assert len(lines) == len(cell.splitlines()) and not "".join(lines).strip(), lines
    assert "('tp', 2)" in lab_bare.source(fresh["layouts"]) and lab_bare.source(fresh["layouts"]).startswith("def layouts")


@pytest.mark.parametrize("reader", [
    "from gpumem.course import lab_bare\n    return lab_bare.source(layouts)",
    "return lab_bare.CARRIED[layouts.__code__.co_filename]",
    "import gpumem.course.lab_bare as b\n    return b.source(layouts)",
])
def test_review_r38_graded_code_may_not_read_the_graders_copy_of_its_text(reader):
    """Review r38 of lab 06: a dead table read back through the grader's own copy of the text
    (lab_bare.source, lab_bare.CARRIED) passed 14/14. Reaching into gpumem.course is refused before the
    grading process starts (lab_text through lab_vet)."""
    from gpumem.course import lab_bare, lab_vet
    why = lab_vet.problem(f"def choose_plan(layouts):\n    {reader}\n", {"lab_bare": lab_bare})
    assert why and "reaches into the grader" in why and why.startswith("line 2"), why


def test_review_r38_a_dead_table_of_the_codes_own_values_counts_in_full():
    """Review r38 of lab 06 (r37 #2): a table in an ``if False:`` block made of values the live code
    holds once each cost only those values (394 B for 138 layouts). Text no reached code runs now
    counts every constant: here 80 rows of 6 values, each a value the code holds."""
    from gpumem.chapters.ch06_combining_strategies import lab06_table
    rows = ", ".join("('tp', 2, 'pp', 4, 'mb', 1)" for _ in range(80))
    cell = (f"def layouts():\n    if False:\n        t = [{rows}]\n    return 0\n\n\n"
            "def choose_plan(model):\n    return layouts(), ('tp', 2, 'pp', 4, 'mb', 1)\n")
    fresh = _rebuilt(cell, "<r38.ipynb cell 7>")
    chars, _ = lab06_table.measure(fresh["choose_plan"], fresh)
    by_hand = 80 * (2 + 1 + 2 + 1 + 2 + 1)          # each row: three 2-letter strings, three one-digit ints
    assert chars >= by_hand == 720, chars
    assert "480 constants in code that never runs (lines 3-3" in lab06_table.problem(fresh["choose_plan"], fresh)


def test_a_name_in_dead_code_still_counts_in_full():
    """The dead-text rule counts a dead region's constants; its names keep the name rule (r36: a table
    spelt as a name), here a 61-character attribute name in a function nothing reaches (no walked
    code holds the name, so the rule counts it in full, as before the dead-text rule)."""
    from gpumem.chapters.ch06_combining_strategies import lab06_table
    long = "t" + "x0" * 30
    cell = (f"def unused():\n    return layouts.{long}\n\n\ndef layouts():\n    return 0\n\n\n"
            "def choose_plan(model):\n    return layouts()\n")
    fresh = _rebuilt(cell, "<r39.ipynb cell 7>")
    chars, _ = lab06_table.measure(fresh["choose_plan"], fresh)
    assert chars >= len(long), chars


def _rebuilt(cell: str, name: str) -> dict:
    """``cell`` run in a kernel-like namespace under ``name``, then rebuilt as lab 06's grading process builds it."""
    linecache.cache[name] = (len(cell), None, cell.splitlines(True), name)
    ns: dict = {"__name__": "__main__"}
    exec(compile(cell, name, "exec"), ns)
    return lab_fresh.rebuild(lab_fresh.payload("lab06_choose_plan", ns, show=False))
