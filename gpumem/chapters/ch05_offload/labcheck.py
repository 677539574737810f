"""Lab 05's ``check()``: the offload ladder counted by hand, the swap files predicted, a rung chosen.

The learner writes five functions; while each call runs, gpumem's own counts and the grader's
answers raise "count it yourself" (:mod:`.lab_guard`: refused by where their code is defined, so
saved references, copies and restored code objects refuse too):

* ``rung_bytes(n_params, ranks, rung)``: per-rank bytes, device (gpu, cpu, nvme) -> role (params,
  grads, master, optimizer), for every rung of :data:`~.lab_reference.RUNGS`, graded at model sizes
  and rank counts drawn at each check (:func:`.lab_draw.bytes_cases`) against
  :func:`~.lab_reference.rung_bytes`; a wrong count is
  named by device, role, direction and factor, never by the hidden number;
* ``swap_files(param_numels, ranks, block_bytes)``: the sizes of the swap files one rank writes
  under ZeRO-3 with optimizer and parameters on NVMe, graded against DeepSpeed (:mod:`.lab_swaps`:
  a live run of drawn models with libaio, else a recorded run of drawn recorded ones);
* ``rung_seconds(n_params, ranks, rung, compute_s, links, micro_batches)``: each rung's stock step
  time (gradients accumulated over ``micro_batches``, drawn: review r30 #5) written
  from the mechanism (the bytes that cross PCIe and the drive per step over ``links``, what overlaps
  compute, CPU Adam), graded on the choice's cases against the time engine, whose schedules and
  traffic counts refuse while the learner's call runs; a wrong time is named by the piece that
  explains it (:func:`seconds_problem`; a drive byte slip, :mod:`.lab_slips`, with DeepSpeed's
  bytes per shard parameter and the learner's);
* ``choose_rung(n_params, ranks, gpu_budget, host_budget, step_budget_s, compute_s, links, micro_batches)``: the
  rung that fits both memory budgets and the step time (stock DeepSpeed, the time engine's
  :func:`gpumem.timing.offload_time.step_time`) leaving the GPU the most room, graded on budgets
  drawn at each check (:func:`.lab_draw.choose_cases`), each at least :data:`MARGIN` away from
  every rung's figure; explained with the reference's counts;
* ``pcie_copy_seconds(n_bytes)`` (optional, CUDA only): a host <-> device copy timed with CUDA
  events, compared with the grader's own timing of the same copy (:mod:`.lab_gpu`, refused while
  the learner's call runs) at three sizes, 64 KiB among them, where bytes over a rate misses a
  copy's fixed cost (not yet run on a GPU); without CUDA no row, a skip line.
"""

import copy
import random

from gpumem.course import seeds
from gpumem.course.grading import Report, Row, call, returned, run_case
from gpumem.memory import offload_cost
from gpumem.timing import grad_swap, offload_time

from . import lab_draw, lab_gpu, lab_guard, lab_slips
from .lab_slips import GRAD_HIDDEN, GRAD_SERIAL, GRAD_UNBOUNDED, NO_COMPUTE, ONE_MICRO, PHASED, STREAM, Z3_STREAM  # noqa: F401
from . import lab_reference as ref
from .lab_swaps import SWAP_KINDS, grade_swaps, numels, swap_problem, swap_shape_problem  # noqa: F401

LAB = "lab05_offload_budget"
GB = 10**9
MARGIN = lab_draw.MARGIN   # every graded budget is at least 5 % away from every rung's bytes and seconds
HINTS = {  # pointers to where DeepSpeed 0.19.8 decides, by mistake; none gives the count
    "z3-cpu-grads-low": "a gradient buffer is missing from host memory: see on which device stage3.py "
                        "allocates its 16-bit gradient partition (grad_partitions_flat_buffer) once the "
                        "optimizer is offloaded",
    "z3-gpu-grads-high": "a gradient buffer is on the GPU that DeepSpeed keeps elsewhere: see on which device "
                         "stage3.py allocates its 16-bit gradient partition (grad_partitions_flat_buffer) once "
                         "the optimizer is offloaded",
    "fp32-grads-to-nvme": "too much gradient in host memory: read where swap_out_gradients (stage3.py) "
                          "sends the gradient the offloaded optimizer reads",
    "z2-gpu-grads-high": "too much gradient on the GPU: follow where ZeRO-2 copies each reduced bucket once "
                         "the optimizer is offloaded (async_inplace_copy_grad_to_fp32_buffer_from_gpu)",
    "fp32-grads-nvme-low": "a gradient buffer is missing on NVMe: read what swap_out_gradients (stage3.py) "
                           "writes beside master and moments",
    "fp32-grads-low": "a gradient buffer is missing beside master and moments: what does DeepSpeedCPUAdam read?",
    "z2-params": "too few parameter bytes on the GPU: which states does ZeRO-2 partition (stage_1_and_2.py)?",
    "params-device": "offload_param.device decides where the 16-bit parameter shard lives between its uses "
                     "(partitioned_param_swapper.py swaps it to the drive when that is nvme)",
}


