"""A tiny discrete-event simulation of pipeline schedules: the timeline the closed forms summarise.

Each schedule is written here the way its framework runs it, as an *order of operations per
device* (which forward, backward or weight-gradient pass a device runs next), independently of the
closed forms in :mod:`gpumem.timing.schedules`. :func:`simulate` then places every operation as
early as its device and its dependencies allow:

* ``F`` of a micro-batch on virtual stage ``s`` waits for its ``F`` on stage ``s - 1``;
* ``B`` (the whole backward, or only the input-gradient part where ``W`` is split off) on stage
  ``s`` waits for ``B`` on stage ``s + 1`` (on the last stage, for its own ``F``);
* ``W`` (weight gradient, zero-bubble schedules only) waits for ``B`` of the same micro-batch and
  stage, and nothing downstream waits for it.

Point-to-point transfers take no time here (the closed forms leave them out too). The orders:

* ``gpipe``: every forward, then every backward (Huang et al. 2019, arXiv:1811.06965, fig. 2c);
* ``1f1b``: Megatron-LM ``forward_backward_pipelining_without_interleaving``: rank ``r`` runs
  ``p - r - 1`` warm-up forwards, then one forward / one backward, then the cool-down backwards;
* ``interleaved``: Megatron-LM ``forward_backward_pipelining_with_interleaving``: the order of
  ``get_schedule_table`` (groups of ``p`` micro-batches per model chunk, the default
  ``microbatch_group_size_per_vp_stage = p``), the warm-up count of ``get_pp_rank_microbatches``
  (``2 (p - r - 1) + (v - 1) p``), backward chunks in reverse (``get_model_chunk_id``);
* ``zb-h1``: 1F1B's order with the weight gradients deferred, rank ``r`` keeping ``r`` of them
  waiting and running them at the end (Qi et al. 2023, arXiv:2401.10241, s. 2.1, fig. 3 top:
  the later a stage, the later its W passes start, and they fill the tail);
* ``zb-h2``: ``2 (p - r - 1)`` warm-up forwards (the first stage then holds ``2p - 1``), one
  forward / one backward, rank ``r`` keeping ``2 r`` weight gradients for the end (s. 2.2,
  fig. 3 bottom: the trapezoid becomes a parallelogram).

These two orders are this module's reading of the paper's figures, not the authors' code; the
tests check that they reproduce the paper's table 2.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpumem.errors import UsageError

SIMULATED = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")


@dataclass(frozen=True)
class Event:
    """One operation on the timeline: device ``stage``, ``micro_batch``, ``op`` (F, B or W),
    model ``chunk`` (0 unless interleaved), and its ``start`` and ``end`` times."""
    stage: int
    micro_batch: int
    op: str
    start: float
    end: float
    chunk: int = 0


def _one_f_one_b(p: int, m: int, warm: int, keep: int, split: bool) -> list:
    """``warm`` forwards, then one forward / one backward; with ``split``, each weight gradient
    runs after its backward once more than ``keep`` are waiting (the rest at the end)."""
    warm = min(warm, m)
    order = [("F", i, 0) for i in range(warm)]
    pending: list = []

    def backward(i: int) -> list:
        if not split:
            return [("B", i, 0)]
        pending.append(i)
        out = [("B", i, 0)]
        if len(pending) > keep:
            out.append(("W", pending.pop(0), 0))
        return out

    for i in range(m - warm):
        order.append(("F", warm + i, 0))
        order += backward(i)
    for i in range(m - warm, m):
        order += backward(i)
    return order + [("W", i, 0) for i in pending]


def _interleaved(p: int, m: int, v: int, r: int) -> list:
    table = []                               # Megatron's get_schedule_table, group size p
    for first in range(0, m, p):
        last = m if first + p >= m else first + p
        table += [(mb, c) for c in range(v) for mb in range(first, last)]
    total = m * v
    warm = min(2 * (p - r - 1) + (v - 1) * p, total)
    fwd = [("F", mb, c) for mb, c in table]
    bwd = [("B", mb, v - 1 - c) for mb, c in table]
    order = fwd[:warm]
    for k in range(total - warm):
        order += [fwd[warm + k], bwd[k]]
    return order + bwd[total - warm:]


def orders(name: str, p: int, m: int, v: int = 1) -> list:
    """Per device, the list of ``(op, micro_batch, chunk)`` in the order the schedule runs them."""
    if name == "gpipe":
        return [[("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)] for _ in range(p)]
    if name == "1f1b":
        return [_one_f_one_b(p, m, p - r - 1, 0, split=False) for r in range(p)]
    if name == "zb-h1":
        return [_one_f_one_b(p, m, p - r - 1, r, split=True) for r in range(p)]
    if name == "zb-h2":
        return [_one_f_one_b(p, m, 2 * (p - r - 1), 2 * r, split=True) for r in range(p)]
    if name == "interleaved":
        return [_interleaved(p, m, v, r) for r in range(p)]
    raise UsageError(f"unknown simulated schedule {name!r}; accepted: {', '.join(SIMULATED)}")


def simulate(name: str, p: int, m: int, v: int = 1, F: float = 1.0, B: float = 2.0,
             W: float = 0.0) -> list:
    """Place every operation of schedule ``name`` as early as dependencies allow; return events.

    ``F`` and ``B`` are one micro-batch's forward and whole backward time on one pipeline stage
    (an interleaved chunk takes ``F / v`` and ``B / v``); for ``zb-*`` the backward splits into an
    input-gradient pass of ``B - W`` and a weight-gradient pass of ``W``.
    """
    split = name.startswith("zb-")
    dur = {"F": F / v, "B": (B - W if split else B) / v, "W": W / v}
    last = p * v - 1
    done: dict = {}
    free = [0.0] * p
    ptr = [0] * p
    plan = orders(name, p, m, v)
    events = []
    while any(ptr[d] < len(plan[d]) for d in range(p)):
        progressed = False
        for d in range(p):
            while ptr[d] < len(plan[d]):
                op, mb, c = plan[d][ptr[d]]
                s = c * p + d                              # virtual stage
                if op == "F":
                    deps = [("F", mb, s - 1)] if s > 0 else []
                elif op == "B":
                    deps = [("F", mb, s)] + ([("B", mb, s + 1)] if s < last else [])
                else:
                    deps = [("B", mb, s)]
                if any(k not in done for k in deps):
                    break
                start = max([free[d]] + [done[k] for k in deps])
                end = start + dur[op]
                done[(op, mb, s)] = end
                free[d] = end
                events.append(Event(d, mb, op, start, end, c))
                ptr[d] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {name} deadlocks for p={p}, m={m}, v={v}")
    return events


def step_time(events: list) -> float:
    """The step's length: from the first operation's start to the last one's end."""
    return max(e.end for e in events) - min(e.start for e in events)


