"""Lab 05's part 2, graded: the swap files one rank writes under ZeRO-3 with optimizer and parameters
on NVMe, against DeepSpeed itself.

With libaio (:func:`gpumem.runs.ds_offload.nvme_ready`) the grader trains the two unseen models
(:data:`SWAP_MODELS`) one step on two CPU ranks (:func:`.lab_runs.swap_run`) and lists the files on
disk; without it, it compares with the files of a recorded run of the same models
(:mod:`.lab_swap_record`, DeepSpeed and date inside), and says so in the row.
"""

import os

from gpumem.course.grading import Report, Row, call, case_seconds, failure_line, returned, run_case
from gpumem.errors import RunFailure
from gpumem.memory.models import ModelConfig
from gpumem.runs import ds_offload, launch

from . import lab_guard, lab_swap_record
from . import lab_reference as ref

# models the lab never shows, trained one step on 2 CPU ranks: A's embedding and head shards reach
# 1 MiB in bf16 (640,160 elements, padded files); its MLP shards reach it only in fp32 (gradients
# swapped, parameters kept in RAM); B's 2 MiB aio blocks keep its bf16 shards and MLP gradients in RAM
SWAP_MODELS = {"model A, 1 MiB aio blocks": (ModelConfig("lab05-a", 1, 320, 4, 2, 2048, 4001, teaching=True), 1 << 20),
               "model B, 2 MiB aio blocks": (ModelConfig("lab05-b", 1, 384, 4, 2, 1408, 5003, teaching=True), 2 << 20)}
SWAP_KINDS = {"params": "params", "fp32 master": "master", "moments": "optimizer", "grads": "grads"}


def numels(cfg: ModelConfig) -> list[int]:
    """The parameter sizes of ``cfg``'s Llama, in the model's order (built on the meta device)."""
    import torch
    from gpumem.memory.llama import Llama
    with torch.device("meta"):
        return [p.numel() for p in Llama(cfg).parameters()]


def swap_shape_problem(got) -> str:
    """'' if ``got`` is role -> list of whole byte counts, with the lab's roles only."""
    if not isinstance(got, dict) or not all(isinstance(v, (list, tuple)) for v in got.values()):
        return returned(got, "a dict role -> list of file sizes in bytes")
    bad = [k for k in got if k not in ref.ROLES]
    if bad:
        return f"unknown role {bad[0]!r}: the roles are {', '.join(ref.ROLES)}"
    sizes = [b for v in got.values() for b in v]
    odd = next((b for b in sizes if isinstance(b, bool) or not isinstance(b, int)), None)
    return f"file sizes are whole bytes (int), got {odd!r}" if odd is not None else ""


def swap_problem(got, files: dict[str, int]) -> str:
    """'' if ``got`` (role -> sizes) lists the sizes of ``files`` (DeepSpeed's name -> bytes) by role;
    else the first role that differs: the count of files, or a size's direction, never the sizes."""
    want: dict[str, list[int]] = {}
    for name, size in files.items():
        want.setdefault(SWAP_KINDS[ds_offload._kind(name.rsplit("/", 1)[-1])], []).append(size)
    for role in ("params", "master", "optimizer", "grads"):
        w, g = sorted(want.get(role, [])), sorted(got.get(role, []))
        if len(g) != len(w):
            return f"{role}: DeepSpeed wrote {len(w)} file(s), you predicted {len(g)}"
        off = [(b, a) for b, a in zip(g, w) if b != a]
        if off:                                   # the sizes, not shown: direction and how far
            mine, theirs = off[0]
            return (f"{role}: DeepSpeed wrote {len(w)} file(s), as you predicted, but {len(off)} size(s) differ: "
                    f"your {mine:,} B file is too {'large' if mine > theirs else 'small'}, by "
                    f"{'less' if abs(mine - theirs) < 1024 else 'more'} than 1 KiB")
    return ""


def _compare(report: Report, given: dict, rows: dict, ranks: list[dict], source: str) -> None:
    for label, got in given.items():
        bad = next((swap_problem(got, r[label]) for r in ranks if swap_problem(got, r[label])), "")
        report.rows[rows[label]] = Row("swap_files", label, "wrong" if bad else "ok",
                                       bad or f"{len(ranks[0][label])} files, as DeepSpeed wrote them ({source})")


def grade_swaps(report: Report, fn, show: bool) -> None:
    """One row per model of :data:`SWAP_MODELS`: the learner's sizes against DeepSpeed's files."""
    ready, why = ds_offload.nvme_ready()
    given = {}
    for label, (cfg, block) in SWAP_MODELS.items():
        if fn is None:
            report.rows.append(Row("swap_files", label, "todo", "define swap_files(param_numels, ranks, block_bytes)"))
            continue
        sizes = numels(cfg)

        def ask(sizes=sizes, block=block, label=label):
            got = call(lab_guard.guarded(fn), list(sizes), 2, block)
            bad = swap_shape_problem(got)
            if bad:
                return "wrong", bad
            given[label] = got
            return "todo", "not compared yet"          # replaced below: never ok before the comparison
        run_case(report, "swap_files", label, ask)
    rows = {r.case: i for i, r in enumerate(report.rows) if r.function == "swap_files"}
    if not given:
        return
    if not ready:
        _compare(report, given, rows, lab_swap_record.RANKS,
                 f"recorded run, DeepSpeed {lab_swap_record.DEEPSPEED}, {lab_swap_record.DATE}; "
                 f"not run live here: {why}")
        return

    def measure():
        with ds_offload.swap_folder() as swap:
            try:
                res = launch.run("gpumem.chapters.ch05_offload.lab_runs:swap_run", 2, "cpu", deepspeed=True,
                                 progress=show and not os.environ.get("TQDM_DISABLE"),
                                 models={k: SWAP_MODELS[k] for k in given}, swap_dir=str(swap))
            except (launch.RankError, RunFailure) as err:
                return "error", failure_line(err)
        _compare(report, given, rows, res, "live run on 2 CPU ranks")
    start = len(report.rows)
    failed = run_case(report, "swap_files", "2 CPU ranks, real NVMe offload", measure, case_seconds(cases=2))
    if len(report.rows) > start:              # the run failed: each model it ran says why
        del report.rows[start:]
        for label in given:
            report.rows[rows[label]] = Row("swap_files", label, failed.status, failed.detail)
