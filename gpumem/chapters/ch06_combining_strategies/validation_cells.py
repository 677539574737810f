"""Chapter 06's validation cells: every published run's priced layout, the fields its source left
out, where the planner's search ranks it and how far the search's best is, the calibration, and
(:func:`top_vs_published`) the planner's top plan against the layout each run used. The rows are
:func:`gpumem.planner.validate.rows` and the comparisons :mod:`gpumem.planner.practice`'s; nothing
here prices anything."""

import textwrap

from gpumem import planner
from gpumem.memory import gpus
from gpumem.planner import practice, validate
from gpumem.timing.compute import KERNEL_SHARE

WIDTH = 100


def family(row: validate.Row) -> str:
    """The framework family of a run: Megatron-LM, NeMo, torchtitan or Meta."""
    return row.run.framework.split(" ")[0]


def why_not(row: validate.Row) -> list[str]:
    """Why ``row``'s layout does not fit the course's budget (the planner's own words, kept in the
    row by :func:`validate.price`)."""
    return list(row.why_not)


def speed_vs_best(row: validate.Row) -> str:
    """The run's step against the search's best plan for the same question, in words."""
    if row.vs_best is None:
        return "the search finds no plan that fits"
    tie = 1 / (1 + planner.TIE)
    faster = (": faster than every plan the search proposes" if row.vs_best < tie
              else ": a tie with it (within the ranking's 0.5 % band)" if row.vs_best < 1 else "")
    return f"its step takes {row.vs_best:.2f}x the search's best ({row.best}){faster}"


def legend() -> str:
    """What each filled-in field was priced as (:data:`validate.FILL`, :data:`validate.CKPT`)."""
    parts = [f"{k}={v}: {why}" for k, (v, why) in validate.FILL.items()]
    parts += [f"ckpt={k} -> {v}: {why}" for k, (v, why) in validate.CKPT.items()]
    return textwrap.fill("Where a source is silent the field is priced as: " + "; ".join(parts) + ".", WIDTH)


def row_lines(row: validate.Row) -> list[str]:
    """One run: key, framework, GPUs, sequence; the full ``--layout`` priced and the fields filled
    in; rank, or why it does not fit; the step against the search's best; the miss, if any."""
    run, g = row.run, gpus.get(row.run.gpu)
    assumed = ", ".join(a.split(":")[0] for a in row.assumed) or "nothing"
    out = [f"{run.key}: {run.framework}, {run.gpus} x {g.label}, sequence {run.seq:,}",
           f"--layout {row.layout}; assumed: {assumed}"]
    if row.predicted is None:
        return out + [f"out of scope: {row.note}"]
    if row.fits:
        out.append(f"rank {row.rank} of {row.fitting} fitting plans; {speed_vs_best(row)}")
    else:
        out.append(f"does not fit: {'; '.join(why_not(row))}; priced anyway, {speed_vs_best(row)}")
    if row.note:
        out.append(("" if row.run.key == validate.CALIBRATION else "miss: ") + row.note)
    return out


def row_details(rows: list[validate.Row]) -> str:
    """:func:`legend`, then every row's :func:`row_lines`, wrapped to :data:`WIDTH` columns."""
    text = [legend()]
    for row in rows:
        first, *rest = row_lines(row)
        text.append(first)
        text += [textwrap.fill(line, WIDTH, initial_indent="    ", subsequent_indent="      ",
                               break_on_hyphens=False) for line in rest]
    return "\n".join(text)


def calibration_line(rows: list[validate.Row]) -> str:
    """The calibration run's ratio at :data:`KERNEL_SHARE` and the share that would match it exactly
    (compute seconds scale as 1 / share, and the run's step is almost all compute)."""
    row = next(r for r in rows if r.run.key == validate.CALIBRATION)
    exact = KERNEL_SHARE / row.ratio
    used = ("used as it is" if abs(exact - KERNEL_SHARE) < 0.0005 else
            f"rounded {'down' if KERNEL_SHARE < exact else 'up'} to {KERNEL_SHARE:.2f}")
    return textwrap.fill(
        f"calibration: at a kernel share of {KERNEL_SHARE:.0%} the model predicts {row.ratio:.3f} of "
        f"{row.run.key}'s published tokens/s, so the share that matches it is {KERNEL_SHARE:.2f} / "
        f"{row.ratio:.3f} = {exact:.3f}, {used} for every run (the run's step is {row.bound}-bound).",
        WIDTH)


def family_ranges(rows: list[validate.Row]) -> str:
    """The predicted/published ratios of each framework family (the calibration run left out)."""
    fams: dict[str, list[float]] = {}
    for r in rows:
        if r.ratio is not None and r.run.key != validate.CALIBRATION:
            fams.setdefault(family(r), []).append(r.ratio)
    parts = [f"{f} {min(v):.2f}-{max(v):.2f} ({len(v)} run{'s' if len(v) > 1 else ''})" for f, v in fams.items()]
    return textwrap.fill("ratio by family, the calibration run left out: " + "; ".join(parts), WIDTH)


def top_vs_published(rows: list[validate.Row] | None = None) -> str:
    """Each published run's layout (``run``) above the planner's top plan for the same question
    (``top``): the short forms (:func:`practice.short`), each step in seconds, whether they are the
    same layout, the term whose difference (top minus run) is largest and its seconds, and the
    run's step over the top plan's (above 1: the planner's plan is faster); then a count and one
    sentence per run (:func:`practice.sentence`), wrapped to :data:`WIDTH` columns."""
    pairs = practice.comparisons(rows)
    lines = [f"{'run':<25}{'':4}{'layout':<32}{'step s':>7} {'same':<5}{'term: top - run':<18}"
             f"{'run/top':>8}"]
    notes = []
    for row, c in pairs:
        key = row.run.key
        if c is None:
            why = "out of scope" if row.predicted is None else "no plan of the search fits"
            lines.append(f"{key:<25}run {validate.layout_short(row):<32}{'-':>7} {why}")
            notes.append(f"{key}: {why}: {row.note or 'nothing to compare'}.")
            continue
        k = c.deciding[0] if c.deciding else None
        term = f"{practice.SHORT.get(k, k)} {c.diffs[k]:+.2f} s" if k else "-"
        lines.append(f"{key:<25}run {c.run_short:<32}{c.run_total:>7.2f} {'yes' if c.same else 'no':<5}"
                     f"{term:<19}{c.ratio:>7.2f}")
        lines.append(f"{'':<25}top {c.top_short:<32}{c.top_total:>7.2f}")
        notes.append(f"{key}: {c.sentence}")
    done = [c for _, c in pairs if c is not None]
    tie = [c for c in done if not c.same and abs(c.difference) <= practice.TIE * c.run_total]
    count = (f"The planner's top plan is the run's own layout for {sum(c.same for c in done)} of the "
             f"{len(done)} runs priced; {sum(not c.fits for c in done)} runs' layouts do not fit its "
             f"memory model; {len(tie)} other layouts tie with the top plan (within 0.5 %) and "
             f"{sum(c.fits and c.difference > 0 and c not in tie for c in done)} that fit are faster.")
    text = [textwrap.fill(n, WIDTH, subsequent_indent="    ", break_on_hyphens=False)
            for n in [count] + notes]
    return "\n".join(lines + [""] + text)
