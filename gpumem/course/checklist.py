"""A checklist over one quiz: its questions grouped into items, each item ticked once every
question in it has been answered correctly, with a summary of what to revisit and where.

Chapter 07 grades the note's six "must understand" items this way. The questions are one
:class:`~gpumem.course.quiz.Quiz` (so ``gpumem.chapters.quizzes()``, saved progress and the
plain-text ``quiz.answer`` work as for any chapter); a :class:`Checklist` adds the grouping,
shows one item at a time, reads the saved progress (:mod:`gpumem.course.progress`) to draw the
checklist, and names, for every question not yet earned, the notebook section that shows its
answer (:class:`Pointer`). Each question's explanation ends with its pointers too.

An answer shown (on request or after two wrong tries) does not earn a question. The quiz is a
:class:`~gpumem.course.checklist_sitting.SittingQuiz`: choice options are shuffled per attempt, a
numeric question counts again only on fresh numbers, and a choice whose answer was shown counts
again in the same sitting only once the item's other questions were answered right after the
reveal (:data:`~gpumem.course.checklist_sitting.RULE` says it to the learner).
"""

import html
import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from .answers import describe
from .checklist_sitting import RULE, SittingQuiz, follow_shuffles
from .progress import load_progress
from .quiz import Choice, Question, Quiz, widgets_available


@dataclass(frozen=True)
class Pointer:
    """Where a notebook shows something: ``notebooks/<notebook>.ipynb``, under ``heading``
    (a markdown heading's text, without its ``#`` marks)."""
    notebook: str      # "02_zero"
    heading: str       # "The collectives"

    def text(self) -> str:
        """The pointer as the learner reads it: ``notebook 02_zero, section "The collectives"``."""
        return f'notebook {self.notebook}, section "{self.heading}"'


def notebook_headings(path: str | Path) -> list[str]:
    """The markdown headings of a notebook (``#`` marks and surrounding spaces removed), in order."""
    cells = json.loads(Path(path).read_text())["cells"]
    out = []
    for cell in cells:
        if cell.get("cell_type") != "markdown":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        out += [line.lstrip("#").strip() for line in source.splitlines() if line.startswith("#")]
    return out


def missing_pointers(pointers, folder: str | Path) -> list[Pointer]:
    """The pointers whose notebook is absent from ``folder`` or has no such heading."""
    folder, seen, bad = Path(folder), {}, []
    for p in pointers:
        if p.notebook not in seen:
            path = folder / f"{p.notebook}.ipynb"
            seen[p.notebook] = set(notebook_headings(path)) if path.exists() else set()
        if p.heading not in seen[p.notebook]:
            bad.append(p)
    return bad


@dataclass
class Item:
    """One checklist item: a title, its questions and, per question id, where to look."""
    key: str
    title: str
    questions: list[Question]
    see: dict[str, tuple[Pointer, ...]] = field(default_factory=dict)


def _wrap(line: str, indent: str = "") -> list[str]:
    """A line cut to 100 columns (learners' outputs), later lines indented."""
    return textwrap.wrap(line, 100, subsequent_indent=indent, break_on_hyphens=False) or [""]


def _render(text, ctx: dict) -> str:
    if callable(text):
        return text(ctx)
    return text.format_map(ctx) if ctx else text


def _with_pointers(explanation, pointers: tuple[Pointer, ...]):
    """The explanation followed by "See notebook ..., section ...". """
    tail = " See " + "; ".join(p.text() for p in pointers) + "."
    return lambda ctx: _render(explanation, ctx) + tail


