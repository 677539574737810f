"""Why the planner's top plan wins: two plans term by term, the runner-up, and how the answer moves
when one stated assumption moves (torch-free).

* :func:`versus` ``(a, b)``: every time term of ``planner.cost.step_seconds`` with its seconds in
  each plan and the difference (``b - a``), largest first; memory per GPU and headroom; the layout
  fields that differ; and which rule of ``planner.ranking`` puts one before the other.
  :func:`render_versus` writes it within 100 columns.
* :func:`runner_up` ``(result)``: the best plan of another kind than the top, a kind being the
  (tp, pp, cp, vp, ZeRO stage, hybrid sharding, offload and its device, Megatron-Core) combination:
  the plans just below the top are mostly the same layout with another micro-batch or checkpoint.
* :func:`sensitivity` ``(question)``: the planner asked again with one assumption changed at a
  time (:data:`FACTORS`): the kernel share (``Question.mfu``), the network between nodes
  (``Cluster.inter_node``, a multiple of the node's per-GPU line rate, ``result.question
  ["inter_node"]``), and CPU Adam's rate per node (``Cluster.cpu_adam_rate``, a multiple of
  ``offload_time.CPU_ADAM_NODE_RATE``, the ZeRO-Offload paper's Table 4 figure). Each line says
  whether the top layout changes, to what, at what step time, and where the old top now ranks.
  A question that gives its own offload ``links`` keeps its CPU Adam rate (the links carry it).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, fields, replace

from ..errors import UsageError
from ..timing import offload_time
from . import ranking
from .answer import Plan, Result
from .layout import Layout
from .question import Question
from .search import answer

WIDTH = 100
NOT_TERMS = ("total", "bound", "data_parallel_moved_s", "offload_terms")   # step_seconds' extra keys
# one assumption at a time, and the multiples asked (stated: a plausible spread, not a measured one)
FACTORS = {"mfu": (0.8, 1.2), "inter_node": (0.5, 2.0), "cpu_adam_rate": (0.5, 2.0)}
WORDS = {"mfu": "kernel share", "inter_node": "network between nodes", "cpu_adam_rate": "CPU Adam rate"}
# ranking.secondary_key's entries, in its order, in words (a test checks the count)
KEY_WORDS = ("roomy before tight (headroom under max(5 GB, 6 % of usable))", "mixed before pure bf16",
             "fewer bytes offloaded to host and drive", "fewer pipeline stages x context-parallel ways",
             "fewer bytes per GPU", "shorter step", "label order")


def terms(plan: Plan) -> dict:
    """The additive time terms of ``plan`` (they sum to its ``total``), in ``step_seconds``' order."""
    return {k: v for k, v in plan.time.items() if k not in NOT_TERMS}


def kind(lay: Layout) -> tuple:
    """What makes two layouts different kinds (see the module): not micro-batch, checkpoint, kernel."""
    return (lay.tp, lay.pp, lay.cp, lay.vp, lay.zero, lay.hybrid, lay.offload,
            lay.device if lay.offload != "none" else "", lay.mcore, lay.ep)


def layout_diff(a: Layout, b: Layout) -> list[tuple[str, object, object]]:
    """(field, a's value, b's value) for every field of the layouts that differs, framework included."""
    out = [(f.name, getattr(a, f.name), getattr(b, f.name)) for f in fields(Layout)
           if getattr(a, f.name) != getattr(b, f.name)
           and not (f.name == "device" and a.offload == b.offload == "none")]
    if a.framework != b.framework:
        out.append(("framework", a.framework, b.framework))
    return out


def decider(a: Plan, b: Plan, fastest: float | None = None) -> str:
    """Which rule of ``planner.ranking`` puts ``a`` before ``b`` (or ``b`` before ``a``), in words.
    ``fastest``: the step time that opens their tie group (default: the faster of the two)."""
    ta, tb = a.time["total"], b.time["total"]
    opener = min(ta, tb) if fastest is None else fastest
    first, second = (a, b) if ta <= tb else (b, a)
    if max(ta, tb) > opener * (1 + ranking.TIE):
        gap = max(ta, tb) - min(ta, tb)
        return (f"step time: {gap:.3f} s ({gap / min(ta, tb):.2%}) shorter; the slower plan lies outside the "
                f"{ranking.TIE:.1%} tie band that opens at the fastest plan ({opener:.3f} s)")
    ka, kb = ranking.secondary_key(a), ranking.secondary_key(b)
    i = next((j for j, (x, y) in enumerate(zip(ka, kb)) if x != y), len(ka) - 1)
    winner = a if ka < kb else b
    slower = "; the faster one loses" if winner is not first else ""
    return f"a tie (within {ranking.TIE:.1%} of {opener:.3f} s), broken by: {KEY_WORDS[i]}{slower}"


