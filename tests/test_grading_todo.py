"""A row says "still raises NotImplementedError" only for the learner's own ``raise`` (review r35 of
lab 04: a sparse op that the grader's watch does not support raised NotImplementedError inside an
otherwise written kernel, and the row said the function was not written)."""

import linecache

import pytest
import torch

from gpumem.course.grading import LearnerError, Todo, call

CELL = '''
def stub(x):
    raise NotImplementedError("write me")


def written(x):
    return torch.ops.aten._nnz.default(x)          # a strided tensor: torch has no kernel for it
'''


def test_only_the_learners_own_raise_is_todo():
    name = "<todo.ipynb cell 3>"
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(True), name)
    ns = {"torch": torch}
    exec(compile(CELL, name, "exec"), ns)
    with pytest.raises(Todo):
        call(ns["stub"], torch.ones(2, 2))
    with pytest.raises(LearnerError, match="an op inside your call raised NotImplementedError"):
        call(ns["written"], torch.ones(2, 2))


def test_a_stub_graded_apart_is_still_todo():
    """Where a lab grades (a fresh process), linecache holds empty lines for each cell (review r37 of
    lab 06); the stub's own raise is read from the grader's text, so a blank lab is todo, not error
    (the fresh-clone run's test_lab_file caught this)."""
    from gpumem.course import lab_bare, lab_fresh
    name = "<todo-apart.ipynb cell 4>"
    cell = "def stub(x):\n    raise NotImplementedError('TODO: your code here')\n"
    linecache.cache[name] = (len(cell), None, cell.splitlines(True), name)
    ns = {"__name__": "__main__"}
    exec(compile(cell, name, "exec"), ns)
    fresh = lab_fresh.rebuild(lab_fresh.payload("lab08_finetune_recipe", ns, show=False))
    built = fresh["stub"].__code__.co_filename
    assert not linecache.getline(built, 2).strip() and "raise" in lab_bare.CARRIED[built]
    with pytest.raises(Todo):
        call(fresh["stub"], 1)
