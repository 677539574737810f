"""Lab 03 against review r35 (/work/notes/reviews21/r35/lab03.md).

* #1: a checkpoint whose backward takes the inputs' gradients with ``torch.autograd.grad`` leaves
  the layers' weights (captured by ``run``, not in ``args``) without ``.grad``: the row showed the
  tracer's ``AttributeError: 'NoneType' object has no attribute 'detach'``. Now
  ``recompute_trace.measure`` raises ``NoGradient`` naming the parameter, and the grader's row
  names it and asks which call reaches the weights, without naming the call.
* #3: cell 8 said thin-12's budget (450,000 B) "needs segments of different lengths", but five
  equal segments of two fit there (peak 382,216 B, the grader's own search's answer); the
  solution printed an uneven cut only because its search returns the first fit. Cell 9 now uses
  a thin-12 and a budget where every fitting placement of the fewest layers is one uneven cut in
  one order, so any correct solution prints it (this replaces review r30 #4's test in
  test_lab03_r29.py, which checked the solution's own output only).
"""

import itertools
import linecache
import re

import pytest
import torch

from conftest import ROOT
from gpumem.chapters.ch03_activation_checkpointing import labcheck, labplace
from gpumem.course.grading import Report
from gpumem.memory import models, recompute_trace
from gpumem.memory.recompute_plans import from_segments

from test_lab03_adversarial import GRAD, _solution_cells, restored

# The reviewer's first honest try (cell 3 of /tmp/r35/lab03/lab03_checkpoint_budget-honest_v1_autogradgrad.ipynb):
# right in every respect but one, its backward sends gradients into the inputs only.
AUTOGRAD_GRAD = r'''
class MyCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, *args):
        ctx.run = run
        ctx.rng = torch.get_rng_state()
        ctx.cuda_devs = sorted({a.get_device() for a in args if torch.is_tensor(a) and a.is_cuda})
        ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.cuda_devs]
        ctx.layout = [("t", None) if torch.is_tensor(a) else ("v", a) for a in args]
        ctx.save_for_backward(*(a for a in args if torch.is_tensor(a)))
        with torch.no_grad():
            return run(*args)

    @staticmethod
    def backward(ctx, *grad_outs):
        tensors = list(ctx.saved_tensors)
        rebuilt = []
        for kind, value in ctx.layout:
            if kind == "t":
                t = tensors.pop(0)
                rebuilt.append(t.detach().requires_grad_(t.requires_grad))
            else:
                rebuilt.append(value)
        with torch.random.fork_rng(devices=ctx.cuda_devs):
            torch.set_rng_state(ctx.rng)
            for d, s in zip(ctx.cuda_devs, ctx.cuda_rng):
                torch.cuda.set_rng_state(s, d)
            with torch.enable_grad():
                out = ctx.run(*rebuilt)
        out = out if isinstance(out, tuple) else (out,)
        pairs = [(o, g) for o, g in zip(out, grad_outs)
                 if torch.is_tensor(o) and o.requires_grad and g is not None]
        inputs = [a for a in rebuilt if torch.is_tensor(a) and a.requires_grad]
        grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs],
                                    allow_unused=True) if pairs and inputs else [None] * len(inputs)
        it = iter(grads)
        return (None, *(next(it) if torch.is_tensor(a) and a.requires_grad else None for a in rebuilt))


def checkpoint(run, *args):
    return MyCheckpoint.apply(run, *args)
'''


