"""Lab 03 against review r29's findings (/work/notes/reviews21/r29/lab03.md)."""

import pytest
import torch

from gpumem.chapters.ch03_activation_checkpointing import labcases, labcheck
from gpumem.course.grading import Report

from test_lab03_adversarial import _exact, _solution_cells, restored

SEEDS = range(1000, 1020)


def _end_without_checkpoints(segments, n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss):
    """r29 #1: the end of the forward as plain layers and the rest of the step only (the segments'
    checkpoints forgotten there), every re-run right: 18/18 estimate rows on 24 of 40 draws."""
    plain = n_layers - sum(map(len, segments))
    reruns = _exact(segments, n_layers, layer_bytes, checkpoint_bytes, -10**12, other_after_loss)
    return max(plain * layer_bytes + other_bytes, reruns)


def _end_dropped(segments, n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss):
    """The known-open route: once a segment exists, only the re-runs (the end of the forward dropped)."""
    if not segments:
        return (n_layers * layer_bytes) + other_bytes
    return _exact(segments, n_layers, layer_bytes, checkpoint_bytes, -10**12, other_after_loss)


@pytest.mark.parametrize("wrong", [_end_without_checkpoints, _end_dropped], ids=["checkpoints-forgotten", "end-dropped"])
def test_r29_an_end_of_the_forward_without_the_checkpoints_fails_every_draw(wrong):
    """Each of 20 draws grades a placement whose peak is the end of the forward with a segment
    (the loss-heavy model's [[0], [1]]), so both wrong estimates fail a row on every draw, where
    the checkpoints-forgotten one passed every estimate row on 24 of 40 before; the hand count
    (``_exact``) passes all. The grader's rows on two draws, the formula on all twenty."""
    for seed in SEEDS:
        cases = labcases.draw(seed)["estimates"]
        bad = [(cfg.name, s) for cfg, s in cases if wrong(s, **labcheck.numbers(cfg)) != _exact(s, **labcheck.numbers(cfg))]
        assert bad, seed
    for seed in SEEDS[:2]:
        cases = labcases.draw(seed)["estimates"]
        report = Report("lab03")
        labcheck._grade_estimates(report, wrong, cases)
        assert report.rows[-1].status == "wrong", report.summary()
        assert "reached at the end of the forward" in report.rows[-1].detail, report.rows[-1].detail
        report = Report("lab03")
        labcheck._grade_estimates(report, _exact, cases)
        assert len(report.rows) == len(cases) and all(r.status == "ok" for r in report.rows), report.summary()


def test_r29_the_loss_heavy_model_is_an_estimate_case_with_the_end_as_its_peak():
    """Every layer alone and [[0], [1]] on the loss-heavy question's model; [[0], [1]]'s peak is the
    end of the forward, checkpoints included (the solution's estimate says so too)."""
    solution = _solution_cells("def estimate_peak")["estimate_peak"]
    for seed in SEEDS:
        drawn = labcases.draw(seed)
        cfg = drawn["questions"][1].cfg
        assert (cfg, [[i] for i in range(cfg.n_layers)]) in drawn["estimates"]
        assert (cfg, [[0], [1]]) in drawn["estimates"]
        want, at, end = labcheck._expected_peak(cfg, [[0], [1]])
        assert at == "the end of the forward" and want == end, seed
        assert solution([[0], [1]], **labcheck.numbers(cfg)) == want


# ---- r29 #6: labcases' closed form of balanced cuts, inlined into place_checkpoints ---------------

INLINED = r'''
def place_checkpoints(n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss, budget):
    # labcases._balanced_peak, inlined (the reviewer's cheat2): the first c layers, k balanced
    # segments, longer first
    K, B, O, R = layer_bytes, checkpoint_bytes, other_bytes, other_after_loss
    def peak(c, k, plain):
        if not c:
            return plain * K + O
        q, r = divmod(c, k)
        sizes = [q + 1] * r + [q] * (k - r)
        rerun = max(j * B + size * K for j, size in enumerate(sizes)) + 2 * B + R
        return max(plain * K + k * B + O, rerun), sizes
    for c in range(n_layers + 1):
        for k in range(1, max(c, 1) + 1):
            got = peak(c, k, n_layers - c)
            if not c:
                if got <= budget:
                    return []
                continue
            if got[0] <= budget:
                segs, i = [], 0
                for s in got[1]:
                    segs.append(list(range(i, i + s)))
                    i += s
                return segs
    return [[i] for i in range(n_layers)]
'''


