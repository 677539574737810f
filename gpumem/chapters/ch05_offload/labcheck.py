"""Lab 05's ``check()``: the offload ladder counted by hand, the swap files predicted, a rung chosen.

The learner writes four functions; while they run, gpumem's own counts raise "count it yourself"
(:func:`~gpumem.chapters.ch05_offload.lab_reference.no_library_counts`):

* ``rung_bytes(n_params, ranks, rung)``: per-rank bytes, device (gpu, cpu, nvme) -> role (params,
  grads, master, optimizer), for every rung of :data:`~.lab_reference.RUNGS`, graded at model sizes
  and rank counts the lab never shows against :func:`~.lab_reference.rung_bytes`;
* ``swap_files(param_numels, ranks, block_bytes)``: the sizes of the swap files one rank writes
  under ZeRO-3 with optimizer and parameters on NVMe, role -> sizes, graded against a real
  DeepSpeed run on two CPU ranks of two models the lab never shows (:mod:`.lab_runs`; needs libaio);
* ``choose_rung(n_params, ranks, gpu_budget, host_budget, step_budget_s, compute_s, links)``: the
  rung that fits both memory budgets and the step time (stock DeepSpeed, the time engine's
  :func:`gpumem.timing.offload_time.step_time`) leaving the GPU the most room, graded on budgets
  where the most offloaded rung is too slow and the fastest does not fit;
* ``pcie_copy_seconds(n_bytes)`` (optional, CUDA only): a host <-> device copy timed with CUDA
  events against the time engine's PCIe term (:mod:`.lab_gpu`).
"""

import os

from gpumem.course.grading import Report, Row, Todo, call, case_seconds, failure_line, returned, run_case
from gpumem.errors import RunFailure
from gpumem.memory.models import ModelConfig
from gpumem.runs import ds_offload, launch
from gpumem.timing import offload_time

from . import lab_gpu
from . import lab_reference as ref

LAB = "lab05_offload_budget"
GB = 10**9
BYTES_CASES = [(1_000_003, 3), (8_030_261_248, 6), (70_553_706_496, 16)]       # (parameters, ranks)
# models the lab never shows, trained one step on 2 CPU ranks: A's embedding and head shards reach
# 1 MiB in bf16 (640,160 elements, padded files); its MLP shards reach it only in fp32 (gradients
# swapped, parameters kept in RAM); B's 2 MiB aio blocks keep its bf16 shards and MLP gradients in RAM
SWAP_MODELS = {"model A, 1 MiB aio blocks": (ModelConfig("lab05-a", 1, 320, 4, 2, 2048, 4001, teaching=True), 1 << 20),
               "model B, 2 MiB aio blocks": (ModelConfig("lab05-b", 1, 384, 4, 2, 1408, 5003, teaching=True), 2 << 20)}
SWAP_KINDS = {"params": "params", "fp32 master": "master", "moments": "optimizer", "grads": "grads"}
# (case, n_params, ranks, gpu, drive, compute_s, gpu_budget, host_budget, step_budget_s); each
# expected rung is neither the most offloaded nor the fastest, nor what the memory budgets alone give
CHOOSE_CASES = [
    ("8.03 B, 4 A100, host 34 GB", 8_030_261_248, 4, "a100-80gb", "gen4", 6.0, 20 * GB, 34 * GB, 12.0),
    ("13 B, 8 H100, host 20 GB", 13_000_000_000, 8, "h100-80gb", "gen5", 3.0, 30 * GB, 20 * GB, 10.35),
    ("70.6 B, 16 H100, host 85 GB", 70_553_706_496, 16, "h100-80gb", "gen4", 4.0, 40 * GB, 85 * GB, 14.0),
    ("34 B, 8 A100, 15 s", 34_000_000_000, 8, "a100-80gb", "gen4", 10.0, 60 * GB, 80 * GB, 15.0),
]
COUNT = ref.rung_bytes       # the reference, kept: the guard refuses ref.rung_bytes while grading
HINTS = {  # (rung kind, device, role, what went wrong) -> what DeepSpeed 0.19.8 does
    "z3-cpu-grads": "ZeRO-3 keeps its 16-bit gradient partition (2 B per shard parameter) in host memory once "
                    "the optimizer is offloaded (stage3.py 333, 791): 18 B per shard parameter, not the 16 of "
                    "DeepSpeed's estimator",
    "z2-gpu-grads": "ZeRO-2 with the optimizer offloaded keeps no 16-bit gradient partition on the GPU: each "
                    "reduced bucket's slice goes straight into the host's fp32 gradient",
    "fp32-grads": "an offloaded optimizer keeps an fp32 gradient (4 B per shard parameter) beside master, m and "
                  "v: DeepSpeedCPUAdam reads it",
    "z2-params": "ZeRO-2 does not shard parameters: every GPU holds the whole 16-bit model",
}