def _cell(source: str, name: str) -> dict:
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    ns = {"torch": torch}
    exec(compile(source, name, "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def grad_checkpoint():
    return _cell(AUTOGRAD_GRAD, "<r35 honest_v1 cell 3>")["checkpoint"]


def test_r35_measure_names_a_parameter_left_without_gradient(grad_checkpoint):
    """The library: a NoGradient (a UsageError) naming the first parameter, not an AttributeError."""
    with pytest.raises(recompute_trace.NoGradient, match=r"parameter layers\.0\.\S+ got no gradient") as err:
        recompute_trace.measure(GRAD, "full", grad_checkpoint, seq=32, micro_batch=2, keep_grads=True)
    assert err.value.name.startswith("layers.0.") and isinstance(err.value, ValueError)
    assert recompute_trace.measure(GRAD, "full", grad_checkpoint, seq=32, micro_batch=2).peak > 0  # no grads kept


def test_r35_autograd_grad_checkpoint_gets_a_row_naming_the_parameter(grad_checkpoint):
    """The grader's first checkpoint row is wrong (not an error), names the parameter and asks
    which call reaches the weights run uses, without naming the call."""
    report = Report("lab03")
    assert not labcheck._grade_model(report, grad_checkpoint, GRAD)
    row = report.rows[0]
    assert row.status == "wrong", report.summary()
    assert "AttributeError" not in row.detail and "parameter layers.0." in row.detail, row.detail
    assert "the weights run uses" in row.detail and "which call sends gradients into them?" in row.detail, row.detail
    assert not any(tell in row.detail for tell in ("autograd.backward", ".backward(", "autograd.grad")), row.detail
    assert restored()


def _demo(folder: str):
    """(cell 8's text, thin-12 and its budget) as cell 9 of ``folder``'s notebook states them."""
    import nbformat
    cells = nbformat.read(ROOT / folder / "lab03_checkpoint_budget.ipynb", as_version=4).cells
    code = next(c.source for c in cells if c.cell_type == "code" and "thin12 = " in c.source)
    text = cells[cells.index(next(c for c in cells if c.source == code)) - 1].source
    ns = {"models": models}
    exec(re.search(r"^\s*(thin12 = models\.ModelConfig\(.*\))", code, re.M).group(1).strip(), ns)
    budget = int(re.search(r"place_checkpoints\(\*\*example12, budget=([\d_]+)\)", code).group(1))
    return " ".join(text.split()), ns["thin12"], budget


@pytest.mark.parametrize("folder", ["solutions", "labs"])
def test_r35_the_thin12_budget_needs_segments_of_different_lengths(folder):
    """Cell 8's claim, checked with the grader's search on cell 9's own model and budget: the
    fewest layers that fit (``labplace.optimum``) fit in exactly one cut of lengths, uneven and
    longest first; every cut of them into equal lengths misses, and so does the fitting cut in
    the other order (the tracer's measured peak, not only the formula)."""
    text, cfg, budget = _demo(folder)
    assert f"a deeper, narrower model at {budget:,} B" in text and "only an uneven cut fits" in text, text
    numbers = labcheck.numbers(cfg, seq=32, batch=2)
    K, B, O, R = (numbers[k] for k in ("layer_bytes", "checkpoint_bytes", "other_bytes", "other_after_loss"))
    n, c = cfg.n_layers, labplace.optimum(cfg, budget, 32, 2)
    assert labplace.best_placements(cfg, 32, 2)[c][0] <= budget < min(p for f, (p, _) in
                                                                      labplace.best_placements(cfg, 32, 2).items() if f < c)

    def bottom(lengths):                  # any placement that fits, its plain layers moved on top fits too
        edges = list(itertools.accumulate(lengths, initial=0))
        return [list(range(a, b)) for a, b in zip(edges, edges[1:])]
    cuts = [[b - a for a, b in zip((0, *cut), (*cut, c))]
            for k in range(c) for cut in itertools.combinations(range(1, c), k)]
    fitting = [L for L in cuts if labplace.peak_of(bottom(L), n, K, B, O, R) <= budget]
    assert len(fitting) == 1 and len(set(fitting[0])) > 1 and fitting[0] == sorted(fitting[0], reverse=True), fitting
    assert all(labplace.peak_of(bottom([c // k] * k), n, K, B, O, R) > budget for k in range(1, c + 1) if c % k == 0)
    if folder == "labs":
        return
    ns = _solution_cells("def place_checkpoints", "def checkpoint(", "def estimate_peak")
    segments = ns["place_checkpoints"](**numbers, budget=budget)
    assert segments == bottom(fitting[0]), segments
    assert recompute_trace.measure(cfg, from_segments(segments, n), ns["checkpoint"], seq=32, micro_batch=2).peak <= budget
    other = bottom(fitting[0][::-1])
    assert recompute_trace.measure(cfg, from_segments(other, n), ns["checkpoint"], seq=32, micro_batch=2).peak > budget
