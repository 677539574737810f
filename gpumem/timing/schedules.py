"""Pipeline schedules in closed form: step time, bubble, first-stage activations, point-to-point.

Notation: ``p`` pipeline stages, ``m`` micro-batches per step, ``v`` model chunks per device
(interleaving), ``F`` and ``B`` one micro-batch's forward and *whole* backward time on one stage,
``W`` the weight-gradient part of ``B`` (zero-bubble schedules split it off; the paper's ``T_B`` is
our ``B - W`` and its ``T_W`` our ``W``). Stages are uniform; point-to-point time is not counted.

* ``gpipe``: bubble ``(p-1)(F+B)``; the first stage holds all ``m`` micro-batches (Huang et al.
  2019, arXiv:1811.06965, s. 2.2; Narayanan et al. 2021, arXiv:2104.04473, s. 2.2.1).
* ``1f1b`` (PipeDream-Flush): bubble ``(p-1)(F+B)``, so a step of ``(m+p-1)(F+B)``; the first
  stage holds ``min(p, m)`` (Narayanan et al. 2021, s. 2.2.1).
* ``interleaved``: bubble ``(p-1)(F+B)/v``; the first stage holds ``p + (p-1)/v`` (Narayanan et
  al. 2021, s. 2.2.2; Megatron-LM ``get_pp_rank_microbatches``, see
  :func:`interleaved_in_flight`); ``m`` a multiple of ``p``; ``v`` times the p2p messages.
* ``zb-h1``: bubble ``(p-1)(F + (B-W) - W)``, a third of 1F1B's when forward, input-gradient and
  weight-gradient take equal time; holds ``p`` (Qi et al. 2023, arXiv:2401.10241, s. 2.1, table 2).
* ``zb-h2``: bubble ``(p-1)(F + (B-W) - 2W)``, zero for equal times, counted as the paper does:
  consecutive steps overlap, which its optimizer post-validation (s. 4) allows; holds ``2p - 1``
  (s. 2.2, table 2).

The bubble *fraction* is the papers' ratio of bubble to ideal compute ``m (F + B)``, e.g.
``(p - 1) / m`` for 1F1B (Narayanan et al. 2021, s. 2.2.1); ``idle_fraction`` is bubble over the
step, ``(p - 1) / (m + p - 1)`` for 1F1B (the zero-bubble repository's README table).

Every closed form is checked against an independent discrete-event simulation of the
framework's order of operations (:mod:`gpumem.timing.schedule_sim`) in
``tests/test_timing_schedules.py``; the zero-bubble forms hold exactly where that simulation says
they do, which is where this module accepts them (``W <= F``, ``W <= B - W``, enough micro-batches).
"""
from __future__ import annotations

from dataclasses import dataclass

from gpumem.errors import UsageError

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")
SOURCES = {
    "gpipe": "Huang et al. 2019, arXiv:1811.06965, s. 2.2; Narayanan et al. 2021, "
             "arXiv:2104.04473, s. 2.2.1",
    "1f1b": "Narayanan et al. 2021, arXiv:2104.04473, s. 2.2.1 (PipeDream-Flush); Megatron-LM "
            "schedules.py forward_backward_pipelining_without_interleaving",
    "interleaved": "Narayanan et al. 2021, arXiv:2104.04473, s. 2.2.2; Megatron-LM "
                   "megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches, "
                   "forward_backward_pipelining_with_interleaving",
    "zb-h1": "Qi et al. 2023, Zero Bubble Pipeline Parallelism, arXiv:2401.10241, s. 2.1, table 2",
    "zb-h2": "Qi et al. 2023, arXiv:2401.10241, s. 2.2, table 2; s. 4 (optimizer post-validation)",
}


@dataclass(frozen=True)
class ScheduleResult:
    """One schedule's step, in the time unit of ``F`` and ``B`` and in bytes.

    ``step_time``: the step as the schedule's paper counts it; ``step_time_synced``: the same step
    when a synchronising optimizer step follows it (differs from ``step_time`` only for
    ``zb-h2``, whose zero bubble needs consecutive steps to overlap). ``bubble_fraction``: bubble
    over ``m (F + B)``; ``idle_fraction``: bubble over ``step_time``. ``in_flight_first``: the
    most micro-batches whose activations the first stage holds at once, in units of one
    micro-batch's activations of a whole stage. ``p2p_sends``/``p2p_bytes``: messages (and bytes)
    the busiest rank sends per step (it receives as many).
    """
    schedule: str
    p: int
    m: int
    v: int
    step_time: float
    step_time_synced: float
    bubble_time: float
    bubble_fraction: float
    idle_fraction: float
    in_flight_first: float
    p2p_sends: int
    p2p_bytes: int
    source: str