def _hint(rung: str, device: str, role: str, want: int, got: int) -> str:
    zero, offload, where = ref.RUNGS[rung]
    if zero == 3 and offload != "none" and device == "cpu" and role == "grads":
        return HINTS["z3-cpu-grads"]
    if zero == 2 and device == "gpu" and role == "grads":
        return HINTS["z2-gpu-grads"]
    if zero == 2 and role == "params":
        return HINTS["z2-params"]
    if offload != "none" and device == where and role == "grads":
        return HINTS["fp32-grads"]
    return ""


def bytes_problem(got, want: dict, rung: str) -> str:
    """The first device and role where ``got`` differs from ``want`` ('' if none), in words."""
    if not isinstance(got, dict) or not all(isinstance(v, dict) for v in got.values()):
        return f"{rung}: " + returned(got, "a dict device -> {role: bytes}")
    extra = [d for d in got if d not in ref.DEVICES] + [r for v in got.values() for r in v if r not in ref.ROLES]
    if extra:
        return f"{rung}: unknown key {extra[0]!r}: devices are {', '.join(ref.DEVICES)}; roles {', '.join(ref.ROLES)}"
    for device in ref.DEVICES:
        for role in ref.ROLES:
            w, g = (want.get(device) or {}).get(role, 0), (got.get(device) or {}).get(role, 0)
            if isinstance(g, bool) or not isinstance(g, int) or g != w:
                hint = _hint(rung, device, role, w, g)
                return f"{rung}, {device} {role}: expected {w:,} B, got {g!r}" + (f" -- {hint}" if hint else "")
    return ""


def _grade_bytes(report: Report, fn, expected: dict) -> None:
    for (n, ranks), wants in expected.items():
        case = f"{n:,} params, {ranks} ranks"
        if fn is None:
            report.rows.append(Row("rung_bytes", case, "todo", "define rung_bytes(n_params, ranks, rung)"))
            continue

        def body(n=n, ranks=ranks, wants=wants):
            for rung, want in wants.items():
                bad = bytes_problem(call(fn, n, ranks, rung), want, rung)
                if bad:
                    return "wrong", bad
            return "ok", ""
        run_case(report, "rung_bytes", case, body)


def _choose_expected() -> list[tuple]:
    out = []
    for case, n, ranks, gpu, drive, compute_s, gb, hb, sb in CHOOSE_CASES:
        links = offload_time.datasheet_links(gpu, drive, ranks_on_node=min(ranks, 8))
        out.append((case, (n, ranks, gb, hb, sb, compute_s, links), ref.choose(n, ranks, gb, hb, sb, compute_s, links)))
    return out


def _grade_choose(report: Report, fn, cases: list[tuple]) -> None:
    for case, args, want in cases:
        if fn is None:
            report.rows.append(Row("choose_rung", case, "todo", "define choose_rung(...)"))
            continue

        def body(args=args, want=want):
            got = call(fn, *args)
            if got == want:
                return "ok", ""
            if got is not None and got not in ref.RUNGS:
                return "wrong", returned(got, f"a rung name ({', '.join(ref.RUNGS)}) or None")
            return "wrong", f"expected {want}, got {got}: " + why_not(got, want, args)
        run_case(report, "choose_rung", case, body)


