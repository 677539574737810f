"""The time engine against published runs: each run's own layout priced by ``plan --layout``.

For every run of :data:`gpumem.timing.published.RUNS` (papers and public benchmark tables, with
their sources), :func:`rows` prices the layout that run used with the planner's cost model
(:func:`gpumem.planner.evaluate.evaluate`, the same functions that rank the search) and compares
the predicted tokens/s with the published figure. One set of constants serves every case: the
planner's defaults (:data:`gpumem.timing.compute.KERNEL_SHARE` of the GPU's dense peak while
computing, NCCL's achieved bandwidths, the node types of :mod:`gpumem.timing.hardware`). Nothing
is tuned per case. The share itself was set once, on one run (:data:`CALIBRATION`); every other
ratio is a prediction.

Where a source leaves a layout field out, :data:`FILL` states what is priced instead, and the
row's ``assumed`` says so. Runs the cost model cannot price are listed with the reason
(:data:`OUT_OF_SCOPE`): FP8 linears, and FSDP with pipeline stages (no planned framework runs it).
A case whose ratio falls outside 0.85-1.15 carries the term the model gets wrong and why
(:data:`MISSES`); ``tests/test_timing_validation.py`` holds every ratio to its band.
"""

from dataclasses import dataclass

from ..timing.compute import KERNEL_SHARE
from ..timing.published import RUNS, Run
from .evaluate import evaluate

BAND = (0.85, 1.15)
CALIBRATION = "nemo-llama-3-8b-8"
# What is priced where the source is silent (each use is named in the row's ``assumed``).
FILL = {"zero": (1, "optimizer sharded (Megatron's distributed optimizer, NeMo's default)"),
        "ckpt": ("none", "no activation recomputation"),
        "vp": (1, "plain 1F1B (no virtual stages stated)"),
        "mb": (1, "micro-batch 1")}
CKPT = {"selective-op": ("selective", "torchtitan's per-op SAC priced as the course's 'selective' "
                                      "(it also re-runs every other matmul: optimistic)")}
OUT_OF_SCOPE = {
    "torchtitan-70b-h100-256": "FP8 linears with torch.compile: the cost model prices bf16 matmuls",
    "torchtitan-405b-h100-512": "FP8, and FSDP2 with pipeline stages: no framework the planner emits "
                                "runs ZeRO-3 with pp > 1 (DeepSpeed refuses it)",
}
_H100_500W = ("compute: Grand Teton H100s at 500 W with HBM2e (torchtitan's footnote), priced at the "
              "700 W H100 SXM's 989 TFLOP/s; their clocks under the power cap are not published")
MISSES = {
    "megatron-gpt-145.6b-1536": "pipeline bubble + tensor-parallel all-reduces: Table 1 gives no "
                                "micro-batch or schedule; priced at mb=1 with plain 1F1B",
    "megatron-gpt-1008b-3072": "pipeline bubble: p=64 priced as plain 1F1B at mb=1 (Table 1 gives "
                               "neither schedule nor micro-batch); the paper's own rows reach 52 % of peak",
    "torchtitan-405b-h100-128": _H100_500W,
    "torchtitan-8b-h100-8": _H100_500W,
    "torchtitan-8b-h100-128": _H100_500W,
    "llama3-405b-8192-cp1": "pipeline bubble: 16 stages with 1F1B priced; Meta's tuned interleaved "
                            "schedule (paper s. 3.3.2) has virtual stages Table 4 does not give",
    "llama3-405b-16384-cp1": "pipeline bubble: 16 stages and only 16 micro-batches per replica with "
                             "1F1B priced (bubble ~ compute); Meta's interleaved schedule is not in "
                             "Table 4",
    "llama3-405b-16384-cp16": "pipeline bubble as above (16 stages, 16 micro-batches, 1F1B priced); the "
                              "ring attention over 16 ranks at 131,072 tokens is hidden behind attention",
}


