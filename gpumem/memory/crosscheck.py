"""Formula vs fake-tensor trace vs real measurement, as rows a notebook or a test can use."""

import itertools

from .. import units
from . import models, tracing
from .activations import activations
from .estimate import estimate
from .policies import KERNELS, POLICIES


def formula_vs_trace(model: str, seq: int, kernels=KERNELS, policies=POLICIES,
                     recipe: str = "mixed", micro_batch: int = 1) -> list[dict]:
    """Activation peak and model states: formula and composed trace, per kernel and policy."""
    cfg = models.get(model)
    rows = []
    for kernel, policy in itertools.product(kernels, policies):
        tr = tracing.trace_fast(cfg, recipe, kernel, policy, seq, micro_batch)
        est = estimate(model=model, recipe=recipe, seq=seq, micro_batch=micro_batch,
                       checkpoint=policy, attention=kernel)
        formula = est.as_dict()["per_gpu"]
        rows.append({"kernel": kernel, "policy": policy,
                     "formula": formula["activations"], "trace": tr.peaks["activations"],
                     "states_equal": all(formula[k] == tr.peaks[k] for k in ("params", "grads", "optimizer")),
                     "moment": str(tr.peak_moments["activations"])})
    return rows


def render(rows: list[dict]) -> str:
    """The rows of :func:`formula_vs_trace` as a text table, with formula minus trace in bytes."""
    lines = [f"{'kernel':7s} {'checkpoint':12s} {'formula':>12s} {'trace':>12s} {'diff':>8s}  "
             f"states  activation peak at"]
    for r in rows:
        diff = r["formula"] - r["trace"]
        lines.append(f"{r['kernel']:7s} {r['policy']:12s} {units.fmt(r['formula']):>12s} "
                     f"{units.fmt(r['trace']):>12s} {diff:>+7,d}B  {'equal' if r['states_equal'] else 'DIFFER':6s}  "
                     f"{r['moment']}")
    return "\n".join(lines)