class Checklist:
    """Items of questions asked as one quiz (:attr:`quiz`), with progress per item.

    ``Checklist(name, items)`` builds ``SittingQuiz(name, every question)``; each question's
    explanation gets its pointers appended. :meth:`show` asks one item (fresh numbers),
    :meth:`answer` grades as ``quiz.answer`` does, :meth:`view` is the checklist and
    :meth:`summary` says what to revisit.
    """

    rule = RULE          # what a shown answer costs, in the learner's words

    def __init__(self, name: str, items: list[Item]):
        keys = [i.key for i in items]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate item keys in {keys}")
        for item in items:
            for q in item.questions:
                if not item.see.get(q.id):
                    raise ValueError(f"question {q.id!r} of item {item.key!r} has no pointer")
                bare = getattr(q, "_bare_explanation", q.explanation)   # a second checklist over
                q._bare_explanation = bare                                # the same questions
                q.explanation = _with_pointers(bare, item.see[q.id])     # appends once
        self.name, self.items = name, items
        peers = {q.id: [o.id for o in item.questions if o is not q] for item in items for q in item.questions}
        self.quiz = SittingQuiz(name, [q for item in items for q in item.questions], peers=peers)

    def item(self, key: str) -> Item:
        """The item called ``key`` (or numbered ``key``, from 1)."""
        for n, item in enumerate(self.items, 1):
            if key in (item.key, str(n), n):
                return item
        raise KeyError(f"no item {key!r} in {self.name!r}; items: {[i.key for i in self.items]}")

    def pointers(self) -> list[Pointer]:
        """Every pointer of every question, once each, in order."""
        out = []
        for item in self.items:
            for q in item.questions:
                out += [p for p in item.see[q.id] if p not in out]
        return out

    def outline(self) -> str:
        """The items, their questions (multiple choice or a number, and its unit) and the
        notebook sections they point to: what the checklist covers, without any attempt's numbers."""
        lines = []
        for n, item in enumerate(self.items, 1):
            lines.append(f"{n}. {item.title}")
            for q in item.questions:
                kind = "choice" if isinstance(q, Choice) else f"number{', ' + q.unit if q.unit else ''}"
                lines.append(f"   {q.id} ({kind})")
            where = [p for q in item.questions for p in item.see[q.id]]
            lines += textwrap.wrap("shown in: " + "; ".join(dict.fromkeys(p.text() for p in where)), 100,
                                   initial_indent="   ", subsequent_indent="     ")
        return "\n".join(lines)

    def answer(self, qid: str, value) -> bool:
        """Grade one answer, print the feedback and save it (``Quiz.answer``)."""
        return self.quiz.answer(qid, value)

    def renew(self, qid: str) -> None:
        """New numbers for one question, printed (``Quiz.renew``)."""
        self.quiz.renew(qid)

    def text(self, key: str) -> str:
        """One item as plain text: its title, its questions with this attempt's numbers, how to answer."""
        n = self.items.index(self.item(key)) + 1
        item = self.item(key)
        lines = [f"Item {n} of {len(self.items)}: {item.title}"]
        for q in item.questions:
            lines += _wrap(f"[{q.id}] {q.prompt_text()}", "  ")
            if isinstance(q, Choice):
                lines += [x for i, opt in enumerate(q.options) for x in _wrap(f"   ({i}) {opt}", "       ")]
            else:
                lines.append(f"   ({describe(q.unit_now())})")
        lines += _wrap('Answer with quiz.answer("<id>", <choice number or value>); a value may carry a '
                       'unit. quiz.answer("<id>", "show") shows an answer; quiz.renew("<id>") draws new '
                       'numbers (for a choice, a new order of its options).')
        return "\n".join(lines)

    def show(self, key: str) -> None:
        """Ask one item: fresh numbers, then widgets in JupyterLab or plain text otherwise."""
        item = self.item(key)
        for q in item.questions:
            self.quiz.renew(q.id, quiet=True)
        if not widgets_available():
            print(self.text(key))
            return
        import ipywidgets as w
        from IPython.display import display
        from .quiz_widgets import question_widget
        n = self.items.index(item) + 1
        head = w.HTML(f"<h4>Item {n}: {html.escape(item.title)}</h4>")
        box = w.VBox([head] + [question_widget(self.quiz, q) for q in item.questions])
        box.add_class("gpumem-quiz")
        follow_shuffles(self.quiz, box)
        display(box)

    def status(self) -> dict[str, dict]:
        """Per item, from the saved progress: ``earned`` (question ids answered correctly),
        ``missed`` (the others), ``revealed`` (ids whose answer was shown) and ``done``."""
        saved = load_progress().get(self.name, {})
        out = {}
        for item in self.items:
            ids = [q.id for q in item.questions]
            earned = [i for i in ids if saved.get(i, {}).get("correct")]
            out[item.key] = {"earned": earned, "missed": [i for i in ids if i not in earned],
                             "revealed": [i for i in ids if saved.get(i, {}).get("revealed")],
                             "done": len(earned) == len(ids)}
        return out

    def view(self) -> str:
        """The checklist: ``[x]`` for an item whose every question was answered correctly, ``[~]``
        for one begun, ``[ ]`` otherwise, with the count; then each question's mark."""
        status, lines = self.status(), [f"Checklist: {self.name}"]
        for n, item in enumerate(self.items, 1):
            s = status[item.key]
            mark = "x" if s["done"] else ("~" if s["earned"] else " ")
            lines.append(f"[{mark}] {n}. {item.title} ({len(s['earned'])}/{len(item.questions)})")
            lines += [f"      [{'x' if q.id in s['earned'] else ' '}] {q.id}" for q in item.questions]
        done = sum(s["done"] for s in status.values())
        lines.append(f"{done} of {len(self.items)} items done.")
        return "\n".join(lines)

    def summary(self) -> str:
        """What to revisit: per unfinished item, each question not yet answered correctly (marked
        when its answer was shown) and the notebook sections that show it."""
        status = self.status()
        todo = [(n, item) for n, item in enumerate(self.items, 1) if not status[item.key]["done"]]
        if not todo:
            return f"All {len(self.items)} items done: nothing to revisit."
        lines = [f"To revisit ({len(todo)} of {len(self.items)} items):"]
        for n, item in todo:
            s = status[item.key]
            lines.append(f"{n}. {item.title} ({len(s['earned'])}/{len(item.questions)} answered)")
            for qid in s["missed"]:
                shown = ", answer shown" if qid in s["revealed"] else ""
                where = "; ".join(p.text() for p in item.see[qid])
                lines += _wrap(f"   - {qid}{shown}: {where}", "       ")
        return "\n".join(lines)


def quiz_progress(quizzes: list[Quiz]) -> str:
    """One line per quiz from the saved progress: how many of its questions were answered
    correctly, and how many answers were shown."""
    saved, lines = load_progress(), []
    for quiz in quizzes:
        done = saved.get(quiz.name, {})
        right = sum(1 for q in quiz.questions if done.get(q.id, {}).get("correct"))
        shown = sum(1 for q in quiz.questions if done.get(q.id, {}).get("revealed"))
        mark = "x" if right == len(quiz.questions) else ("~" if right else " ")
        lines.append(f"[{mark}] {quiz.name}: {right} of {len(quiz.questions)} answered correctly"
                     + (f", {shown} answer(s) shown" if shown else ""))
    return "\n".join(lines)
