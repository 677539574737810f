"""Questions as data: a multiple choice (:class:`Choice`) or a number (:class:`Numeric`), each
holding the numbers of the attempt on screen (:class:`Attempt`).

A numeric question may draw fresh numbers per attempt (``draw``) and compute its expected value
from them; an answer may carry a unit (:mod:`gpumem.course.answers`); known mistakes can have
their own hint (``traps``). The quiz (:mod:`gpumem.course.quiz`) grades, hints and reveals.
"""

import math
import random
from dataclasses import dataclass
from typing import Callable

from ..errors import UsageError
from .answers import fmt_number, to_unit


@dataclass
class Attempt:
    """The numbers on screen for one question and how the learner has fared on them."""
    numbers: dict
    tries: int = 0           # wrong answers on these numbers
    revealed: bool = False   # the answer was shown for these numbers
    solved: bool = False


def _render(text, numbers: dict) -> str:
    """A prompt, hint or explanation: a callable of the numbers, or a template filled with them."""
    if callable(text):
        return text(numbers)
    return text.format_map(numbers) if numbers else text


class _Asked:
    """What every question shares: the numbers on screen, drawn afresh per attempt."""
    draw = None

    def __post_init__(self):
        self.attempt = Attempt({})

    @property
    def drawn(self) -> bool:
        """Whether this question draws fresh numbers per attempt."""
        return self.draw is not None

    def redraw(self, rng: random.Random) -> None:
        """New numbers (if the question draws them) and a clean slate of tries."""
        self.attempt = Attempt(self.draw(rng) if self.draw else {})

    @property
    def numbers(self) -> dict:
        """The drawn numbers on screen (empty for a fixed question)."""
        return self.attempt.numbers

    def prompt_text(self) -> str:
        """The prompt with the numbers on screen."""
        return _render(self.prompt, self.numbers)

    def explanation_text(self) -> str:
        """The worked explanation for the numbers on screen."""
        return _render(self.explanation, self._context())

    def _context(self) -> dict:
        return self.numbers


@dataclass
class Choice(_Asked):
    """A multiple-choice question; ``answer`` is the index of the right option."""
    id: str
    prompt: str
    options: list[str]
    answer: int           # index into options
    explanation: str
    hint: str = ""

    def judge(self, value) -> tuple[bool | None, int | None, str]:
        """(right?, option index, note); right? is None when the value is not an option."""
        if value is None or (isinstance(value, str) and not value.strip()):
            return None, None, "pick an option first"
        if isinstance(value, str) and value in self.options:
            return self.options.index(value) == self.answer, self.options.index(value), ""
        try:
            index = int(value) if isinstance(value, int) else int(str(value)[:50].strip(), 10)
        except ValueError:
            index = None
        if isinstance(value, bool) or index is None or not 0 <= index < len(self.options):
            shown = "that number" if isinstance(value, int) and abs(value) > 10**50 else f"{value!r}"[:60]
            return None, None, (f"{shown} is not one of the options; answer with a number from 0 to "
                                f"{len(self.options) - 1} or an option's text")
        return index == self.answer, index, ""

    def grade(self, value) -> bool:
        """Whether ``value`` (an index or an option's text) is the right option."""
        return bool(self.judge(value)[0])

    def expected(self) -> str:
        """The right option's text."""
        return self.options[self.answer]

    def hint_for(self, got) -> str:
        """The hint shown after a first wrong answer."""
        return _render(self.hint, self.numbers)


@dataclass
class Numeric(_Asked):
    """A question answered with a number, right within ``rel_tol`` (or ``abs_tol``) of the answer.

    ``answer`` is a number, a callable of nothing, or, when ``draw`` (a function of a
    :class:`random.Random` returning the numbers of one attempt) is given, a callable of those
    numbers. ``traps`` are (wrong value as a function of the numbers, ``expected`` and ``unit``,
    hint) pairs for mistakes worth naming (matched within the question's tolerance, or 0.5 % for a
    wrong value that is not a whole number).
    A drawn ``"unit"`` in the numbers replaces :attr:`unit` for that attempt. Prompt, hint and
    explanation are templates filled with the numbers (and ``answer``, the expected value) or
    callables of them.
    """
    id: str
    prompt: str
    answer: float | Callable
    explanation: str
    unit: str = ""
    rel_tol: float = 0.02
    hint: str = ""
    draw: Callable[[random.Random], dict] | None = None
    abs_tol: float = 0.0
    traps: tuple = ()

    def unit_now(self) -> str:
        """The unit of the numbers on screen: a drawn ``"unit"``, else :attr:`unit`."""
        return self.numbers.get("unit", self.unit)

    def value(self) -> float:
        """The expected answer for the numbers on screen, in :attr:`unit`, computed now."""
        if self.draw is not None:
            return float(self.answer(self.numbers))
        return float(self.answer() if callable(self.answer) else self.answer)

    def close(self, got: float, want: float) -> bool:
        """Whether ``got`` counts as ``want`` under this question's tolerance."""
        return math.isclose(got, want, rel_tol=self.rel_tol, abs_tol=self.abs_tol)

    def judge(self, value) -> tuple[bool | None, float | None, str]:
        """(right?, value in the question's unit, conversion note); right? is None when unreadable."""
        try:
            got, note = to_unit(value, self.unit_now())
        except UsageError as err:
            return None, None, str(err)
        return self.close(got, self.value()), got, note

    def grade(self, value) -> bool:
        """Whether ``value`` (a number or text with a unit) is right for the numbers on screen."""
        return bool(self.judge(value)[0])

    def expected(self) -> str:
        """The expected answer with its unit, as shown to the learner."""
        return f"{fmt_number(self.value())} {self.unit_now()}".strip()

    def hint_for(self, got: float) -> str:
        """The hint after a first wrong answer: a trap's own hint if ``got`` matches it."""
        want = self.value()
        for wrong, hint in self.traps:
            trap = float(wrong({**self.numbers, "expected": want, "unit": self.unit_now()}))
            near = self.close(got, trap) or (not trap.is_integer() and math.isclose(got, trap, rel_tol=0.005))
            if near and not self.close(trap, want):
                return _render(hint, self._context())
        return _render(self.hint, self._context())

    def _context(self) -> dict:
        return {**self.numbers, "answer": fmt_number(self.value())}


Question = Choice | Numeric