def why_not(got, want, args) -> str:
    """Which budget the learner's rung breaks, or why the expected one is better, in words."""
    n, ranks, gb, hb, sb, compute_s, links = args
    if got is None:
        return f"{want} meets all three budgets"
    t, secs = ref.totals(COUNT(n, ranks, got)), ref.step_seconds(n, ranks, got, compute_s, links)
    if secs > sb:
        return f"{got} takes {secs:.2f} s a step, over the {sb:.2f} s budget (the time budget counts too)"
    if t["gpu"] > gb:
        return f"{got} puts {t['gpu'] / GB:.2f} GB on the GPU, over its {gb / GB:.0f} GB budget"
    if t["cpu"] > hb:
        return f"{got} puts {t['cpu'] / GB:.2f} GB in host memory, over its {hb / GB:.0f} GB budget"
    if want is None:
        return "no rung meets all three budgets"
    w = ref.totals(COUNT(n, ranks, want))
    return (f"{want} also fits and leaves the GPU more room ({w['gpu'] / GB:.2f} GB of states against "
            f"{t['gpu'] / GB:.2f}) or is faster at the same bytes")


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
    """'' if ``got`` (role -> sizes) lists the sizes of ``files`` (DeepSpeed's name -> bytes) by role."""
    want: dict[str, list[int]] = {}
    for name, size in files.items():
        want.setdefault(SWAP_KINDS[ds_offload._kind(name.rsplit("/", 1)[-1])], []).append(size)
    for role in ("params", "master", "optimizer", "grads"):
        w, g = sorted(want.get(role, [])), sorted(got.get(role, []))
        if g != w:
            return _one(f"{role}: DeepSpeed wrote {len(w)} file(s) {w}, you predicted {len(g)}: {g}")
    return ""


def _one(text: str) -> str:
    return text if len(text) <= 240 else text[:237] + "..."


def _grade_swaps(report: Report, fn, show: bool) -> None:
    ready, why = ds_offload.nvme_ready()
    given = {}
    for label, (cfg, block) in SWAP_MODELS.items():
        if fn is None:
            report.rows.append(Row("swap_files", label, "todo", "define swap_files(param_numels, ranks, block_bytes)"))
            continue
        sizes = numels(cfg)

        def ask(sizes=sizes, block=block, label=label):
            got = call(fn, list(sizes), 2, block)
            bad = swap_shape_problem(got)
            if bad:
                return "wrong", bad
            given[label] = got
            return ("ok", "not run here: " + why) if not ready else ("ok", "to run")
        run_case(report, "swap_files", label, ask)
    given = {k: v for k, v in given.items() if ready}
    if not given:
        return
    rows = {r.case: i for i, r in enumerate(report.rows) if r.function == "swap_files"}

    def measure():
        with ds_offload.swap_folder() as swap:
            try:
                res = launch.run("gpumem.chapters.ch05_offload.lab_runs:swap_run", 2, "cpu", deepspeed=True,
                                 progress=show and not os.environ.get("TQDM_DISABLE"),
                                 models={k: SWAP_MODELS[k] for k in given}, swap_dir=str(swap))
            except (launch.RankError, RunFailure) as err:
                return "error", failure_line(err)
        for label, got in given.items():
            bad = next((swap_problem(got, r[label]) for r in res if swap_problem(got, r[label])), "")
            report.rows[rows[label]] = Row("swap_files", label, "wrong" if bad else "ok",
                                           bad or f"{len(res[0][label])} files, as DeepSpeed wrote them")
    start = len(report.rows)
    failed = run_case(report, "swap_files", "2 CPU ranks, real NVMe offload", measure, case_seconds(cases=2))
    if len(report.rows) > start:              # the run failed: each model it ran says why
        del report.rows[start:]
        for label in given:
            report.rows[rows[label]] = Row("swap_files", label, failed.status, failed.detail)


def _grade_gpu(report: Report, fn) -> None:
    reason = lab_gpu.cuda_reason()
    if fn is None or reason:
        report.rows.append(Row("pcie_copy_seconds", "optional GPU part", "ok",
                               "skipped: " + (reason or "pcie_copy_seconds not defined (optional)")))
        return
    n_bytes = lab_gpu.optimizer_state_bytes()

    def body():
        try:
            got = call(fn, n_bytes)
        except Todo:
            return "ok", "skipped: pcie_copy_seconds not written (optional)"
        return lab_gpu.verdict(got, n_bytes)
    run_case(report, "pcie_copy_seconds", "optional GPU part", body, case_seconds(cases=4))


def check(ns: dict, show: bool = True) -> Report:
    """Grade the lab's functions on cases it never shows (module docstring)."""
    report = Report(LAB)
    expected = {(n, r): {rung: ref.rung_bytes(n, r, rung) for rung in ref.RUNGS} for n, r in BYTES_CASES}
    choices = _choose_expected()
    with ref.no_library_counts(ns):
        _grade_bytes(report, ns.get("rung_bytes"), expected)
        _grade_choose(report, ns.get("choose_rung"), choices)
        _grade_swaps(report, ns.get("swap_files"), show)
    _grade_gpu(report, ns.get("pcie_copy_seconds"))
    if show:
        print(report.summary())
    return report
