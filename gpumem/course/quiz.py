"""Quizzes: questions as data, shown as widgets (JupyterLab) or plain text (nbval, terminals).

A quiz checks reasoning, so a numeric question can draw fresh numbers (model, GPU, GPU count,
sequence, recipe) for every attempt, and its expected value is computed by the library for the
numbers on screen; it never drifts from the chapter. Numbers come from the quiz's generator:
seeded by :meth:`Quiz.seed` (tests), by ``$GPUMEM_QUIZ_SEED`` (stored notebook outputs), random
otherwise. Answers may carry a unit (``"317.5 GB"``, ``"74.5 GiB"``, ``"16 B"``), converted to
the question's unit (:mod:`gpumem.course.answers`).

A wrong answer gets a hint first (a specific one when it matches a known mistake); the answer is
shown after a second wrong try or on request: ``quiz.answer("id", "show")`` in text mode, the
"Show answer" button in a widget. Progress is saved to ``~/.gpumem/progress.json``
(``$GPUMEM_HOME`` overrides the folder; :mod:`gpumem.course.progress`).

Plain-text mode is used when ``GPUMEM_QUIZ_MODE=text`` (``make test`` sets it for nbval) or when
no IPython kernel is running; answer there with ``quiz.answer("id", value)``.
"""

import os
import random
from dataclasses import dataclass, field

from .answers import describe
from .progress import load_progress, progress_file, save_result, save_reveal
from .questions import Attempt, Choice, Numeric, Question

__all__ = ["Attempt", "Choice", "Numeric", "Question", "Quiz", "checklist", "widgets_available",
           "progress_file", "load_progress", "save_result", "REVEAL"]

REVEAL = ("show", "show answer", "answer", "reveal", "?")


