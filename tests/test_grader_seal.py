"""A lab cannot be solved by changing the grader: the cheapest cheat a reviewer found (one line,
``Report.solved = property(lambda s: True)``, every lab "solved" unsolved) and its relatives."""

import functools
import re

import pytest
import torch

from gpumem import chapters
from gpumem.course import case_limits, grader_seal, grading


@pytest.fixture
def restore():
    saved = {k: v for k, v in vars(grading.Report).items()}
    saved_fns = {n: getattr(grading, n) for n in ("run_case", "grade", "Report")}
    saved_limit = case_limits.time_limit
    solved_code = grading.Report.__dict__["solved"].fget.__code__
    yield
    for key in list(vars(grading.Report)):
        if key not in saved:
            delattr(grading.Report, key)
    for key, value in saved.items():
        if key not in ("__dict__", "__weakref__"):
            setattr(grading.Report, key, value)
    saved["solved"].fget.__code__ = solved_code
    for name, value in saved_fns.items():
        setattr(grading, name, value)
    case_limits.time_limit = saved_limit
    assert grader_seal.changed() == []


def test_untouched_kernel_grades(restore):
    assert grader_seal.changed() == []
    report = chapters.check_lab("lab01_memory_calculator", {}, show=False)
    assert not report.solved and report.rows          # nothing written: todo rows, not solved


@pytest.mark.parametrize("patch", [
    lambda: setattr(grading.Report, "solved", property(lambda self: True)),
    lambda: setattr(grading.Report, "summary", lambda self: "all correct"),
    lambda: setattr(grading, "run_case", lambda *a, **k: None),
    lambda: setattr(grading, "Report", type("Report", (), {"solved": True})),
    lambda: setattr(grading.Report.__dict__["solved"].fget, "__code__", (lambda self: True).__code__),
    lambda: setattr(case_limits, "time_limit", lambda seconds: __import__("contextlib").nullcontext()),
], ids=["solved-property", "summary", "run_case", "Report-class", "solved-code", "time-limit"])
def test_a_changed_grader_grades_nothing(restore, patch):
    patch()
    with pytest.raises(grader_seal.GraderChanged, match="not graded: the grader was changed"):
        chapters.check_lab("lab01_memory_calculator", {}, show=False)


def test_a_change_made_while_graded_is_caught_after(restore):
    """The learner's function patches the grader while it runs: the check is refused at its end."""
    def rung_bytes(*args, **kwargs):
        grading.Report.solved = property(lambda self: True)
        return {}
    with pytest.raises(grader_seal.GraderChanged, match="Report.solved"):
        chapters.check_lab("lab05_offload_budget", {"rung_bytes": rung_bytes}, show=False)


def test_patching_a_chapters_lab_module_is_refused():
    """The reviewer's second lab01 cheat: ``labcheck._grade_states = ... Row(..., "ok")`` (the
    chapter's own grading functions, outside gpumem.course). Every function a lab module defines
    is compared with its file's code; rebinding a name, swapping ``__code__`` or a class is seen."""
    from gpumem.chapters.ch01_memory_anatomy import labcheck
    from gpumem.chapters.ch04_flash_attention import labguard
    assert grader_seal.changed() == []
    saved = labcheck._grade_states, labguard.Watch
    code = labcheck.check.__code__
    try:
        labcheck._grade_states = lambda report, *a: report.rows.append(grading.Row("x", "y", "ok"))
        assert grader_seal.changed() == [f"{labcheck.__name__}._grade_states"]
        labcheck._grade_states = saved[0]
        labcheck.check.__code__ = (lambda ns, show=True: None).__code__
        assert grader_seal.changed() == [f"{labcheck.__name__}.check"]
        labcheck.check.__code__ = code
        labguard.Watch = type("Watch", (), {})
        with pytest.raises(grader_seal.GraderChanged, match="labguard.Watch"):
            chapters.check_lab("lab01_memory_calculator", {}, show=False)
    finally:
        labcheck._grade_states, labguard.Watch = saved
        labcheck.check.__code__ = code
    assert grader_seal.changed() == []


def test_the_shared_copy_watch_is_sealed():
    """Review r7's one-line cheat: ``copy_watch.Prints.match = lambda self, code: ""`` blinded the
    copy checks of labs 04, 05 and 06 (copy_watch was not in the seal). A method replaced on the
    class, or a module function rebound, is now refused before grading."""
    from gpumem.course import copy_watch
    assert grader_seal.changed() == []
    match, held = copy_watch.Prints.match, copy_watch.held_copies
    try:
        copy_watch.Prints.match = lambda self, code: ""
        assert grader_seal.changed() == ["gpumem.course.copy_watch.Prints.match"]
        with pytest.raises(grader_seal.GraderChanged, match="copy_watch.Prints.match"):
            chapters.check_lab("lab04_online_softmax", {}, show=False)
        copy_watch.Prints.match = match
        copy_watch.held_copies = lambda prints, namespace, depth=2: ""
        assert grader_seal.changed() == ["gpumem.course.copy_watch.held_copies"]
    finally:
        copy_watch.Prints.match, copy_watch.held_copies = match, held
    assert grader_seal.changed() == []


@pytest.mark.parametrize("how", ["entry-zeroed", "registry-emptied", "cpu-attention", "wrapped-zero",
                                 "shape-wrapped-zero"])
def test_a_changed_flop_counter_grades_nothing(monkeypatch, how):
    """Review r13 of lab 03: every entry of torch's flop_registry set to ``lambda *a, **k: 0`` made
    the checkpoint labs' re-run cost 0 FLOPs (21/21). A changed registry, one emptied before gpumem
    was imported (its entries are checked against torch's file), or a changed CPU attention formula
    is refused before grading."""
    from torch.utils import flop_counter

    from gpumem.memory import flops
    if how == "entry-zeroed":
        monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.mm.default, lambda *a, **k: 0)
        said = "flop_registry[aten.mm"
    elif how in ("wrapped-zero", "shape-wrapped-zero"):      # review r15 of lab 03
        real = flop_counter.flop_registry[torch.ops.aten.mm]
        zero = functools.wraps(real)(lambda *a, **k: 0) if how == "wrapped-zero" else \
            flop_counter.shape_wrapper(lambda *a, **k: 0)
        monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.mm, zero)
        said = "flop_registry[aten.mm"
    elif how == "registry-emptied":
        monkeypatch.setattr(flop_counter, "flop_registry", {})
        assert grader_seal.counter_problem().endswith("flop_registry (emptied)")
        said = "flop_registry"
    else:
        key = next(iter(flops.CPU_ATTENTION))
        monkeypatch.setitem(flops.CPU_ATTENTION, key, lambda *a, **k: 0)
        said = "flops.CPU_ATTENTION["
    with pytest.raises(grader_seal.GraderChanged, match=re.escape(said)):
        chapters.check_lab("lab03_checkpoint_budget", {}, show=False)