@dataclass(frozen=True)
class Row:
    """One published run priced: its ``--layout``, the published and predicted tokens/s, the
    ratio (predicted / published), whether the layout fits, its rank among the planner's fitting
    plans and the top plan's label; ``assumed``: the fields filled in; ``miss``: why it misses."""
    run: Run
    layout: str
    assumed: tuple[str, ...]
    published: float
    predicted: float | None
    ratio: float | None
    fits: bool | None
    rank: int | None
    fitting: int | None
    best: str | None
    vs_best: float | None
    bound: str | None
    note: str


def layout_arg(run: Run) -> tuple[str, tuple[str, ...]]:
    """``run``'s layout as ``plan --layout`` takes it, and the fields filled in by :data:`FILL`."""
    lay, assumed = run.layout, []
    fields = {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp}
    for key, value in (("zero", lay.zero), ("ckpt", lay.ckpt), ("vp", lay.vp), ("mb", lay.micro_batch)):
        if value is None:
            value, why = FILL[key]
            assumed.append(f"{key}={value}: {why}")
        elif key == "ckpt" and value in CKPT:
            value, why = CKPT[value]
            assumed.append(f"ckpt={value}: {why}")
        fields[key] = value
    return ",".join(f"{k}={v}" for k, v in fields.items()), tuple(assumed)


def price(run: Run) -> Row:
    """``run`` priced by the planner's defaults (see the module)."""
    arg, assumed = layout_arg(run)
    published = run.derived_tokens_per_s()
    if run.key in OUT_OF_SCOPE:
        return Row(run, arg, assumed, published, None, None, None, None, None, None, None, None,
                   OUT_OF_SCOPE[run.key])
    res = evaluate(run.model.config(), run.gpus, arg, gpu=run.gpu, seq=run.seq, global_batch=run.global_batch)
    d = res.as_dict()
    ratio = res.plan.tokens_per_s / published
    note = "calibration (sets KERNEL_SHARE)" if run.key == CALIBRATION else MISSES.get(run.key, "")
    return Row(run, arg, assumed, published, res.plan.tokens_per_s, ratio, res.fits, res.rank, res.fitting,
               d["best"]["label"] if d["best"] else None, d["vs_best"], res.plan.time["bound"], note)


def rows() -> list[Row]:
    """Every published run, priced (about 15 s: each evaluation runs the search to rank)."""
    return [price(r) for r in RUNS]


def table(priced: list[Row] | None = None) -> str:
    """The validation table (under 100 columns): case, GPUs, published and predicted tokens/s,
    ratio, whether it fits the course's 80 GB budget, its rank among the planner's plans."""
    priced = priced if priced is not None else rows()
    lines = [f"{'case':<26}{'GPUs':>6}{'published':>12}{'predicted':>12}{'ratio':>7}  {'fits':<5}{'rank':>9}  note",
             f"{'':<26}{'':>6}{'tokens/s':>12}{'tokens/s':>12}"]
    for r in priced:
        if r.predicted is None:
            lines.append(f"{r.run.key:<26}{r.run.gpus:>6}{r.published:>12,.0f}{'-':>12}{'-':>7}  {'-':<5}{'-':>9}  "
                         "out of scope")
            continue
        rank = f"{r.rank}/{r.fitting}" if r.rank else "-"
        flag = "" if BAND[0] <= r.ratio <= BAND[1] else "  miss"
        if r.run.key == CALIBRATION:
            flag = "  calibration"
        lines.append(f"{r.run.key:<26}{r.run.gpus:>6}{r.published:>12,.0f}{r.predicted:>12,.0f}{r.ratio:>7.2f}  "
                     f"{'yes' if r.fits else 'no':<5}{rank:>9}{flag}")
    return "\n".join(lines)


def summary(priced: list[Row]) -> str:
    """How many priced cases fall in :data:`BAND`, and the share used."""
    scored = [r for r in priced if r.ratio is not None and r.run.key != CALIBRATION]
    inside = sum(1 for r in scored if BAND[0] <= r.ratio <= BAND[1])
    return (f"{inside} of {len(scored)} predicted runs within {BAND[0]:.2f}-{BAND[1]:.2f} at one kernel share "
            f"({KERNEL_SHARE:.0%} of dense peak, set on {CALIBRATION}); {len(priced) - len(scored) - 1} out of scope")
