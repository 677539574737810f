"""Quizzes: questions as data, shown as widgets (JupyterLab) or plain text (nbval, terminals).

A numeric answer can be a callable, so the expected value is computed by the library at the
moment the question is shown (it can never drift from the chapter's numbers). Progress is saved
to ``~/.gpumem/progress.json`` (``$GPUMEM_HOME`` overrides the folder).

Plain-text mode is used when ``GPUMEM_QUIZ_MODE=text`` (``make test`` sets it for nbval) or when
no IPython kernel is running; answer there with ``quiz.answer("id", value)``.
"""

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class Choice:
    """A multiple-choice question; ``answer`` is the index of the right option."""
    id: str
    prompt: str
    options: list[str]
    answer: int           # index into options
    explanation: str

    def grade(self, value) -> bool:
        if isinstance(value, str):
            return value == self.options[self.answer]
        return int(value) == self.answer

    def expected(self) -> str:
        return self.options[self.answer]


@dataclass
class Numeric:
    """A question answered with a number, right within ``rel_tol`` of the (possibly computed) answer."""
    id: str
    prompt: str
    answer: float | Callable[[], float]
    explanation: str
    unit: str = ""
    rel_tol: float = 0.02

    def value(self) -> float:
        return float(self.answer() if callable(self.answer) else self.answer)

    def grade(self, value) -> bool:
        try:
            got = float(value)
        except (TypeError, ValueError):
            return False
        return math.isclose(got, self.value(), rel_tol=self.rel_tol)

    def expected(self) -> str:
        return f"{self.value():,.4g} {self.unit}".strip()


Question = Choice | Numeric


def progress_file() -> Path:
    """Where quiz progress is saved: ``progress.json`` in ``$GPUMEM_HOME``, else ``~/.gpumem``."""
    return Path(os.environ.get("GPUMEM_HOME", Path.home() / ".gpumem")) / "progress.json"


def load_progress() -> dict:
    """Saved quiz progress by quiz and question; empty when the file is missing or unreadable."""
    path = progress_file()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save_result(quiz: str, qid: str, correct: bool) -> None:
    """Record one attempt at a question; once answered correctly it stays correct."""
    path = progress_file()
    data = load_progress()
    entry = data.setdefault(quiz, {}).setdefault(qid, {"correct": False, "attempts": 0})
    entry["attempts"] += 1
    entry["correct"] = entry["correct"] or correct
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


def feedback(q: Question, value) -> tuple[bool, str]:
    """Grade one answer: whether it is right, and the text shown to the learner."""
    ok = q.grade(value)
    head = "Correct." if ok else f"Not quite: the answer is {q.expected()}."
    return ok, f"{head} {q.explanation}"


@dataclass
class Quiz:
    """A named list of questions, shown as widgets or text and answered with :meth:`answer`."""
    name: str
    questions: list[Question] = field(default_factory=list)
    widget: object = field(default=None, repr=False, compare=False)

    def _get(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise KeyError(f"no question {qid!r} in quiz {self.name!r}; ids: {[q.id for q in self.questions]}")

    def answer(self, qid: str, value) -> bool:
        """Grade one answer, print the feedback, save progress; returns whether it was right."""
        ok, text = feedback(self._get(qid), value)
        save_result(self.name, qid, ok)
        print(text)
        return ok

    def text(self) -> str:
        lines = [f"Quiz: {self.name}"]
        for n, q in enumerate(self.questions, 1):
            lines.append(f"{n}. [{q.id}] {q.prompt}")
            if isinstance(q, Choice):
                lines += [f"   ({i}) {opt}" for i, opt in enumerate(q.options)]
            else:
                lines.append(f"   (a number{', in ' + q.unit if q.unit else ''})")
        lines.append(f'Answer with quiz.answer("<id>", <choice number or value>).')
        return "\n".join(lines)

    def show(self) -> None:
        """Widgets in JupyterLab; the plain text otherwise (kept as ``self.widget``)."""
        self.widget = None
        if not widgets_available():
            print(self.text())
            return
        import ipywidgets as w
        from IPython.display import display
        box = w.VBox([_question_widget(self, q) for q in self.questions])
        box.add_class("gpumem-quiz")
        display(box)
        self.widget = box


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


def _question_widget(quiz: Quiz, q: Question):
    import ipywidgets as w
    if isinstance(q, Choice):
        entry = w.RadioButtons(options=[(opt, i) for i, opt in enumerate(q.options)], value=None,
                               layout=w.Layout(width="max-content"))
    else:
        entry = w.Text(placeholder=f"a number{' in ' + q.unit if q.unit else ''}")
    button = w.Button(description="Check", button_style="primary")
    out = w.HTML()
    out.add_class(f"gpumem-feedback-{q.id}")

    def on_click(_):
        ok, text = feedback(q, entry.value)
        save_result(quiz.name, q.id, ok)
        colour = "#1a7f37" if ok else "#b42318"
        out.value = f'<div style="color:{colour}">{text}</div>'

    button.on_click(on_click)
    box = w.VBox([w.HTML(f"<b>{q.prompt}</b>"), entry, button, out])
    box.add_class(f"gpumem-question-{q.id}")
    return box


def checklist(quizzes: list[Quiz]) -> str:
    """Progress as a checklist: one line per question, [x] once answered correctly."""
    data = load_progress()
    lines = []
    for quiz in quizzes:
        done = data.get(quiz.name, {})
        lines.append(quiz.name)
        for q in quiz.questions:
            mark = "x" if done.get(q.id, {}).get("correct") else " "
            lines.append(f"  [{mark}] {q.id}: {q.prompt}")
    return "\n".join(lines)
