"""A chapter's quiz for the static book: drawn variants as jupyterquiz JSON, answered in the browser.

The book (:mod:`gpumem.course.site`) has no kernel, so each question is exported as a few drawn
variants (:data:`VARIANTS` seeds, ``quiz.seed("site:K")``), every expected value, hint and
explanation computed by the library for that draw. jupyterquiz renders the JSON; ``quiz.js``
(``site/_static``, inlined into the page with jupyterquiz's own JavaScript, nothing fetched)
shows one variant at a time, reads a typed unit the way :mod:`gpumem.course.answers` does and
adds a "New numbers" button and a "Show answer" box.

Grading as in the notebook: right within the question's tolerance (a jupyterquiz range); a
known mistake (a trap) gets its own hint; any other wrong value the question's hint. Unlike the
notebook, the answer is not shown after a second wrong try: the reader opens "Show answer".
"""

import html
import json
import math
import re

from .answers import describe
from .questions import Choice, Numeric

VARIANTS = 3


def seed_of(k: int) -> str:
    """The seed of variant ``k`` (a test reseeds the library's quiz with it)."""
    return f"site:{k}"


def _text(s: str) -> str:
    """Text for jupyterquiz, which sets it as HTML after turning $ into math and [a](b) into links."""
    s = html.escape(s).replace("$", "&#36;").replace("[", "&#91;")
    return s.replace("\n", "<br>")


def _bounds(q: Numeric, want: float) -> tuple[float, float]:
    """The values math.isclose(got, want, rel_tol, abs_tol) accepts, as an interval."""
    rel, tol = q.rel_tol, q.abs_tol
    a = abs(want)
    lo = min(a * (1 - rel), a - tol)
    hi = max(a / (1 - rel) if rel < 1 else math.inf, a + tol)
    return (lo, hi) if want >= 0 else (-hi, -lo)


def _range(lo: float, hi: float, feedback: str, correct: bool) -> dict:
    # jupyterquiz accepts lo <= x < hi; the upper end is nudged up so that hi itself counts
    return {"range": [lo, hi + abs(hi) * 1e-12 + 1e-12], "correct": correct, "feedback": _text(feedback)}


def _traps(q: Numeric, want: float) -> list[dict]:
    out = []
    for wrong, _hint in q.traps:
        trap = float(wrong({**q.numbers, "expected": want, "unit": q.unit_now()}))
        if math.isnan(trap) or q.close(trap, want):
            continue
        lo, hi = _bounds(q, trap)
        if not trap.is_integer():                       # the library also takes 0.5 % around it
            lo, hi = min(lo, trap - abs(trap) * 0.005), max(hi, trap + abs(trap) * 0.005)
        text = q.hint_for(trap)
        out.append(_range(lo, hi, f"Not quite. Hint: {text[:1].upper() + text[1:]}", False))
    return out


def numeric(q: Numeric, n: int) -> dict:
    """One drawn variant of a numeric question as a jupyterquiz numeric question."""
    want = q.value()
    right = f"Correct. {q.explanation_text()}"
    lo, hi = _bounds(q, want)
    if lo == hi:                          # no tolerance (or an answer of 0 with a relative one)
        answers = [{"value": want, "correct": True, "feedback": _text(right)}]
    else:
        answers = [_range(lo, hi, right, True)]
    answers += _traps(q, want)
    hint = q.hint_for(math.nan)
    answers.append({"type": "default", "feedback": _text(f"Not quite. Hint: {hint[:1].upper() + hint[1:]} "
                                                         "Try again, or open Show answer.")})
    unit = q.unit_now()
    return {"question": _text(f"{n}. {q.prompt_text()}"), "type": "numeric", "answers": answers,
            "gpumem": {"id": q.id, "unit": unit, "accepts": describe(unit), "value": want,
                       "answer": q.expected(), "explanation": q.explanation_text()}}


def choice(q: Choice, n: int) -> dict:
    """One variant of a multiple-choice question as a jupyterquiz multiple_choice question."""
    hint = q.hint_for(None)
    wrong = f"Not quite. Hint: {hint[:1].upper() + hint[1:]}" if hint else "Not quite. Try another option."
    return {"question": _text(f"{n}. {q.prompt_text()}"), "type": "multiple_choice",
            "answers": [{"answer": _text(opt), "correct": i == q.answer,
                         "feedback": _text(f"Correct. {q.explanation_text()}" if i == q.answer else wrong)}
                        for i, opt in enumerate(q.options)],
            "gpumem": {"id": q.id, "answer": q.expected(), "explanation": q.explanation_text()}}


def export(quiz, ids: list[str] | None = None, variants: int = VARIANTS) -> dict[str, list[dict]]:
    """Question id -> its variants (jupyterquiz dicts), numbered in the quiz's order; a question
    that draws nothing, or draws the same prompt again, has fewer variants. The quiz is reseeded
    (``seed_of(k)``) for each variant."""
    wanted = ids or [q.id for q in quiz.questions]
    number = {qid: i for i, qid in enumerate(wanted, 1)}
    pools: dict[str, list[dict]] = {qid: [] for qid in wanted}
    seen: dict[str, set] = {qid: set() for qid in wanted}
    for k in range(variants):
        quiz.seed(seed_of(k))
        for q in quiz.questions:
            if q.id not in pools or (k and not q.drawn):
                continue
            item = numeric(q, number[q.id]) if isinstance(q, Numeric) else choice(q, number[q.id])
            if item["question"] in seen[q.id]:
                continue
            seen[q.id].add(item["question"])
            item["gpumem"]["seed"] = seed_of(k)
            pools[q.id].append(item)
    return pools


HOW = ("Answered here in your browser, nothing sent anywhere: type a number and press Enter (a unit "
       "such as GB or ms is converted, as in the notebook). New numbers shows another draw; Show "
       "answer gives the answer and its working. In the notebook the quiz draws fresh numbers each time.")


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", s)


def html_block(chapter: str, pools: dict[str, list[dict]], library_js: str = "") -> str:
    """The quiz as one HTML output for the page: a note on how to answer, one container per
    question and the JSON of every variant; ``library_js`` (jupyterquiz's JavaScript and
    quiz.js), given for a page's first quiz only, is inlined before the call that renders it."""
    data = json.dumps(pools, ensure_ascii=True).replace("</", "<\\/")
    ident = f"gq-{_slug(chapter)}-{_slug('-'.join(pools))[:40]}"
    boxes = "\n".join(f'<div class="gq-question" data-qid="{html.escape(qid)}"></div>' for qid in pools)
    script = f"<script>\n{library_js}\n</script>\n" if library_js else ""
    return (f'<div class="gq-quiz" id="{ident}">\n<p class="gq-note">{html.escape(HOW)}</p>\n{boxes}\n</div>\n'
            f'<script type="application/json" id="{ident}-data">{data}</script>\n{script}'
            f'<script>gpumemQuiz("{ident}");</script>\n')