def period(events: list) -> float:
    """The longest span of one stage (its first start to its last end): the step's period when
    consecutive steps overlap, as zero-bubble's optimizer post-validation allows (Qi et al.
    2023, s. 4); equal to :func:`step_time` when the first stage spans the whole step."""
    stages = {e.stage for e in events}
    return max(max(e.end for e in events if e.stage == d) - min(e.start for e in events
               if e.stage == d) for d in stages)


def sends(events: list, p: int, v: int = 1) -> list:
    """Messages each rank sends: a forward on any virtual stage but the last passes its output
    on, a backward on any but the first passes its input gradient back."""
    out = [0] * p
    for e in events:
        s = e.chunk * p + e.stage
        if (e.op == "F" and s < p * v - 1) or (e.op == "B" and s > 0):
            out[e.stage] += 1
    return out


def peak_in_flight(events: list, stage: int = 0, v: int = 1) -> float:
    """Most micro-batches whose activations ``stage`` holds at once (forward started, its
    backward not finished), in units of one micro-batch's activations of the whole stage
    (an interleaved chunk counts ``1 / v``)."""
    marks = []
    for e in events:
        if e.stage == stage and e.op == "F":
            marks.append((e.start, 1, 1.0 / v))
        elif e.stage == stage and e.op == "B":
            marks.append((e.end, 0, -1.0 / v))       # at equal times, free before allocating
    held = peak = 0.0
    for _, _, delta in sorted(marks):
        held += delta
        peak = max(peak, held)
    return round(peak * v) / v


def draw(events: list, unit: float = 1.0) -> str:
    """The timeline as text, one row per stage, one column per ``unit`` of time: ``F3`` forward
    of micro-batch 3, ``B3`` its backward, ``W3`` its weight gradient, ``..`` idle."""
    span = step_time(events)
    cols = int(round(span / unit))
    rows = []
    for d in sorted({e.stage for e in events}):
        row = [".."] * cols
        for e in (e for e in events if e.stage == d):
            for t in range(int(round(e.start / unit)), int(round(e.end / unit))):
                row[t] = f"{e.op}{e.micro_batch}"[:2]
        rows.append(f"stage {d}: " + " ".join(row))
    return "\n".join(rows)
