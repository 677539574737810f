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
def test_solution_asserts_it_passes_its_check_and_the_lab_does_not(path):
    """Each solution passes its own check where a learner's notebook is graded: in a kernel, in a
    fresh process (gpumem.course.lab_fresh). nbval runs every solution in a kernel (make
    test-notebooks, make test-chapter), and the solution's check cell asserts ``report.solved``, so
    that run fails where the solution does not pass; grading each solution a second time here took
    minutes of the suite. The assert line is the solution's own: the lab made from it has none."""
    last = nbformat.read(path, as_version=4).cells[-1]
    assert last.cell_type == "code" and f'check_lab("{path.stem}", globals())' in last.source
    assert last.source.splitlines()[-1] == "assert report.solved, report.summary()  # solutions only"
    lab = nbformat.read(ROOT / "labs" / path.name, as_version=4).cells[-1]
    assert f'check_lab("{path.stem}", globals())' in lab.source and "assert" not in lab.source


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


def _lab02_with(source: str, monkeypatch=None, cases: tuple | None = None):
    """Grade lab 02 with the learner's function replaced by ``source`` (readable by inspect), alone:
    these tests read Part 1's rows only, so the solution's other cells (its sweep on 2 ranks took
    8-30 s) do not run and Part 2 reports its functions still to write. ``cases``: indices into
    ``labcheck.CASES``, the ones a test reads (each case is one more training on both ranks), and
    Part 2's lone reduce-scatters run one round; narrowing them is a change the grader's seal
    refuses in a learner's kernel, so it is off for that grading."""
    if cases is not None:
        from gpumem.chapters.ch02_zero import labcheck
        from gpumem.course import grader_seal
        monkeypatch.setattr(grader_seal, "refuse_if_changed", lambda lab: None)
        monkeypatch.setattr(labcheck, "CASES", tuple(labcheck.CASES[i] for i in cases))
        monkeypatch.setattr(labcheck, "LONE_ROUNDS", 1)
    import math

    import torch
    import torch.distributed as dist
    ns = {"math": math, "torch": torch, "dist": dist}
    name = f"<wrong {abs(hash(source))}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), ns)
    return chapters.check_lab("lab02_zero2_hooks", ns, show=False)


def _lab02_solution() -> str:
    """The solution's function, with its solution markers, as the learner's cell holds it."""
    cells = nbformat.read(ROOT / "solutions" / "lab02_zero2_hooks.ipynb", as_version=4).cells
    return next(c.source for c in cells if c.cell_type == "code" and "def install_zero2_hooks" in c.source)


def _lab02_variant(old: str, new: str, monkeypatch=None, cases: tuple | None = None):
    source = _lab02_solution()
    assert old in source, old
    return _lab02_with(source.replace(old, new), monkeypatch, cases)


def _rows(report, kind: str):
    return [r for r in report.rows if kind in r.case]


def test_lab02_names_the_first_wrong_gradient_shard(monkeypatch):
    report = _lab02_variant("mine.div_(world)", "mine", monkeypatch, (0,))     # summed, not averaged
    assert not report.solved
    first = report.problems[0]
    assert "gradient shards" in first.case and "first wrong gradient shard: embed.weight on rank 0" in first.detail
    assert all(r.status == "ok" for r in _rows(report, "peak") + _rows(report, "collectives"))


def test_lab02_zero1_peak_is_caught_even_with_the_right_weights(monkeypatch):
    """Reducing only after backward (ZeRO-1's schedule) trains correctly but holds every gradient."""
    report = _lab02_with("""
def install_zero2_hooks(params, grad_shards, bucket_bytes):
    world = dist.get_world_size()
    def at_the_end():
        grads = [p.grad for p in params]
        chunks = [math.ceil(g.numel() / world) for g in grads]
        rows = [torch.nn.functional.pad(g.reshape(-1), (0, c * world - g.numel())).view(world, c)
                for g, c in zip(grads, chunks)]
        send = torch.cat(rows, dim=1).reshape(-1)
        mine = torch.empty(sum(chunks))
        dist.reduce_scatter_tensor(mine, send)
        for i, shard in enumerate(mine.div_(world).split(chunks)):
            grad_shards[i] = shard
            params[i].grad = None
    def ready(p):
        if p is params[0]:                       # the embedding's gradient arrives last
            torch.autograd.Variable._execution_engine.queue_callback(at_the_end)
    for p in params:
        p.register_post_accumulate_grad_hook(ready)
""", monkeypatch, (0, 1, 2))
    peak = _rows(report, "peak")
    assert [r.status for r in peak][:3] == ["wrong", "wrong", "ok"]  # the third case's bucket holds everything
    assert "every gradient at once" in peak[0].detail and "embed.weight" in peak[0].detail
    assert all(r.status == "ok" for r in report.rows if r.function == "install_zero2_hooks" and "bf16" not in r.case
               and "peak" not in r.case and "async" not in r.case), report.summary()


