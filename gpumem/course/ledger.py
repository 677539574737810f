"""The claims ledger's machinery: the study note's figures against the library's, with a computed
verdict. Each chapter keeps its own claims (``gpumem/chapters/chNN_name/claims.py``).

Each :class:`Claim` holds the note's number (as the note states it) and a function that computes
ours. The verdict is arithmetic (:func:`grade`): *agrees* within 3 %, *close* within 15 %, else
*wrong*. The ``why`` says what the note assumed or missed (see shared/reference/seed-errata.md for
sources).

The note counts 2 + 2 + 4 bytes per parameter (bf16 weights and gradients, 4 bytes of optimizer
state: the library's ``pure-bf16`` recipe) where the standard is mixed precision's 16. A claim
whose figure depends on the recipe may carry ``ours_note``, ours under the note's own recipe;
:func:`table_two` then grades it twice, under the note's recipe first (is its arithmetic right on
its own terms?) and under the standard recipe (is it right for the training people run?).
"""

import textwrap
from dataclasses import dataclass
from typing import Callable

from .. import units


def grade(note: float, ours: float) -> str:
    """The verdict on a note's figure against ours: agrees (3 %), close (15 %), else wrong."""
    err = abs(note - ours) / ours
    return "agrees" if err <= 0.03 else "close" if err <= 0.15 else "wrong"


@dataclass
class Claim:
    """One figure of the study note, with functions computing ours and explaining any gap.

    ``ours`` is computed for the standard training recipe (mixed precision) or for whatever the
    claim is about; ``ours_note``, where given, is the same figure under the note's own recipe."""
    id: str
    what: str
    note: float          # bytes (or a plain number when unit is "")
    ours: Callable[[], float]
    why: Callable[[], str]
    unit: str = "GB"
    ours_note: Callable[[], float] | None = None

    def verdict(self) -> str:
        return grade(self.note, self.ours())

    def verdict_note(self) -> str | None:
        """The verdict under the note's own recipe, or None when the recipe does not enter."""
        return None if self.ours_note is None else grade(self.note, self.ours_note())

    def fmt(self, v: float) -> str:
        """A value of this claim in its unit (GB for bytes)."""
        return units.fmt(v, "GB", 1) if self.unit == "GB" else f"{v:,.4g} {self.unit}"

    def row(self) -> tuple[str, str, str, str, str]:
        return self.id, self.what, self.fmt(self.note), self.fmt(self.ours()), self.verdict()


def table(claims: list[Claim]) -> str:
    """The claims as an aligned text table: id, claim, the note's value, ours and the verdict."""
    rows = [("id", "claim", "note", "ours", "verdict")] + [c.row() for c in claims]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(f"{v:<{w}}" if i < 2 else f"{v:>{w}}" for i, (v, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def table_two(claims: list[Claim], width: int = 100) -> str:
    """The claims graded twice, at most ``width`` characters a line: ours and the verdict under
    the note's recipe (2 + 2 + 4 B/param, ``pure-bf16``), then under the standard recipe. The
    claim's text wraps in its column; "-" in the note's-recipe columns: the recipe does not enter
    that figure, so the standard columns judge it alone."""
    rows = []
    for c in claims:
        mine = c.ours_note is not None
        rows.append((c.id, c.what, c.fmt(c.note), c.fmt(c.ours_note()) if mine else "-",
                     c.verdict_note() or "-", c.fmt(c.ours()), c.verdict()))
    head = [("", "", "", "note's recipe", "", "standard", ""), ("id", "claim", "note", "ours", "verdict", "ours", "verdict")]
    fixed = [max(len(r[i]) for r in rows + head[1:]) for i in range(7)]
    fixed[3] = max(fixed[3], fixed[4] + 2)
    fixed[5] = max(fixed[5], fixed[6] + 2)
    fixed[1] = max(20, width - sum(fixed[i] for i in (0, 2, 3, 4, 5, 6)) - 2 * 6)

    def line(cells):
        return "  ".join(f"{v:<{w}}" if i < 2 else f"{v:>{w}}" for i, (v, w) in enumerate(zip(cells, fixed))).rstrip()

    def group_head():
        pads = ["", "", "", ""]
        left = line(pads + ["", "", ""])[: sum(fixed[:3]) + 2 * 3]
        a = "note's recipe".center(fixed[3] + fixed[4] + 2)
        b = "standard".center(fixed[5] + fixed[6] + 2)
        return (f"{left:<{sum(fixed[:3]) + 2 * 3}}{a}  {b}").rstrip()

    out = [group_head(), line(head[1]), "-" * min(width, sum(fixed) + 2 * 6)]
    for r in rows:
        parts = textwrap.wrap(r[1], fixed[1]) or [""]
        out.append(line((r[0], parts[0], *r[2:])))
        out.extend(line(("", p, "", "", "", "", "")) for p in parts[1:])
    return "\n".join(out)


def explanations(claims: list[Claim], width: int | None = 100) -> str:
    """Each claim's verdict with the reason behind it, one paragraph per claim; a claim graded
    under both recipes gives both verdicts. Each paragraph wraps at ``width`` columns, at word
    boundaries (continuation lines indented); None: one line a claim."""
    out = []
    for c in claims:
        head = (f"[{c.id}] note's recipe: {c.verdict_note()}; standard: {c.verdict()}"
                if c.ours_note is not None else f"[{c.id}] {c.verdict()}")
        text = f"{head}: {c.why()}"
        out.append(textwrap.fill(text, width, subsequent_indent="    ", break_long_words=False,
                                 break_on_hyphens=False) if width else text)
    return "\n".join(out)
