"""The claims ledger's machinery: the study note's figures against the library's, with a computed
verdict. Each chapter keeps its own claims (``gpumem/chapters/chNN_name/claims.py``).

Each :class:`Claim` holds the note's number (as the note states it) and a function that computes
ours. The verdict is arithmetic: *agrees* within 3 %, *close* within 15 %, else *wrong*. The
``why`` says what the note assumed or missed (see shared/reference/seed-errata.md for sources).
"""

from dataclasses import dataclass
from typing import Callable

from .. import units


@dataclass
class Claim:
    """One figure of the study note, with functions computing ours and explaining any gap."""
    id: str
    what: str
    note: float          # bytes (or a plain number when unit is "")
    ours: Callable[[], float]
    why: Callable[[], str]
    unit: str = "GB"

    def verdict(self) -> str:
        ours = self.ours()
        err = abs(self.note - ours) / ours
        return "agrees" if err <= 0.03 else "close" if err <= 0.15 else "wrong"

    def row(self) -> tuple[str, str, str, str, str]:
        fmt = (lambda v: units.fmt(v, "GB", 1)) if self.unit == "GB" else (lambda v: f"{v:,.4g} {self.unit}")
        return self.id, self.what, fmt(self.note), fmt(self.ours()), self.verdict()


def table(claims: list[Claim]) -> str:
    """The claims as an aligned text table: id, claim, the note's value, ours and the verdict."""
    rows = [("id", "claim", "note", "ours", "verdict")] + [c.row() for c in claims]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(f"{v:<{w}}" if i < 2 else f"{v:>{w}}" for i, (v, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def explanations(claims: list[Claim]) -> str:
    """Each claim's verdict with the reason behind it, one line per claim."""
    return "\n".join(f"[{c.id}] {c.verdict()}: {c.why()}" for c in claims)
