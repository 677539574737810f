"""The table rule's dead text (gpumem.course.literal_dead): each kind of text no reached code runs is
found, and live code is not (a hand-written cell of each kind; review r38 of lab 06)."""

import ast

from gpumem.course.literal_dead import dead_nodes

CELL = '''def live(x):
    """doc"""
    if False:
        T = [1, 2, 3]
    "a string statement"
    y: "an annotation" = 4
    if x:
        return 5
        z = 6
    while 0:
        w = 7
    return x + 8


def unreached():
    return [9, 10]


class Kept:
    @property
    def p(self):
        return 11


class Gone:
    k = 12
'''


def _consts(nodes) -> set:
    return {n.value for n in nodes if isinstance(n, ast.Constant)}


def test_each_kind_of_dead_text_is_found_and_live_code_is_not():
    ns: dict = {}
    exec(compile(CELL, "<cell>", "exec"), ns)
    reached = {("<cell>", "live", ns["live"].__code__.co_firstlineno)}
    dead = _consts(dead_nodes(ast.parse(CELL), "<cell>", reached, {"Kept"}))
    assert dead == {1, 2, 3, "a string statement", "an annotation", 6, 7, 9, 10, 12}, dead
    # live: the docstring, 4 (the annotated value), 5, 8, and the reached class's property (11)


def test_an_if_true_keeps_its_body_and_drops_its_else():
    cell = "def f():\n    if True:\n        return 1\n    else:\n        return 2\n"
    ns: dict = {}
    exec(compile(cell, "<c>", "exec"), ns)
    dead = dead_nodes(ast.parse(cell), "<c>", {("<c>", "f", 1)}, set())
    assert _consts(dead) == {2}


def test_a_test_the_compiler_folds_is_read_as_the_compiler_reads_it():
    """Review r39 #3 of lab 06: ``if 1 - 1:`` hid a table the rule read as live (438 B, against 12,773 B
    under ``if False:``). A test is dead where the compiled test is one constant; a name is not."""
    cell = ("def f(x):\n    if 1 - 1:\n        t = [1, 2]\n    while 2 * 0:\n        u = 3\n"
            "    if not __debug__:\n        w = 4\n    if x:\n        return 5\n    return 6\n")
    ns: dict = {}
    exec(compile(cell, "<c>", "exec"), ns)
    dead = dead_nodes(ast.parse(cell), "<c>", {("<c>", "f", 1)}, set())
    assert _consts(dead) == {1, 2, 3, 4}, _consts(dead)


def test_a_folded_expression_statement_is_dead_wherever_it_stands():
    """A tuple of constants as an expression statement (the compiler folds and drops it), first in an
    ``if`` body or not, is dead; a docstring is not counted here (the grading process empties it)."""
    cell = ('def f(x):\n    """doc"""\n    if x:\n        ("tp", 2, "pp", 4)\n        return 1\n'
            '    (5, 6)\n    return 7\n')
    ns: dict = {}
    exec(compile(cell, "<c>", "exec"), ns)
    dead = dead_nodes(ast.parse(cell), "<c>", {("<c>", "f", 1)}, set())
    assert _consts(dead) == {"tp", 2, "pp", 4, 5, 6}, _consts(dead)
