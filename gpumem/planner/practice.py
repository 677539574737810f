"""The planner's top plan against the layout a published run used: same or not, and why.

Each row of :func:`gpumem.planner.validate.rows` already asks the planner the run's question (its
model, GPU count, GPU and node, sequence and global batch, the mixed recipe) and keeps two plans:
the run's own layout priced by ``plan --layout`` (``Row.plan``) and the search's first plan
(``Row.top``). :func:`compare_plans` sets them side by side: whether the layouts are the same
(every field of :data:`~gpumem.planner.validate.FIELDS`: tp, cp, pp, dp, vp, ZeRO, checkpoint,
micro-batch, recipe, attention kernel, offload and its device, hybrid sharding and its group), and
where they differ, the seconds of each term of the step (``cost.step_seconds``: compute,
attention scores, bubble, tensor-, context- and data-parallel traffic, pipeline sends, optimizer,
offload) in the top plan minus the run's. Those differences add up to the difference of the step
times, so the terms that decide it (:func:`deciding`) are read off the numbers, and so is the one
sentence of :func:`sentence`. Nothing here runs a search: :func:`comparisons` reuses the cached
rows.
"""

from dataclasses import dataclass, replace

from . import validate

NOT_TERMS = ("total", "data_parallel_moved_s")   # numbers of the time dict that are not step terms
WORDS = {"compute": "compute", "attention_scores": "attention-score term", "pipeline_bubble": "bubble",
         "tensor_parallel": "tensor-parallel term", "context_parallel": "context-parallel term",
         "pipeline_p2p": "pipeline-send term", "data_parallel": "data-parallel term",
         "optimizer": "optimizer step", "offload": "offload term"}
SHORT = {"compute": "compute", "attention_scores": "attn scores", "pipeline_bubble": "bubble",
         "tensor_parallel": "tensor par", "context_parallel": "context par", "pipeline_p2p": "pp sends",
         "data_parallel": "data par", "optimizer": "optimizer", "offload": "offload"}
CKPT = {"none": "", "full": "full", "every-2": "ev2", "every-other": "ev-oth", "selective": "sel"}
TIE = 0.005     # the ranking's tie: step times within 0.5 % (planner.search / planner.ranking)
GB = 1e9


def terms(time: dict) -> dict:
    """The step's terms of a plan's ``time`` dict: every number but the total (and the
    data-parallel bytes' seconds before overlap, a diagnostic)."""
    return {k: v for k, v in time.items()
            if k not in NOT_TERMS and isinstance(v, (int, float)) and not isinstance(v, bool)}


def short(lay) -> str:
    """A layout in a few words: ``tp8 cp2 pp4 dp4 v5 z1 mb1 sel`` (cp and v when > 1; the
    checkpoint policy when not none; then a recipe other than mixed, an attention kernel other than
    flash, offload (``off=opt``: the optimizer, ``off=all``: optimizer and parameters; ``:nvme``
    when on the drives) and hybrid sharding with its group)."""
    parts = [f"tp{lay.tp}"] + ([f"cp{lay.cp}"] if lay.cp > 1 else []) + [f"pp{lay.pp}", f"dp{lay.dp}"]
    parts += ([f"v{lay.vp}"] if lay.vp > 1 else []) + [f"z{lay.zero}", f"mb{lay.micro_batch}"]
    parts += [CKPT.get(lay.checkpoint, lay.checkpoint)] + ([lay.attention] if lay.attention != "flash" else [])
    if lay.recipe != "mixed":
        parts.append(lay.recipe)
    if lay.offload != "none":
        parts.append(f"off={'opt' if lay.offload == 'optimizer' else 'all'}" + (":nvme" if lay.device == "nvme" else ""))
    if getattr(lay, "hybrid", "none") != "none":
        parts.append(f"{lay.hybrid}{lay.group}")
    return " ".join(p for p in parts if p)


def changes(run_lay, top_lay) -> tuple[tuple[str, object, object], ...]:
    """(short name, run's value, top's value) of every field of :data:`validate.FIELDS` that differs."""
    out = []
    for f, name in validate.FIELDS:
        a, b = getattr(run_lay, f, None), getattr(top_lay, f, None)
        if f == "device" and run_lay.offload == "none" and top_lay.offload == "none":
            continue                     # the device of no offload is not a choice
        if a != b:
            out.append((name, a, b))
    return tuple(out)


def deciding(diffs: dict) -> tuple[str, ...]:
    """The terms that decide a difference: the fewest largest (by size) whose sum is at least the
    whole difference, on its side (the rest can only cancel each other); () when nothing differs."""
    total = sum(diffs.values())
    out, acc = [], 0.0
    for k in sorted(diffs, key=lambda k: -abs(diffs[k])):
        if abs(diffs[k]) < 1e-12:
            break
        out.append(k)
        acc += diffs[k]
        if acc * total > 0 and abs(acc) >= abs(total) - 1e-12:
            break
    return tuple(out)