def _count(value, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def _time(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or value == float("inf"):
        raise UsageError(f"{name} must be a finite time >= 0, got {value!r}")
    return float(value)


def p2p_message_bytes(seq: int, micro_batch: int, hidden: int, dtype_bytes: int = 2, *,
                      cp: int = 1, tp: int = 1, sequence_parallel: bool = False) -> int:
    """Bytes of one pipeline message: the activation (or its gradient) a stage boundary passes.

    Megatron-LM sends a tensor of shape ``(seq, micro_batch, hidden)`` in the layout's dtype,
    the sequence divided by the context-parallel size and, with sequence parallelism, by the
    tensor-parallel size (``megatron/core/pipeline_parallel/schedules.py``,
    ``get_tensor_shapes``; the same ``tensor_shape`` in
    ``forward_backward_pipelining_with_interleaving``).
    """
    for value, name in ((seq, "seq"), (micro_batch, "micro_batch"), (hidden, "hidden"),
                        (dtype_bytes, "dtype_bytes"), (cp, "cp"), (tp, "tp")):
        _count(value, name)
    s = seq // cp
    if sequence_parallel:
        s //= tp
    return s * micro_batch * hidden * dtype_bytes


def p2p_sends_per_rank(p: int, m: int, v: int = 1) -> int:
    """Messages the busiest rank sends per step: each micro-batch's activation forward across
    every boundary after its virtual stage and its gradient back across every boundary before.

    With ``v`` chunks per device, virtual stage ``c p + r`` lives on rank ``r`` and every
    boundary between consecutive virtual stages crosses devices, so a middle rank sends
    ``2 m v`` messages: ``v`` times 1F1B's ``2 m`` (Narayanan et al. 2021, s. 2.2.2: "the amount
    of communication also increases by v").
    """
    if p == 1:
        return 0
    per_rank = [(v - (r == p - 1)) + (v - (r == 0)) for r in range(p)]
    return m * max(per_rank)


def interleaved_in_flight(p: int, m: int, v: int, rank: int = 0) -> float:
    """Micro-batches whose activations ``rank`` holds at the peak under Megatron's interleaving.

    ``get_pp_rank_microbatches`` runs ``2 (p - rank - 1) + (v - 1) p`` warm-up forwards (model
    chunks, each ``1 / v`` of the stage) before the first backward, capped at the step's ``m v``;
    one more forward starts before that backward frees anything. The first stage's
    ``(2 (p - 1) + (v - 1) p + 1) / v = p + (p - 1) / v`` is the ``1 + (p - 1) / (p v)`` factor
    of Korthikanti et al. 2022 (arXiv:2205.05198, s. 4.2.3).
    """
    warm = 2 * (p - rank - 1) + (v - 1) * p
    return min(warm + 1, m * v) / v


def _check(name: str, p: int, m: int, v: int, F: float, B: float, W: float) -> None:
    if name not in SCHEDULES:
        raise UsageError(f"unknown pipeline schedule {name!r}; accepted: {', '.join(SCHEDULES)}")
    if name == "interleaved":
        if v < 2:
            raise UsageError(f"interleaved needs v >= 2 model chunks per device, got v={v}; "
                             "use 1f1b for v=1")
        # Megatron-LM schedules.py, forward_backward_pipelining_with_interleaving: up to
        # core_r0.9.0 'number of microbatches ... is not divisible by pipeline-model-parallel-
        # size'; since commit 4295be1a6c (Nov 2024) a remainder of m over the group size
        # (default p) in (0, p) is refused, so with the default m must still be a multiple of p.
        if m % p:
            raise UsageError(f"interleaved needs m a multiple of p (Megatron-LM schedules.py), "
                             f"got m={m}, p={p}")
    elif v != 1:
        raise UsageError(f"schedule {name} has no virtual stages: v must be 1, got v={v}; "
                         "use interleaved")
    if name.startswith("zb-"):
        least = p if name == "zb-h1" else 2 * p - 1
        if m < least:
            raise UsageError(f"{name} needs m >= {'p' if name == 'zb-h1' else '2p-1'} = {least} "
                             f"micro-batches (the paper's steady state), got m={m}")
        if W > F or W > B - W:
            raise UsageError(f"{name} needs the weight-gradient time W <= F and W <= B - W (where "
                             f"the paper's formula holds), got W={W}, F={F}, B={B}")
    elif W:
        raise UsageError(f"schedule {name} does not split the backward: W must be 0, got W={W}")


def schedule(name: str, p: int, m: int, v: int = 1, F: float = 1.0, B: float = 2.0,
             W: float = 0.0, message_bytes: int = 0) -> ScheduleResult:
    """The step of schedule ``name`` (one of :data:`SCHEDULES`) for ``p`` stages, ``m``
    micro-batches, ``v`` chunks per device, per-stage times ``F``, ``B`` (whole backward) and
    ``W`` (its weight-gradient part, zero-bubble only), and ``message_bytes`` per p2p message.

    Bad inputs raise :class:`gpumem.errors.UsageError` with one line naming the value.
    """
    _count(p, "p (pipeline stages)")
    _count(m, "m (micro-batches)")
    _count(v, "v (virtual stages per device)")
    _count(message_bytes, "message_bytes", least=0)
    F, B, W = _time(F, "F"), _time(B, "B"), _time(W, "W")
    if W > B:
        raise UsageError(f"W is part of the backward B: W must be <= B, got W={W}, B={B}")
    _check(name, p, m, v, F, B, W)
    work = m * (F + B)
    synced = None
    if name in ("gpipe", "1f1b"):
        bubble = (p - 1) * (F + B)
        held = float(m) if name == "gpipe" else float(min(p, m))
    elif name == "interleaved":
        bubble = (p - 1) * (F + B) / v
        held = interleaved_in_flight(p, m, v)
    elif name == "zb-h1":
        bubble = (p - 1) * (F + (B - W) - W)
        held = float(p)
    else:
        bubble = (p - 1) * (F + (B - W) - 2 * W)
        synced = work + (p - 1) * max(F, F + (B - W) - 2 * W)
        held = float(2 * p - 1)
    step = work + bubble
    sends = p2p_sends_per_rank(p, m, v)
    return ScheduleResult(
        schedule=name, p=p, m=m, v=v, step_time=step,
        step_time_synced=step if synced is None else synced, bubble_time=bubble,
        bubble_fraction=bubble / work if work else 0.0,
        idle_fraction=bubble / step if step else 0.0,
        in_flight_first=held, p2p_sends=sends, p2p_bytes=sends * message_bytes,
        source=SOURCES[name])
