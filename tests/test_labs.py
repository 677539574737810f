"""Labs: generated from solutions and up to date; one grader for solution and lab alike."""

import json
import linecache

import nbformat
import pytest

from conftest import ROOT
from gpumem import chapters
from gpumem.course import labgen

SOLUTIONS = sorted((ROOT / "solutions").glob("lab*.ipynb"))


def notebook_namespace(path) -> dict:
    """Run a lab's code cells (all but the check cell) in a fresh namespace, as a kernel would,
    keeping each cell's source readable by ``inspect`` (as IPython does)."""
    ns: dict = {}
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "code" and "check_lab" not in cell.source:
            name = f"<{path.name} cell {i}>"
            linecache.cache[name] = (len(cell.source), None, cell.source.splitlines(True), name)
            exec(compile(cell.source, name, "exec"), ns)
    return ns


def test_labs_are_up_to_date():
    assert labgen.sync(ROOT, check=True) == [], "run `python -m gpumem.course.labgen` (or make labs)"
    assert labgen.main(["--check"]) == 0   # the command finds the checkout from its own path


def test_every_solution_has_a_checker():
    assert SOLUTIONS
    for path in SOLUTIONS:
        assert path.stem in chapters.lab_checks()


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_passes_its_check(path):
    report = chapters.check_lab(path.stem, notebook_namespace(path), show=False)
    assert report.solved, report.summary()


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_unsolved_lab_reports_what_is_left(path):
    lab = ROOT / "labs" / path.name
    ns = notebook_namespace(lab)          # must not crash: TODOs raise only when called
    report = chapters.check_lab(path.stem, ns, show=False)
    assert not report.solved and not report.problems
    assert report.todo and "still to do" in report.summary()


def test_wrong_answer_is_named_with_expected_and_got():
    ns = notebook_namespace(ROOT / "solutions" / "lab01_memory_calculator.ipynb")
    right = ns["model_state_bytes"]
    ns["model_state_bytes"] = lambda n_params, recipe, gpus=1, zero=0: {
        **right(n_params, recipe, gpus, zero), "optimizer": 4 * n_params}   # the note's mistake
    report = chapters.check_lab("lab01_memory_calculator", ns, show=False)
    wrong = [r for r in report.problems if r.function == "model_state_bytes"]
    assert wrong and all("expected" in r.detail and "got" in r.detail for r in wrong)
    assert any("mixed, 1 GPU" in r.case for r in wrong)
    assert not any("pure-bf16, 1 GPU" in r.case for r in wrong)   # 4 B is right for pure bf16


def test_strip_solutions_keeps_indentation_and_everything_else():
    src = "def f(x):\n    '''doc'''\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n\nprint(1)"
    out = labgen.strip_solutions(src)
    assert out == "def f(x):\n    '''doc'''\n    # YOUR CODE HERE\n    raise NotImplementedError(\"TODO: your code here\")\n\nprint(1)"
    with pytest.raises(ValueError):
        labgen.strip_solutions("### BEGIN SOLUTION\nx = 1\n")


def test_generated_lab_has_no_outputs_and_no_answers():
    for path in SOLUTIONS:
        lab = json.loads((ROOT / "labs" / path.name).read_text())
        text = json.dumps(lab)
        assert "BEGIN SOLUTION" not in text
        assert all(not c.get("outputs") for c in lab["cells"] if c["cell_type"] == "code")


def test_lab02_names_the_first_diverging_tensor():
    ns = notebook_namespace(ROOT / "solutions" / "lab02_sharded_adamw.ipynb")
    source = """
def sharded_adamw_step(params, m, v, t, lr, betas, eps, weight_decay):
    from gpumem.dist.zero import adamw_update, all_gather_full, my_shard, reduce_scatter_mean
    for i, p in enumerate(params):
        g = reduce_scatter_mean(p.grad) * 2          # forgot that the helper already averages
        w = my_shard(p)
        adamw_update(w, g, m[i], v[i], t, lr, betas, eps, weight_decay)
        p.copy_(all_gather_full(w, p.numel(), p.shape))
"""
    linecache.cache["<wrong>"] = (len(source), None, source.splitlines(True), "<wrong>")
    exec(compile(source, "<wrong>", "exec"), ns)
    report = chapters.check_lab("lab02_sharded_adamw", ns, show=False)
    assert not report.solved
    assert "first diverging tensor: embed.weight on rank 0" in report.problems[0].detail
