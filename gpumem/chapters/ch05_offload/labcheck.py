"""Lab 05's ``check()``: the learner's DeepSpeed config, run on 2 CPU ranks and measured.

The learner writes ``offload_config(budget_bytes, swap_dir)``: a whole DeepSpeed config (bf16,
AdamW, micro-batch 2 per rank) that trains :data:`gpumem.runs.ds_offload.MODEL` with at most
``budget_bytes`` of model states on each rank's accelerator, offloading no more than it must
(each step off the accelerator costs time: none, then the optimizer to the CPU, then parameters
to NVMe). The grader runs every budget the lab never shows in one launch, reads what each rank
holds from DeepSpeed's structures (:func:`gpumem.runs.ds_offload.held_by_role`) and names the
largest state that overflowed and by how much, or says that it fits. Budgets sit between the
configurations' measured holdings (``BUDGETS``).
"""

import os

from gpumem import units
from gpumem.course.grading import Report, Row, call, case_seconds, failure_line, kind, returned, run_case
from gpumem.runs import ds_offload, launch
from gpumem.errors import RunFailure
from gpumem.memory import accounting

LAB = "lab05_offload_budget"
MB = 10**6
# chapter 01's formula for the course model on 2 ranks (mixed): ZeRO-2 32.2 MB, ZeRO-3 28.6 MB,
# ZeRO-3 + CPU optimizer 3.6 MB (the bf16 shard), ZeRO-3 + NVMe optimizer and parameters 0 MB
# (DeepSpeed keeps ZeRO-3's gradient partition in host memory once it offloads); one budget per step
BUDGETS = {"30 MB": 30 * MB, "12 MB": 12 * MB, "2 MB": 2 * MB}
RANK_OF = {"none": 0, "optimizer": 1, "params": 2, "optimizer+params": 2}   # params: fetched every pass
ROLE_WORDS = {"params": "16-bit parameters", "grads16": "16-bit gradients", "grads32": "fp32 gradients",
              "master": "fp32 master weights", "moments": "Adam moments (m, v)"}


def _on_accelerator(roles: dict, config: dict) -> dict[str, int]:
    """The roles a GPU would hold under ``config`` (:func:`gpumem.runs.ds_offload.placement`), the
    gradients at their largest (backward's whole gradient at ZeRO-1, the partition otherwise)."""
    where = ds_offload.placement(config)
    on = {k: v for k, v in roles.items() if where.get(k) == "accelerator" and k != "grads_unreduced" and v}
    if roles.get("grads_unreduced", 0) > on.get("grads16", 0):
        on["grads16"] = roles["grads_unreduced"]
    return on


def verdict(roles: dict, config: dict, budget: int) -> tuple[bool, str]:
    """Whether the measured accelerator bytes fit ``budget``; if not, the largest state there and
    the overflow, in words."""
    on = _on_accelerator(roles, config)
    total = sum(on.values())
    if total <= budget:
        return True, f"fits: {units.fmt(total, 'MB', 2)} on the accelerator, budget {units.fmt(budget, 'MB', 2)}"
    big = max(on, key=on.get)
    return False, (f"over by {units.fmt(total - budget, 'MB', 2)}: {units.fmt(total, 'MB', 2)} on the accelerator, "
                   f"the largest being {ROLE_WORDS[big]} ({units.fmt(on[big], 'MB', 2)})")


def needed(budget: int, ranks: int = 2) -> str:
    """The least offload (none < optimizer < optimizer+params, ZeRO-3) whose chapter 01 formula
    (recipe ``mixed``: what DeepSpeed's bf16 run holds) fits ``budget`` on the accelerator."""
    n = ds_offload.MODEL.n_params()
    for offload in ("none", "optimizer", "optimizer+params"):
        device = "nvme" if offload == "optimizer+params" else "cpu"
        if accounting.model_states(n, "mixed", ranks, 3, offload, device).total <= budget:
            return offload
    return "optimizer+params"


def config_problem(cfg) -> str:
    """What in the learner's config DeepSpeed would refuse or the lab cannot grade, in the lab's
    words ('' if nothing): checked here, before any rank starts."""
    if not isinstance(cfg, dict):
        return returned(cfg, "a dict: a whole DeepSpeed config")
    zero = cfg.get("zero_optimization", {})
    if not isinstance(zero, dict):
        return f"'zero_optimization' must be a dict (its stage and any offload), got {kind(zero)}"
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        return f"stage must be 0, 1, 2 or 3, got {stage!r}"
    for key in ("offload_optimizer", "offload_param"):
        target = zero.get(key)
        if target is None:
            continue
        if not isinstance(target, dict) or target.get("device", "none") not in ("none", "cpu", "nvme"):
            return f"{key} must be a dict whose device is 'none', 'cpu' or 'nvme', got {target!r}"
        if target.get("device") == "nvme" and not target.get("nvme_path"):
            return f"{key} goes to nvme but names no nvme_path (use the swap_dir the grader passes)"
    return ""


def check(ns: dict, show: bool = True) -> Report:
    """Grade ``offload_config`` on each budget of :data:`BUDGETS`: fits, and offloads no more than needed."""
    report = Report(LAB)
    fn = ns.get("offload_config")
    ready, why = ds_offload.nvme_ready()
    given = {}
    with ds_offload.swap_folder() as swap:
        for label, budget in BUDGETS.items():
            if fn is None:
                report.rows.append(Row("offload_config", label, "todo", "define offload_config(budget_bytes, swap_dir)"))
                continue

            def ask(budget=budget, label=label):
                cfg = call(fn, budget, str(swap))
                bad = config_problem(cfg)
                if bad:
                    return "wrong", bad
                if ds_offload.describe(cfg)[2] == "nvme" and not ready:
                    return "ok", "not run here: " + why
                given[label] = cfg
                return "ok", "to run"
            run_case(report, "offload_config", label, ask)
        if given:
            rows = {r.case: i for i, r in enumerate(report.rows)}

            def measure():
                try:
                    res = launch.run("gpumem.runs.ds_offload_ranks:offload_runs", 2, "cpu", deepspeed=True,
                                     progress=show and not os.environ.get("TQDM_DISABLE"), given=given,
                                     swap_dir=str(swap), steps=2)
                except (launch.RankError, RunFailure) as err:
                    return "error", failure_line(err)
                for label, cfg in given.items():
                    report.rows[rows[label]] = _graded(label, cfg, res)
            start = len(report.rows)
            failed = run_case(report, "offload_config", "2 CPU ranks", measure,
                              case_seconds(cases=len(given)))
            if len(report.rows) > start:          # the run failed: each budget it ran says why
                del report.rows[start:]
                for label in given:
                    report.rows[rows[label]] = Row("offload_config", label, failed.status, failed.detail)
    if show:
        print(report.summary())
    return report


def _graded(label: str, cfg: dict, res: list) -> Row:
    """The row of one budget from the ranks' measurements."""
    roles = max((r[label]["held_by_role"] for r in res), key=lambda x: sum(_on_accelerator(x, cfg).values()))
    ok, words = verdict(roles, cfg, BUDGETS[label])
    need, mine = needed(BUDGETS[label]), ds_offload.describe(cfg)[1]
    if ok and RANK_OF[mine] > RANK_OF[need]:
        return Row("offload_config", f"budget {label}", "wrong", f"{words}, but it offloads {mine} where {need} "
                   "would fit: each state moved off the accelerator costs step time")
    return Row("offload_config", f"budget {label}", "ok" if ok else "wrong", words)