@dataclass
class Quiz:
    """A named list of questions, shown as widgets or text and answered with :meth:`answer`."""
    name: str
    questions: list[Question] = field(default_factory=list)
    widget: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self._rng = None
        self.renew(quiet=True)

    def generator(self) -> random.Random:
        """The quiz's random numbers: ``$GPUMEM_QUIZ_SEED`` seeds them if set."""
        if self._rng is None:
            env = os.environ.get("GPUMEM_QUIZ_SEED")
            self._rng = random.Random(f"{env}:{self.name}") if env else random.Random()
        return self._rng

    def seed(self, seed) -> "Quiz":
        """Seed the generator and draw every question's numbers again (tests, reproducible outputs)."""
        self._rng = random.Random(f"{seed}:{self.name}")
        self.renew(quiet=True)
        return self

    def _get(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise KeyError(f"no question {qid!r} in quiz {self.name!r}; ids: {[q.id for q in self.questions]}")

    def renew(self, qid: str | None = None, quiet: bool = False) -> None:
        """Draw new numbers for one question (or all) and print its new prompt unless ``quiet``."""
        for q in [self._get(qid)] if qid else self.questions:
            q.redraw(self.generator())
            if not quiet:
                print(fit(f"[{q.id}] {q.prompt_text()}", "   "))

    def judge(self, qid: str, value) -> tuple[bool | None, str, list]:
        """Grade one answer (or a request for the answer) without saving it.

        Returns (right?, text, saves): right? is None when nothing was graded (unreadable value,
        answer shown); ``saves`` is what :meth:`record` writes to the progress file once the
        text has been shown. A value that cannot be read is not an attempt.
        """
        q, saves = self._get(qid), []
        if isinstance(value, str) and value.strip().lower() in REVEAL:
            return None, self._reveal(q, "The answer", saves), saves
        ok, got, note = q.judge(value)
        if ok is None:
            return None, note[:1].upper() + note[1:] + ".", saves
        note = f" ({note})" if note else ""
        if q.attempt.revealed:
            return ok, (f"{'Right' if ok else 'Not quite'}{note}, but the answer was shown, so this try "
                        f"is not counted. {self._again(q)}"), saves
        saves.append(lambda: save_result(self.name, q.id, ok))
        if ok:
            q.attempt.solved = True
            return True, f"Correct{note}. {q.explanation_text()}", saves
        q.attempt.tries += 1
        if q.attempt.tries == 1:
            hint = q.hint_for(got)
            hint = hint[:1].upper() + hint[1:]
            return False, f"Not quite{note}. Hint: {hint} Try again, or ask for the answer.", saves
        return False, self._reveal(q, f"Not quite{note}: the answer", saves), saves

    @staticmethod
    def record(saves: list) -> str:
        """Write what :meth:`judge` graded to the progress file; never raises. Returns '' or one
        line to show after the feedback (the save failed and is kept for this session, or a bad
        progress file was set aside)."""
        return " ".join(note for note in (save() for save in saves) if note)

    def respond(self, qid: str, value) -> tuple[bool | None, str]:
        """Grade one answer (or a request for the answer), save it, and say what to show the
        learner: (right?, text), as :meth:`judge`, with the save's line (if any) after the text."""
        ok, text, saves = self.judge(qid, value)
        note = self.record(saves)
        return ok, f"{text}\n{note}" if note else text

    def _reveal(self, q: Question, head: str, saves: list) -> str:
        q.attempt.revealed = True
        saves.append(lambda: save_reveal(self.name, q.id))
        return f"{head} is {q.expected()}. {q.explanation_text()} {self._again(q)}"

    @staticmethod
    def _again(q: Question) -> str:
        button = "New numbers" if q.drawn else "Try again"
        return f'For another try, press {button} or run quiz.renew("{q.id}").'

    def answer(self, qid: str, value) -> bool:
        """Grade one answer, print the feedback, then save progress (a failed save prints one line
        and the quiz goes on); returns whether it was right. ``value`` ``"show"`` prints the answer."""
        ok, text, saves = self.judge(qid, value)
        print(text)
        note = self.record(saves)
        if note:
            print(note)
        return bool(ok)

    def reveal(self, qid: str) -> None:
        """Print the answer and its explanation (same as ``answer(qid, "show")``)."""
        self.answer(qid, "show")

    def text(self) -> str:
        """The quiz as plain text, with the numbers of this attempt and how to answer; lines
        longer than 100 columns wrapped at word boundaries."""
        lines = [f"Quiz: {self.name}"]
        for n, q in enumerate(self.questions, 1):
            lines.append(fit(f"{n}. [{q.id}] {q.prompt_text()}", "   "))
            if isinstance(q, Choice):
                lines += [fit(f"   ({i}) {opt}", "       ") for i, opt in enumerate(q.options)]
            else:
                lines.append(f"   ({describe(q.unit_now())})")
        lines.append('Answer with quiz.answer("<id>", <choice number or value>); a value may carry '
                     'a unit ("2.5 GiB").')
        lines.append('quiz.answer("<id>", "show") shows an answer; quiz.renew("<id>") draws new numbers.')
        return "\n".join(lines)

    def show(self) -> None:
        """A new attempt: fresh numbers, then widgets in JupyterLab or plain text otherwise."""
        self.widget = None
        self.renew(quiet=True)
        if not widgets_available():
            print(self.text())
            return
        from IPython.display import display
        from .quiz_widgets import quiz_box
        self.widget = quiz_box(self)
        display(self.widget)


def fit(text: str, indent: str = "", width: int = 100) -> str:
    """``text`` with each line longer than ``width`` wrapped at word boundaries (later lines
    indented by ``indent``); shorter lines, tables among them, are left as they are."""
    import textwrap
    return "\n".join(line if len(line) <= width else textwrap.fill(
        line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
        for line in text.split("\n"))


def widgets_available() -> bool:
    """Whether quizzes can show widgets: a running IPython kernel with ipywidgets, text mode not forced."""
    if os.environ.get("GPUMEM_QUIZ_MODE") == "text":
        return False
    try:
        from IPython import get_ipython
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def checklist(quizzes: list[Quiz]) -> str:
    """Progress as a checklist: one line per question (the line, prompt included, cut at 100
    characters), [x] once answered correctly."""
    data = load_progress()
    lines = []
    for quiz in quizzes:
        done = data.get(quiz.name, {})
        lines.append(quiz.name)
        for q in quiz.questions:
            mark = "x" if done.get(q.id, {}).get("correct") else " "
            prompt = q.prompt_text()
            line = f"  [{mark}] {q.id}: {' '.join(prompt.split())}"
            lines.append(line if len(line) <= 100 else line[:97].rstrip() + "...")
    return "\n".join(lines)