@dataclass
class Versus:
    """Two plans side by side (see :func:`versus`); ``rows``: (term, a s, b s, b - a s)."""
    a: Plan
    b: Plan
    rows: list
    layout: list
    decided_by: str
    names: tuple = ("a", "b")

    @property
    def difference(self) -> float:
        """Step time of ``b`` minus ``a``: the sum of the rows' differences."""
        return self.b.time["total"] - self.a.time["total"]


def versus(a: Plan, b: Plan, names: tuple = ("a", "b"), fastest: float | None = None) -> Versus:
    """``a`` against ``b`` term by term (differences ``b - a``, sorted by size, largest first),
    their layouts' differing fields and the ranking rule that orders them (:func:`decider`)."""
    ta, tb = terms(a), terms(b)
    rows = [(k, ta.get(k, 0.0), tb.get(k, 0.0), tb.get(k, 0.0) - ta.get(k, 0.0)) for k in dict.fromkeys([*ta, *tb])]
    rows.sort(key=lambda r: -abs(r[3]))
    return Versus(a, b, rows, layout_diff(a.layout, b.layout), decider(a, b, fastest), tuple(names))


def _wrap(text: str, width: int, indent: str = "  ") -> str:
    return textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False)


def render_versus(v: Versus, width: int = WIDTH, show: int | None = None) -> str:
    """:func:`versus` as text within ``width`` columns: the two labels, a term table (``show``: the
    first that many terms with seconds, the rest summed; terms at 0 s in both named on one line), the
    step, memory, what differs in the layout, the deciding rule."""
    na, nb = v.names
    w = max(len(na), len(nb), 9)
    lines = [_wrap(f"{na:<{w}} {v.a.layout.label()} ({v.a.layout.framework})", width, " " * (w + 1)),
             _wrap(f"{nb:<{w}} {v.b.layout.label()} ({v.b.layout.framework})", width, " " * (w + 1)),
             f"{'term':<20}{na[:12] + ' s':>15}{nb[:12] + ' s':>15}{(nb + ' - ' + na)[:17] + ' s':>19}"]
    moving = [r for r in v.rows if r[1] or r[2]]
    rows = moving if show is None else moving[:show]
    for k, x, y, d in rows:
        lines.append(f"{k:<20}{x:>15.3f}{y:>15.3f}{d:>+19.3f}")
    rest = moving[len(rows):]
    if rest:
        lines.append(f"{f'{len(rest)} other terms':<20}{sum(r[1] for r in rest):>15.3f}"
                     f"{sum(r[2] for r in rest):>15.3f}{sum(r[3] for r in rest):>+19.3f}")
    zero = [r[0] for r in v.rows if not (r[1] or r[2])]
    if zero:
        lines.append(_wrap("0 s in both: " + ", ".join(zero), width))
    lines.append(f"{'step':<20}{v.a.time['total']:>15.3f}{v.b.time['total']:>15.3f}{v.difference:>+19.3f}")
    ma, mb = v.a.memory, v.b.memory
    lines.append(f"{'per GPU, GB':<20}{ma['total'] / 1e9:>15.1f}{mb['total'] / 1e9:>15.1f}"
                 f"{(mb['total'] - ma['total']) / 1e9:>+19.1f}")
    lines.append(f"{'headroom, GB':<20}{ma['headroom'] / 1e9:>15.1f}{mb['headroom'] / 1e9:>15.1f}"
                 f"{(mb['headroom'] - ma['headroom']) / 1e9:>+19.1f}")
    if ma.get("host", 0) or mb.get("host", 0):
        lines.append(f"{'host per GPU, GB':<20}{ma['host'] / 1e9:>15.1f}{mb['host'] / 1e9:>15.1f}"
                     f"{(mb['host'] - ma['host']) / 1e9:>+19.1f}")
    diff = "; ".join(f"{k} {x} -> {y}" for k, x, y in v.layout) or "none"
    lines.append(_wrap(f"layout {na} -> {nb}: {diff}", width))
    lines.append(_wrap(f"order decided by {v.decided_by}", width))
    return "\n".join(lines)


def runner_up(result: Result) -> Plan | None:
    """The best plan whose :func:`kind` differs from the top plan's, or None."""
    if not result.plans:
        return None
    top = kind(result.best.layout)
    return next((p for p in result.plans[1:] if kind(p.layout) != top), None)


def fastest_time(result: Result) -> float:
    """The shortest step of any fitting plan: it opens the top plan's tie group."""
    return min(p.time["total"] for p in result.plans)


def top_vs_runner_up(result: Result) -> Versus | None:
    """:func:`versus` of the top plan against :func:`runner_up` (None when there is no other kind)."""
    second = runner_up(result)
    if second is None:
        return None
    return versus(result.best, second, ("top", "runner-up"), fastest_time(result))


