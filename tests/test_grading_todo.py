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
