"""One sitting of a checklist's quiz: the rules that keep a shown answer from earning its question.

A :class:`SittingQuiz` is a :class:`~gpumem.course.quiz.Quiz` (same grading, hints, saves and
widgets) that remembers, for the life of the Python session (the sitting), which answers were
shown. Its rules:

* a multiple choice's options are shuffled on every attempt (``renew``), so an option's number
  says nothing about the next attempt; wrong tries on a choice add up across attempts of one
  sitting, so the second wrong option shows the answer, as it does on one attempt;
* a numeric question whose answer was shown earns nothing on the numbers that were on screen:
  only fresh numbers count (``renew`` draws again rather than repeat numbers already answered);
* a choice whose answer was shown earns nothing again in this sitting until every other question
  of its item has been answered right (and counted) after the reveal. Trying every option after
  a reveal earns nothing. A new sitting (a restarted kernel) starts clean.

``peers`` maps each question id to the ids of the other questions of its item
(:class:`~gpumem.course.checklist.Checklist` passes it).
"""

import textwrap
from dataclasses import dataclass, field

from .quiz import REVEAL, Choice, Quiz

FRESH_DRAWS = 64          # redraws tried before giving up on numbers not yet shown

RULE = ("A shown answer earns nothing: a numeric question counts again only on fresh numbers (New "
        "numbers), and a choice whose answer was shown counts again in this session only after you "
        "have answered every other question of its item right. Options are shuffled on each attempt.")


def _base(q: Choice) -> tuple[list, int]:
    """The options as written and the right one's index (kept on the question the first time)."""
    if not hasattr(q, "_authored"):
        q._authored = (list(q.options), q.answer)
    return q._authored


def follow_shuffles(quiz: "SittingQuiz", box) -> None:
    """After a widget's New numbers / Try again button, show the choice's reshuffled options."""
    for child in getattr(box, "children", ()):
        qid = next((c.removeprefix("gpumem-question-") for c in getattr(child, "_dom_classes", ())
                    if c.startswith("gpumem-question-")), None)
        if qid is None or not isinstance(quiz._get(qid), Choice):
            continue
        q, entry, again = quiz._get(qid), child.children[1], child.children[2].children[2]

        def refresh(_, q=q, entry=entry):
            entry.options = [(opt, i) for i, opt in enumerate(q.options)]
            entry.value = None
        again.on_click(refresh)         # runs after the widget's own handler (quiz.renew)


@dataclass
class SittingQuiz(Quiz):
    """A quiz whose shown answers cannot be turned into credit in the same sitting."""
    peers: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.new_sitting()
        for q in self.questions:
            if isinstance(q, Choice):
                _base(q)
        super().__post_init__()

    def new_sitting(self) -> None:
        """Forget what was shown, as a restarted kernel does (tests start each case this way)."""
        self._clock = 0
        self._shown_at: dict[str, int] = {}          # choice id -> when its answer was last shown
        self._shown_prompts: dict[str, set] = {}     # numeric id -> prompts whose answer was shown
        self._credited_at: dict[str, int] = {}       # id -> when it was last answered right, counted
        for q in self.questions:
            q.attempt.tries = 0

    def renew(self, qid: str | None = None, quiet: bool = False) -> None:
        """New numbers (never numbers whose answer was shown, if others can be drawn) or, for a
        choice, its options in a new order; printed unless ``quiet``."""
        rng = self.generator()
        for q in [self._get(qid)] if qid else self.questions:
            if isinstance(q, Choice):
                done = q.attempt.revealed or q.attempt.solved
                tries = 0 if done else q.attempt.tries       # wrong tries carry over to the next order
                q.redraw(rng)
                options, right = _base(q)
                order = list(range(len(options)))
                rng.shuffle(order)
                q.options, q.answer = [options[i] for i in order], order.index(right)
                q.attempt.tries = tries
            else:
                shown = self._shown_prompts.get(q.id, set())
                for _ in range(FRESH_DRAWS if q.drawn else 1):
                    q.redraw(rng)
                    if q.prompt_text() not in shown:
                        break
            if not quiet:
                print(textwrap.fill(f"[{q.id}] {q.prompt_text()}", 100, subsequent_indent="  "))
                if isinstance(q, Choice):
                    print("\n".join(textwrap.fill(f"   ({i}) {opt}", 100, subsequent_indent="       ")
                                     for i, opt in enumerate(q.options)))

    def blocked(self, qid: str) -> str:
        """Why a right answer to ``qid`` would not count now ('' when it would)."""
        q = self._get(qid)
        if isinstance(q, Choice):
            if q.id not in self._shown_at:
                return ""
            todo = [p for p in self.peers.get(q.id, ()) if self._credited_at.get(p, -1) < self._shown_at[q.id]]
            return (f"its answer was shown in this session: it counts again once you have answered "
                    f"{', '.join(todo)} right since then, or in a new session") if todo else ""
        if q.prompt_text() in self._shown_prompts.get(q.id, set()):
            return (f'the answer for these numbers was shown: press New numbers or run '
                    f'quiz.renew("{q.id}") for fresh ones')
        return ""

    def judge(self, qid: str, value) -> tuple[bool | None, str, list]:
        """As :meth:`Quiz.judge`, with this sitting's rules: a try the rules exclude is graded,
        said, and neither counted nor saved."""
        q = self._get(qid)
        asks = isinstance(value, str) and value.strip().lower() in REVEAL
        why = "" if asks or q.attempt.revealed else self.blocked(qid)
        if why:
            ok, _, note = q.judge(value)
            if ok is not None:
                note = f" ({note})" if note else ""
                return ok, f"{'Right' if ok else 'Not quite'}{note}, but {why}; this try is not counted.", []
        was_shown = q.attempt.revealed
        ok, text, saves = super().judge(qid, value)
        self._clock += 1
        if q.attempt.revealed and not was_shown:
            if isinstance(q, Choice):
                self._shown_at[q.id] = self._clock
            else:
                self._shown_prompts.setdefault(q.id, set()).add(q.prompt_text())
        elif ok and saves:
            self._credited_at[q.id] = self._clock
        return ok, text, saves

    def show(self) -> None:
        """As :meth:`Quiz.show`; a widget's Try again also shows the choice's new option order."""
        super().show()
        if self.widget is not None:
            follow_shuffles(self, self.widget)