def _hint(rung: str, device: str, role: str, want: int, got: int) -> str:
    zero, offload, where = ref.RUNGS[rung]
    low, high = got < want, got > want
    if offload == "none" or role not in ("grads", "params"):
        return ""
    if role == "params":
        if zero == 2:
            return HINTS["z2-params"] if low else ""
        moved = "params" in offload and ((want == 0) != (got == 0))    # review r13 #5: the shard on the wrong device
        return HINTS["params-device"] if moved else ""
    if zero == 3 and device == "cpu":
        return HINTS["fp32-grads-to-nvme"] if high and where == "nvme" else HINTS["z3-cpu-grads-low"] if low else ""
    if zero == 3 and device == "gpu" and high:       # review r9: the 16-bit partition left on the GPU
        return HINTS["z3-gpu-grads-high"]
    if zero == 2 and device == "gpu" and high:
        return HINTS["z2-gpu-grads-high"]
    if device == where and low:
        return HINTS["fp32-grads-nvme-low"] if where == "nvme" else HINTS["fp32-grads-low"]
    return ""


def off_by(got: int, want: int) -> str:
    """How ``got`` differs from ``want`` without saying ``want``: direction and a rounded factor."""
    if want == 0:
        return f"you counted {got:,} B where DeepSpeed keeps none"
    if got == 0:
        return "you counted nothing where DeepSpeed keeps bytes"
    factor = got / want
    if abs(factor - 1) < 0.01:
        return "off by a few bytes: check the shard size (ceil(n_params / ranks))"
    return f"yours is {factor:.2g}x the right count ({'too high' if factor > 1 else 'too low'})"


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
            if isinstance(g, bool) or not isinstance(g, int):
                return f"{rung}, {device} {role}: bytes are a whole number (int), got {g!r}"
            if g != w:
                hint = _hint(rung, device, role, w, g)
                return f"{rung}, {device} {role}: {off_by(g, w)}" + (f" -- {hint}" if hint else "")
    return ""


def _grade_bytes(report: Report, fn, cases: list[tuple[int, int]]) -> None:
    """rung_bytes at each drawn (parameters, ranks); each answer is counted after the learner's call
    returns, so none is in a frame while it runs."""
    for n, ranks in cases:
        case = f"{n:,} params, {ranks} ranks"
        if fn is None:
            report.rows.append(Row("rung_bytes", case, "todo", "define rung_bytes(n_params, ranks, rung)"))
            continue

        def body(n=n, ranks=ranks):
            for rung in ref.RUNGS:
                mine = call(lab_guard.guarded(fn), n, ranks, rung)
                bad = bytes_problem(mine, ref.rung_bytes(n, ranks, rung), rung)
                if bad:
                    return "wrong", bad
            return "ok", ""
        run_case(report, "rung_bytes", case, body)


def _grade_seconds(report: Report, fn, cases: list[tuple]) -> None:
    """rung_seconds on the choice's cases: each rung's stock seconds against the time engine's
    (each priced after the learner's call returns)."""
    for case, args in cases:
        if fn is None:
            report.rows.append(Row("rung_seconds", case, "todo",
                                   "define rung_seconds(n, ranks, rung, compute_s, links, micro_batches)"))
            continue

        def body(args=args):
            n, ranks, *_, compute_s, links, m = args
            for rung in ref.RUNGS:
                mine = call(lab_guard.guarded(fn), n, ranks, rung, compute_s, copy.deepcopy(links), m)   # r19: its own
                if isinstance(mine, bool) or not isinstance(mine, (int, float)):
                    return "wrong", f"{rung}: " + returned(mine, "seconds (a float)")
                bad = seconds_problem(mine, n, ranks, rung, compute_s, links, m)    # priced after the call
                if bad:
                    return "wrong", f"{rung}: {bad}"
            return "ok", ""
        run_case(report, "rung_seconds", case, body, limit=600)   # r26: tied slips are named together


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1e-3, abs(b))