@dataclass
class Line:
    """One changed assumption: ``name`` (a key of :data:`FACTORS`), ``factor``, the value asked
    (``value``, against ``base_value``), the new answer's top plan (``top``, None if nothing fits),
    whether its layout or its :func:`kind` differs from the base top's, the base top's layout's rank
    and step in the new answer (None if it no longer fits, else ``old``: that plan), and
    ``leaders``: the new answer's first distinct plans."""
    name: str
    factor: float
    value: float
    base_value: float
    top: Plan | None
    changed: bool
    kind_changed: bool
    old_rank: int | None
    old_step: float | None
    leaders: list = field(default_factory=list)
    refused: str = ""
    old: Plan | None = None   # the base top's layout as the new answer prices it
    fastest: float | None = None   # the new answer's shortest step (it opens the top's tie group)


@dataclass
class Sensitivity:
    """The base answer and one :class:`Line` per changed assumption (:func:`sensitivity`)."""
    base: Result
    lines: list


def _changed(q: Question, name: str, value: float) -> Question:
    if name == "mfu":
        return replace(q, mfu=value)
    return replace(q, cluster=replace(q.cluster, **{name: value}))


def base_values(result: Result) -> dict:
    """The value each assumption of :data:`FACTORS` had in ``result``'s question."""
    q = result.asked
    adam = q.cluster.cpu_adam_rate
    return {"mfu": q.mfu, "inter_node": float(result.question["inter_node"]),
            "cpu_adam_rate": offload_time.CPU_ADAM_NODE_RATE if adam is None else float(adam)}


def sensitivity(question: Question | Result, top_k: int = 3, factors: dict | None = None) -> Sensitivity:
    """The planner asked ``question`` again with one assumption of ``factors`` (default
    :data:`FACTORS`: name -> multiples) changed at a time; ``question`` may be an answered
    :class:`Result` (its question is reused, its answer is the base). ``top_k``: distinct plans kept
    per line (``leaders``). A value the engine refuses (e.g. a CPU Adam rate above the node's DRAM
    bound) gives a line with ``refused`` set."""
    base = question if isinstance(question, Result) else answer(question)
    q = base.asked
    if base.best is None:
        raise UsageError("nothing fits this question: there is no top plan to test")
    top = base.best.layout
    values = base_values(base)
    lines = []
    for name, multiples in (FACTORS if factors is None else factors).items():
        if name == "cpu_adam_rate" and q.cluster.links is not None:
            continue   # the question's own links fix CPU Adam's rate
        for f in multiples:
            value = values[name] * f
            try:
                r = answer(_changed(q, name, value))
            except UsageError as e:
                lines.append(Line(name, f, value, values[name], None, True, True, None, None, refused=str(e)))
                continue
            new = r.best
            old = next(((i, p) for i, p in enumerate(r.plans, 1) if p.layout == top), (None, None))
            lines.append(Line(name, f, value, values[name], new, new is None or new.layout != top,
                              new is None or kind(new.layout) != kind(top), old[0],
                              old[1].time["total"] if old[1] else None, r.distinct(top_k), old=old[1],
                              fastest=fastest_time(r) if r.plans else None))
    return Sensitivity(base, lines)


def _value(name: str, v: float) -> str:
    if name == "mfu":
        return f"{v:.0%}"
    if name == "inter_node":
        return f"{v / 1e9:g} GB/s per GPU"
    return f"{v / 1e9:.2f} G params/s per node"


def render_sensitivity(s: Sensitivity, width: int = WIDTH) -> str:
    """One paragraph per line of :func:`sensitivity`, within ``width`` columns, after the base top."""
    b = s.base.best
    out = [_wrap(f"base: {b.layout.label()}, {b.time['total']:.2f} s", width)]
    for ln in s.lines:
        head = (f"{WORDS[ln.name]} x{ln.factor:g} ({_value(ln.name, ln.base_value)} -> "
                f"{_value(ln.name, ln.value)}): ")
        if ln.refused:
            out.append(_wrap(head + "refused: " + ln.refused, width))
            continue
        if ln.top is None:
            out.append(_wrap(head + "nothing fits", width))
            continue
        if not ln.changed:
            text = f"top unchanged, {ln.top.time['total']:.2f} s"
        else:
            what = "another kind" if ln.kind_changed else "the same kind, retuned"
            old = "the old top no longer fits"
            if ln.old is not None:
                k, _, _, d = versus(ln.top, ln.old).rows[0]
                old = (f"the old top ranks {ln.old_rank} at {ln.old_step:.2f} s, its largest difference from "
                       f"the new top {k} {d:+.2f} s; order decided by {decider(ln.top, ln.old, ln.fastest)}")
            text = f"top changes ({what}) to {ln.top.layout.label()}, {ln.top.time['total']:.2f} s; {old}"
        out.append(_wrap(head + text, width))
    return "\n".join(out)