@dataclass(frozen=True)
class Comparison:
    """A run's own layout against the planner's top plan for the same question. ``diffs``: seconds
    of each term, top minus run (negative: the top plan's term is shorter); memory in bytes per
    GPU; ``over``: bytes the run's layout needs above the usable memory (0 when it fits)."""
    key: str
    run_short: str
    top_short: str
    same: bool
    changes: tuple
    diffs: dict
    run_total: float
    top_total: float
    deciding: tuple
    run_memory: tuple            # (total, headroom)
    top_memory: tuple
    fits: bool
    over: int
    why_not: tuple
    outside: tuple
    sentence: str

    @property
    def difference(self) -> float:
        """Top plan's step minus the run's, seconds."""
        return self.top_total - self.run_total

    @property
    def ratio(self) -> float:
        """The run's step over the top plan's (above 1: the planner's plan is faster)."""
        return self.run_total / self.top_total


def compare_plans(key: str, run_plan, top_plan, fits: bool = True, why_not=(), outside=()) -> Comparison:
    """The comparison of ``run_plan`` (a run's own layout, priced) with ``top_plan`` (see the
    module); ``fits``, ``why_not``, ``outside``: as :class:`validate.Row` has them."""
    a, b = terms(run_plan.time), terms(top_plan.time)
    diffs = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in dict.fromkeys([*a, *b])}
    ch = changes(run_plan.layout, top_plan.layout)
    mem = [(p.memory["total"], p.memory["headroom"]) for p in (run_plan, top_plan)]
    over = max(0, -run_plan.memory["headroom"])
    c = Comparison(key, short(run_plan.layout), short(top_plan.layout), not ch, ch, diffs,
                   run_plan.time["total"], top_plan.time["total"], deciding(diffs) if ch else (),
                   mem[0], mem[1], fits, over, tuple(why_not), tuple(outside), "")
    return replace(c, sentence=sentence(c, run_plan.memory["usable"]))


def _move(name: str, a, b) -> str:
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        return f"{'raises' if b > a else 'drops'} {name} from {a} to {b}"
    return f"switches {name} from {a} to {b}"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def sentence(c: Comparison, usable: float) -> str:
    """Why the planner's top plan is or is not the run's layout, in one sentence from the numbers."""
    gb = lambda m: f"{m[0] / GB:.1f} GB (headroom {m[1] / GB:.1f} GB)"    # noqa: E731
    if c.same:
        return (f"the planner's top plan is the run's own layout, {c.run_short}: {c.run_total:.2f} s a step, "
                f"{gb(c.run_memory)} per GPU.")
    head = ""
    if not c.fits:
        lack = f"{c.over / GB:.1f} GB over the usable {usable / GB:.1f} GB" if c.over else "; ".join(c.why_not)
        head = f"the run's layout does not fit the planner's memory model ({lack}); "
    big = [k for k in sorted(c.diffs, key=lambda k: -abs(c.diffs[k]))[:2] if abs(c.diffs[k]) >= 0.005]
    how = [f"the {WORDS.get(k, k)} is {abs(c.diffs[k]):.2f} s {'shorter' if c.diffs[k] < 0 else 'longer'}"
           for k in big] or ["no term moves by 0.01 s"]
    out = (f"{head}the planner's plan {_join([_move(*x) for x in c.changes])}: {_join(how)}; its step "
           f"takes {c.top_total:.2f} s against the run's {c.run_total:.2f} s")
    tie = abs(c.difference) <= TIE * min(c.run_total, c.top_total)
    notes = ["a tie within 0.5 %"] if tie else []
    if c.fits and c.outside:
        notes.append(f"no fitting plan of the search has {_join(list(c.outside))}")
    if c.fits and c.difference > 0 and not tie:
        notes.append("the run's layout is faster")
    if notes:
        out += f" ({'; '.join(notes)})"
    return out + f"; per GPU {gb(c.top_memory)} against {gb(c.run_memory)}."


def compare(row: validate.Row) -> Comparison | None:
    """``row``'s comparison; None for a run out of scope or a question with no fitting plan."""
    if row.plan is None or row.top is None:
        return None
    return compare_plans(row.run.key, row.plan, row.top, bool(row.fits), row.why_not, row.outside)


def comparisons(rows: list[validate.Row] | None = None) -> list[tuple[validate.Row, Comparison | None]]:
    """Every published run with its comparison (the rows: :func:`validate.rows`, cached)."""
    rows = rows if rows is not None else validate.rows()
    return [(r, compare(r)) for r in rows]
