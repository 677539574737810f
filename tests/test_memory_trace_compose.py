"""The composed trace (``tracing.trace_fast``) equals the full trace, byte for byte and moment for
moment, over a grid: both model widths (Llama-3-8B and 70B), every recipe with every AdamW path it
accepts, every checkpoint policy and every attention kernel, even and odd depths.

The grid is a covering design, not the full product (which would take many minutes): each of the
8 (recipe, AdamW) pairs meets 3 policies, all 3 kernels and both widths, each policy meets every
kernel and both widths. Depths are 10 and 11, the shallowest that leave the composition something
to extrapolate (its probes are 4, 6, 8 or 5, 7, 9 layers). The full 70B pure-bf16 fused case,
where the moment of the peak moves between the probes' depths and the full depth, is traced whole.
"""

import json

import pytest

from conftest import run_cli
from gpumem.memory import models, tracer, tracing
from gpumem.memory.accounting import RECIPES
from gpumem.memory.policies import ADAMW_IMPLS, KERNELS, POLICIES

# torch.optim.AdamW's three paths run in pure bf16 and fp32; the mixed recipes use the course's
# per-tensor MasterWeightAdamW (for-loop only)
PAIRS = [(r, a) for r in RECIPES for a in (ADAMW_IMPLS if r in ("pure-bf16", "fp32") else ("for-loop",))]
GRID = [(("llama-3-8b", "llama-3-70b")[(j + j // 8) % 2], *PAIRS[j % 8], POLICIES[j % 5],
         KERNELS[(j // 8) % 3], 10 + (j // 3) % 2) for j in range(24)]


def _same(a: tracing.Trace, b: tracing.Trace) -> dict:
    skip = {"seconds": 0, "method": ""}
    return {k: (v, b.as_dict()[k]) for k, v in (a.as_dict() | skip).items() if v != (b.as_dict() | skip)[k]}


def test_the_grid_covers_every_pair():
    assert len(PAIRS) == 8 and len(set(GRID)) == len(GRID)
    for model, recipe, adamw, _, _, _ in GRID:   # each (recipe, AdamW) pair: 3 policies, 3 kernels, 2 widths
        rows = [g for g in GRID if g[1:3] == (recipe, adamw)]
        assert len({g[3] for g in rows}) == 3 and len({g[4] for g in rows}) == 3
        assert len({g[0] for g in rows}) == 2
    for policy in POLICIES:
        rows = [g for g in GRID if g[3] == policy]
        assert {g[4] for g in rows} == set(KERNELS) and len({g[0] for g in rows}) == 2
    assert {g[5] % 2 for g in GRID} == {0, 1}


@pytest.mark.parametrize("model, recipe, adamw, policy, kernel, depth", GRID)
def test_composed_equals_full(model, recipe, adamw, policy, kernel, depth):
    cfg = models.with_layers(models.get(model), depth)
    full = tracing.trace_step(cfg, recipe, kernel, policy, 256, adamw=adamw)
    fast = tracing.trace_fast(cfg, recipe, kernel, policy, 256, adamw=adamw)
    assert fast.method == "composed"
    assert not _same(fast, full)


def test_composed_70b_fused_follows_the_moving_peak():
    """Pure bf16, fused AdamW (no optimizer workspace): at 6 layers the peak is at the start of
    backward, at 80 layers at its end, once every gradient exists. Before the fix the composition
    extrapolated the start of backward: 538.6 GB, less than the 8 B/param of states alive then."""
    full = tracing.trace_step("llama-3-70b", "pure-bf16", seq=4096, adamw="fused")
    fast = tracing.trace_fast("llama-3-70b", "pure-bf16", seq=4096, adamw="fused")
    assert fast.method == "composed" and not _same(fast, full)
    n = models.get("llama-3-70b").n_params()
    states = (2 + 2 + 2 + 2) * n        # bf16 weights, gradients and both Adam moments (hand count)
    assert fast.total_peak >= states
    assert str(fast.total_peak_moment) == "backward embed"
    shallow = tracing.trace_step(models.with_layers(models.get("llama-3-70b"), 4), "pure-bf16",
                                 seq=4096, adamw="fused")
    assert shallow.total_peak_moment.module != "embed"   # the moment really moves with depth


def test_composed_trace_runs_three_shallow_probes(monkeypatch):
    """What makes a 70B trace fast: 4 + 6 + 8 layers traced, not 80 (no wall-clock assertion)."""
    depths, real = [], tracer.trace_step

    def counting(cfg, *args, **kwargs):
        depths.append(cfg.n_layers)
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(tracer, "trace_step", counting)
    tr = tracing.trace_fast("llama-3-70b", "mixed", seq=4096)
    assert tr.method == "composed" and depths == [4, 6, 8]
    assert sum(depths) < models.get("llama-3-70b").n_layers / 4


def test_70b_trace_from_the_command_line():
    proc = run_cli("trace", "--model", "llama-3-70b", "--seq", "4096", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    n = models.get("llama-3-70b").n_params()
    assert data["method"] == "composed"
    assert data["peaks"]["params"] == 2 * n and data["peaks"]["optimizer"] == 12 * n
    assert data["total_peak"] < sum(data["peaks"].values())   # grads are born as activations die
