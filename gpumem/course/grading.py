"""Grading for labs: run the learner's functions on cases, compare with independent references.

A lab's ``check()`` builds a :class:`Report`. Each row says which function and case, and either
``ok``, ``todo`` (the function still raises ``NotImplementedError``), ``wrong`` (expected vs got)
or ``error`` (the exception it raised). A report never raises, so an unsolved lab can be checked.
"""

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Row:
    """One graded case: the function, the case, its status and what went wrong."""
    function: str
    case: str
    status: str   # ok | todo | wrong | error
    detail: str = ""


@dataclass
class Report:
    """A lab's graded rows and their summary; the lab is solved once every row is ok."""
    lab: str
    rows: list[Row] = field(default_factory=list)

    @property
    def solved(self) -> bool:
        return bool(self.rows) and all(r.status == "ok" for r in self.rows)

    @property
    def todo(self) -> list[str]:
        """Functions not written yet, in the order the lab asks for them."""
        return list(dict.fromkeys(r.function for r in self.rows if r.status == "todo"))

    @property
    def problems(self) -> list[Row]:
        return [r for r in self.rows if r.status in ("wrong", "error")]

    def summary(self) -> str:
        ok = sum(r.status == "ok" for r in self.rows)
        lines = [f"{self.lab}: {ok}/{len(self.rows)} checks pass"]
        if self.todo:
            lines.append("still to do: " + ", ".join(self.todo))
        for r in self.problems:
            lines.append(f"  {r.status.upper()} {r.function} [{r.case}]: {r.detail}")
        if self.solved:
            lines.append("all correct — well done.")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer, cycle):  # IPython display
        printer.text(self.summary())


def grade(report: Report, name: str, fn: Callable | None, cases: list[tuple[str, dict, Any]],
          compare: Callable[[Any, Any], bool] | None = None, show: Callable[[Any], str] = repr) -> None:
    """Run ``fn(**kwargs)`` for each ``(case, kwargs, expected)`` and add a row per case."""
    compare = compare or (lambda got, want: got == want)
    for case, kwargs, expected in cases:
        if fn is None:
            report.rows.append(Row(name, case, "todo", f"define {name}"))
            continue
        try:
            got = fn(**kwargs)
        except NotImplementedError:
            report.rows.append(Row(name, case, "todo", f"{name} still raises NotImplementedError"))
            continue
        except Exception as err:  # the learner's bug, reported, not raised
            report.rows.append(Row(name, case, "error", f"{type(err).__name__}: {err}"))
            continue
        if compare(got, expected):
            report.rows.append(Row(name, case, "ok"))
        else:
            report.rows.append(Row(name, case, "wrong", f"expected {show(expected)}, got {show(got)}"))