def _pasted():
    """labcases._balanced_peak's source run under another name, called from a placement."""
    import inspect
    ns: dict = {}
    exec(compile(inspect.getsource(labcases._balanced_peak).replace("_balanced_peak", "cut_peak"), "<cell>", "exec"), ns)

    def place_checkpoints(n_layers, layer_bytes, checkpoint_bytes, other_bytes, other_after_loss, budget):
        n = (layer_bytes, checkpoint_bytes, other_bytes, other_after_loss)
        c, k = min(((c, k) for c in range(1, n_layers + 1) for k in range(1, c + 1)
                    if ns["cut_peak"](c, k, n_layers - c, *n) <= budget), default=(n_layers, n_layers))
        q, r = divmod(c, k)
        edges = [0]
        for z in [q + 1] * r + [q] * (k - r):
            edges.append(edges[-1] + z)
        return [list(range(a, b)) for a, b in zip(edges, edges[1:])]
    return place_checkpoints


def test_r29_an_inlined_copy_of_the_draws_closed_form_is_refused():
    """The reviewer's inlined copy of ``labcases._balanced_peak`` (a nested function, its constants
    from the enclosing one) passed 3/3 placement rows on a fresh draw; it and a pasted copy under
    another name are now refused as the grader's own answer (``labguard``: labcases' code is
    fingerprinted as labplace's is). The solution's place_checkpoints passes the same questions."""
    ns: dict = {}
    exec(compile(INLINED, "<cheat cell>", "exec"), ns)
    questions = labcases.draw(1000)["questions"]
    for place in (ns["place_checkpoints"], _pasted()):
        report = Report("lab03")
        assert labcheck._grade_placement(report, place, "scratch", questions[0]) == "wrong", report.summary()
        assert "a copy of the grader's own answer (labcases._balanced_peak)" in report.rows[0].detail, report.rows[0]
    solution = _solution_cells("def estimate_peak", "def place_checkpoints")["place_checkpoints"]
    for q in questions:
        assert labcheck._grade_placement(Report("lab03"), solution, "scratch", q) == "ok"


# ---- r29 #2: the chapter's Recompute, generalised, with no RNG handling gets the masks hint -------

class _Generalised(torch.autograd.Function):
    """The chapter's ``Recompute`` with non-tensor arguments and tuple outputs (the reviewer's first
    checkpoint): no random-number state saved or restored, no ``fork_rng``."""

    @staticmethod
    def forward(ctx, run, *args):
        ctx.run = run
        ctx.is_t = [torch.is_tensor(a) for a in args]
        ctx.other = [None if t else a for a, t in zip(args, ctx.is_t)]
        ctx.save_for_backward(*[a for a in args if torch.is_tensor(a)])
        with torch.no_grad():
            return run(*args)

    @staticmethod
    def backward(ctx, *grad_outs):
        it = iter([x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors])
        args = [next(it) if t else o for t, o in zip(ctx.is_t, ctx.other)]
        with torch.enable_grad():
            outs = ctx.run(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grad_outs) if o.requires_grad and g is not None]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, *[a.grad if torch.is_tensor(a) and a.requires_grad else None for a in args])


def test_r29_a_checkpoint_with_no_rng_handling_gets_the_masks_hint():
    """Its dropout row said only "gradients differ ... by up to 648": the replay run (the generator
    put back before backward) failed on the generator's state, not on gradients, so the MASKS hint
    never fired. The replay compares gradients only now."""
    from gpumem.chapters.ch03_activation_checkpointing import labvariants
    report = Report(labcheck.LAB)
    assert not labvariants.grade_variants(report, lambda run, *a: _Generalised.apply(run, *a))
    row = report.rows[-1]
    assert row.case == f"unseen case: {labvariants.DROPOUT}" and row.status == "wrong", report.summary()
    assert "gradients differ from plain autograd" in row.detail and labvariants.MASKS in row.detail, row.detail
    assert restored()


def test_r29_the_gpu_parts_model_is_described_with_its_own_vocabulary():
    """r29 #7: cell 16 called GPU_1B "Llama-3.2-1B's widths"; its vocabulary (32,000, untied) is not
    that model's (128,256, tied), and the lab says so, with the count read from the config."""
    import nbformat

    from conftest import ROOT
    from gpumem.memory.recompute_cuda import GPU_1B
    for folder in ("solutions", "labs"):
        cells = nbformat.read(ROOT / folder / "lab03_checkpoint_budget.ipynb", as_version=4).cells
        text = " ".join(next(c.source for c in cells if c.source.startswith("## 4 · Optional: on a GPU")).split())
        assert f"vocabulary of {GPU_1B.vocab:,}, untied" in text and "Llama-3.2-1B's widths" not in text, (folder, text)


def test_r29_the_re_runs_two_extra_tensors_are_stated_as_given():
    """r29 #4: cell 6 pointed to the chapter's paragraph that prints them, a hint that was in fact
    the term; it now gives ``2 * checkpoint_bytes`` plainly, as a measured detail."""
    import nbformat

    from conftest import ROOT
    for folder in ("solutions", "labs"):
        cells = nbformat.read(ROOT / folder / "lab03_checkpoint_budget.ipynb", as_version=4).cells
        text = " ".join(next(c.source for c in cells if c.source.startswith("## 2 · When is memory held?")).split())
        assert "`2 * checkpoint_bytes`, given here because it is a measured detail" in text, (folder, text)