def _phased(n: int, ranks: int, zero: int, offload: str, device: str, compute_s: float, links, t: dict,
            m: int = 1) -> float:
    """Review r23's reading of the window: forward (its compute, its half of the parameter fetches and
    drive reads), then the engine's backward."""
    p = offload_cost.traffic_parts(n, "mixed", zero, ranks, offload, device, micro_batches=m)
    return max(compute_s / 3, p["param_fetch"] / 2 / links.h2d, t["nvme_params"] / 2) + t["backward"]


def seconds_problem(mine: float, n: int, ranks: int, rung: str, compute_s: float, links, m: int = 1) -> str:
    """'' if ``mine`` is the time engine's stock step over ``m`` micro-batches; else what explains the
    difference: a known wrong schedule or a missing piece, else direction and factor (the engine's
    seconds not shown)."""
    zero, offload, device = ref.RUNGS[rung]
    step = lambda **kw: offload_time.step_time(n, "mixed", zero, ranks, offload, device, compute_s, links, **kw)  # noqa: E731
    t = step(micro_batches=m)
    want = t["stock"]
    if _close(mine, want):
        return ""
    s, back, shown = -(-n // ranks), t["backward"], t["nvme_grad_exposed"]
    write = lambda b, count=grad_swap.BUFFER_COUNT: grad_swap.exposed_seconds(      # noqa: E731
        s, 4, links.nvme_write, b, grad_swap.SUB_GROUP_SIZE, count) if shown else 0.0
    unbounded = write(back, 10**9)
    window = want - shown - t["nvme_states"] - t["cpu_adam"] - t["h2d_after"]    # stock_schedule's first term
    wrong = [(compute_s, "yours is compute alone: this rung moves states every step"),
             (want - shown + t["nvme_grad"], GRAD_SERIAL),
             (want - shown, GRAD_HIDDEN),
             (want - shown + unbounded, GRAD_UNBOUNDED),
             (want - shown + write(compute_s),
              "your gradient write's window is all of compute_s: the fp32 gradient is produced during "
              "backward alone"),
             (want - shown + write(compute_s * grad_swap.BACKWARD_SHARE / m),
              "your backward is its compute alone: a transfer slower than compute stretches backward "
              "(the slowest thing in it sets its length), and a longer backward hides more of the write"),
             (want - window + max(window, _phased(n, ranks, zero, offload, device, compute_s, links, t, m)), PHASED),
             (t["total"], "yours overlaps what stock DeepSpeed runs after backward (CPU Adam, the state "
                          "swaps, the updated shard's upload); that is the delayed-update schedule"),
             (t["compute"] + t["h2d"] + t["d2h"] + t["nvme"] + t["cpu_adam"],
              "yours adds every transfer to compute: the gradient copies, the parameter fetches and their "
              "NVMe reads run beside forward and backward"),
             (want - t["cpu_adam"], "CPU Adam's time is missing (it runs after backward, at links.cpu_adam)"),
             (want - t["h2d_after"], "the updated 16-bit shard's upload after the step is missing"),
             (want - t["nvme_states"], "the optimizer states' NVMe traffic (read and written in the step) is missing"),
             (offload_time.stock_schedule({**t, "grad_trip": 0.0}), Z3_STREAM if zero == 3 else STREAM),
             (step(grads="paper", micro_batches=m)["stock"] if offload != "none" else want,
              Z3_STREAM if zero == 3 else STREAM),                                     # r28: ZeRO-2's in bf16
             (step()["stock"] if m > 1 else want, ONE_MICRO),                           # review r30 #5
             (offload_time.stock_schedule({**t, "compute": 0.0}) if offload != "none" else want, NO_COMPUTE),
             *lab_slips.drive_slips(n, ranks, zero, offload, device, compute_s, links, t, m),   # review r24 #1
             *lab_slips.micro_slips(n, ranks, zero, offload, device, compute_s, links, t, m)]   # review r35 #1, #3
    if offload != "none":           # review r26: the partition's trip back up left out, or the legs overlapped
        p = offload_cost.traffic_parts(n, "mixed", zero, ranks, offload, device, micro_batches=m)
        down, up = p["grad_down"] / links.d2h, p["grad_up"] / links.h2d
        wrong += [(offload_time.stock_schedule({**t, "grad_trip": trip}), Z3_STREAM if zero == 3 else STREAM)
                  for trip in ((down,) if zero == 3 else ()) + (max(down, up),)]     # r35 #3: ZeRO-2's legs too
    said = list(dict.fromkeys(words for value, words in wrong if value != want and _close(mine, value)))
    if said:        # review r26: slips that give the same step are named together, none first by chance
        return said[0] if len(said) == 1 else "; or ".join(said) + " (each gives your step)"
    ratio = f"{mine / want:.4f}" if abs(mine / want - 1) < 0.01 else f"{mine / want:.3g}"   # r24: not "1x"
    return (f"yours is {ratio}x the time engine's stock step ({'too long' if mine > want else 'too short'}): "
            "check what crosses each link per step and which of it overlaps compute")


def _grade_choose(report: Report, fn, cases: list[tuple]) -> None:
    wrong = [f for f in ("rung_bytes", "rung_seconds") if any(r.function == f and r.status != "ok" for r in report.rows)]
    for case, args in cases:
        if fn is None:
            report.rows.append(Row("choose_rung", case, "todo", "define choose_rung(...)"))
            continue

        def body(args=args):
            got = call(lab_guard.guarded(fn), *copy.deepcopy(args))    # r19: re-initialising links priced 0 s
            want = ref.choose(*args)                       # the answer, after the learner's call
            if got == want:
                return "ok", ""
            figures = lab_draw.figures(*args[:2], *args[5:])
            if got is not None and got not in ref.RUNGS:
                return "wrong", returned(got, f"a rung name ({', '.join(ref.RUNGS)}) or None")
            first = f"your {' and '.join(wrong)} {'are' if len(wrong) > 1 else 'is'} wrong (see the rows): fix that first; " if wrong else ""
            return "wrong", f"{first}{got} is not the rung to choose: " + why_not(got, want, args, figures)
        run_case(report, "choose_rung", case, body)


def why_not(got, want, args, figures: dict) -> str:
    """Which budget the learner's rung breaks, or why the expected one is better, in words (the
    reference's counts and seconds, ``figures``)."""
    gb, hb, sb = args[2:5]
    if got is None:
        return "a rung meets all three budgets"
    gpu, cpu, secs = figures[got]
    if secs > sb:        # review r21: the seconds themselves are rung_seconds' answer for this case
        return f"{got}'s stock step is over the {sb:.2f} s step budget (see your rung_seconds row for this case)"
    if gpu > gb:         # r22: the bytes themselves are part 1's answer for a model it did not draw
        return f"{got}'s states on the GPU are over its {gb / GB:.1f} GB budget (see your rung_bytes)"
    if cpu > hb:
        return f"{got}'s states in host memory are over its {hb / GB:.1f} GB budget (see your rung_bytes)"
    if want is None:
        return "no rung meets all three budgets"
    if gpu == figures[want][0]:     # review r30 #3: the tie and the spill case had one sentence
        return "a rung with the same GPU bytes as yours also meets all three budgets, and is faster"
    return ("a rung that leaves the GPU more room also meets all three budgets (if yours ruled it out, "
            "recount what it holds in host memory)")


def check(ns: dict, show: bool = True, rng: random.Random | None = None) -> Report:
    """Grade the lab's functions on cases drawn now, which it never shows (module docstring)."""
    from gpumem.runs import ds_offload
    from .lab_swaps import draw_models, recorded_models
    rng = rng or seeds.rng()
    report = Report(LAB)
    sizes = lab_draw.bytes_cases(rng)
    choices = [(case, args) for case, args, *_ in lab_draw.choose_cases(rng)]   # answers dropped: counted after each call
    models = (draw_models if ds_offload.nvme_ready()[0] else recorded_models)(rng)   # live run, else recorded
    _grade_bytes(report, ns.get("rung_bytes"), sizes)
    _grade_seconds(report, ns.get("rung_seconds"), choices)
    _grade_choose(report, ns.get("choose_rung"), choices)
    grade_swaps(report, ns.get("swap_files"), show, models)
    gpu_line = lab_gpu.grade(report, ns.get("pcie_copy_seconds"))
    if show:
        print(report.summary())
        print(f"GPU part: {gpu_line}")
    return report