def test_lab02_full_gradient_left_behind_is_named(monkeypatch):
    report = _lab02_variant("            p.grad = None\n", "            pass\n", monkeypatch, (0,))
    shard_rows = _rows(report, "gradient shards")
    assert shard_rows[0].status == "wrong" and "still has its full .grad" in shard_rows[0].detail


def test_lab02_last_partial_bucket_must_go_before_backward_returns(monkeypatch):
    """Leaving the last bucket for later (chapter 02 sends it in step()) leaves shards missing."""
    report = _lab02_variant("        if bucket:\n            flush()\n", "", monkeypatch, (0, 2))
    rows = _rows(report, "gradient shards")
    assert rows[0].status == "ok"                                    # bucket 0: nothing ever waits
    assert rows[1].status == "wrong" and "last, partly filled bucket" in rows[1].detail   # one bucket, never full


def test_lab02_bucket_ignored_is_too_many_collectives(monkeypatch):
    report = _lab02_variant(") >= bucket_bytes:", ") >= 0:", monkeypatch, (0, 1, 2, 3))   # every gradient alone
    calls = _rows(report, "collectives")
    assert [r.status for r in calls] == ["ok", "wrong", "wrong", "wrong"]
    assert "one collective per bucket" in calls[1].detail
    assert all(r.status == "ok" for r in _rows(report, "weights"))


def test_lab02_all_reduce_and_gpumem_helpers_are_refused(monkeypatch):
    report = _lab02_with("""
def install_zero2_hooks(params, grad_shards, bucket_bytes):
    from gpumem.runs import zero
    for i, p in enumerate(params):
        def ready(p, i=i):
            grad_shards[i] = zero.reduce_scatter_mean(p.grad)
            p.grad = None
        p.register_post_accumulate_grad_hook(ready)
""")
    assert report.problems and "gpumem.runs" in report.problems[0].detail
    report = _lab02_variant("        work = dist.reduce_scatter_single(mine, send, async_op=True)\n",
                            "        work = dist.all_reduce(send, async_op=True)\n        work.wait()\n"
                            "        mine.copy_(send.view(world, -1)[dist.get_rank()])\n", monkeypatch, (0, 1))
    calls = _rows(report, "collectives")
    assert calls and all(r.status == "wrong" and "all_reduce" in r.detail for r in calls)
    assert all(r.status == "ok" for r in _rows(report, "weights"))


def test_lab02_a_third_flat_copy_made_before_the_oldest_lands_is_measured(monkeypatch):
    """Review r21/r22: making the next bucket's flat copy, then landing the oldest, holds three
    copies for a moment; the meter sampled only at arrivals and passed it 27/27. It samples at each
    launch's first wait too, where the third copy is alive."""
    source = _lab02_solution()
    land = ("        if len(in_flight) == 2:              # each in flight holds its flat copy: two at most, so the\n"
            "            land(*in_flight.pop(0))          # oldest lands before this bucket's copy is made\n")
    send = "        send = torch.cat(rows, dim=1).reshape(-1)\n"
    assert land in source and send in source
    report = _lab02_with(source.replace(land, "").replace(send, send + land.replace("    #", "  #")), monkeypatch, (1, 3))
    peaks = [r for r in _rows(report, "peak") if r.status != "ok"]
    assert peaks and "flat copies" in peaks[0].detail, report.summary()
