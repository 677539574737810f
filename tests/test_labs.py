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


def _lab02_with(source: str):
    """Grade lab 02 with the learner's function replaced by ``source`` (readable by inspect)."""
    ns = notebook_namespace(ROOT / "solutions" / "lab02_zero2_hooks.ipynb")
    name = f"<wrong {abs(hash(source))}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), ns)
    return chapters.check_lab("lab02_zero2_hooks", ns, show=False)


def test_lab02_names_the_first_wrong_gradient_shard():
    report = _lab02_with("""
def install_zero2_hooks(params, grad_shards):
    def ready(p, i):
        grad_shards[i] = zero.reduce_scatter_mean(p.grad) * 2    # forgot that the helper averages
        p.grad = None
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, i=i: ready(p, i))
""")
    assert not report.solved
    first = report.problems[0]
    assert "gradient shards" in first.case and "first wrong gradient shard: embed.weight on rank 0" in first.detail
    assert all(r.status == "ok" for r in report.rows if "peak" in r.case)   # the schedule was right


def test_lab02_zero1_peak_is_caught_even_with_the_right_weights():
    """Reducing only after backward (ZeRO-1's schedule) trains correctly but holds every gradient."""
    report = _lab02_with("""
def install_zero2_hooks(params, grad_shards):
    def at_the_end():
        for i, p in enumerate(params):
            grad_shards[i] = zero.reduce_scatter_mean(p.grad)
            p.grad = None
    def ready(p):
        if p is params[0]:                       # the embedding's gradient arrives last
            torch.autograd.Variable._execution_engine.queue_callback(at_the_end)
    for p in params:
        p.register_post_accumulate_grad_hook(ready)
""")
    peak_rows = [r for r in report.rows if "peak" in r.case]
    assert peak_rows and all(r.status == "wrong" for r in peak_rows)
    assert "every gradient at once" in peak_rows[0].detail and "embed.weight" in peak_rows[0].detail
    assert all(r.status == "ok" for r in report.rows if "peak" not in r.case)


def test_lab02_full_gradient_left_behind_is_named():
    report = _lab02_with("""
def install_zero2_hooks(params, grad_shards):
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, i=i: grad_shards.__setitem__(i, zero.reduce_scatter_mean(p.grad)))
""")
    shard_rows = [r for r in report.rows if "gradient shards" in r.case]
    assert shard_rows[0].status == "wrong" and "still has its full .grad" in shard_rows[0].detail
