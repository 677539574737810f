"""A quiz as ipywidgets, for JupyterLab: every question is a prompt, an entry, three buttons
(Check, Show answer, New numbers / Try again) and a feedback line.

The widgets only display; grading, hints, revealing and drawing new numbers are the quiz's own
(:meth:`gpumem.course.quiz.Quiz.judge`, :meth:`~gpumem.course.quiz.Quiz.renew`), so a widget
and ``quiz.answer`` in text mode can never disagree. CSS classes name each part
(``gpumem-question-<id>``, ``gpumem-prompt-<id>``, ``gpumem-feedback-<id>``) for the browser test.
"""

import html

COLOURS = {True: "#1a7f37", False: "#b42318", None: "#5b5b5b"}


def _entry(q):
    import ipywidgets as w
    if hasattr(q, "options"):
        return w.RadioButtons(options=[(opt, i) for i, opt in enumerate(q.options)], value=None,
                              layout=w.Layout(width="max-content"))
    from .answers import describe
    return w.Text(placeholder=describe(q.unit_now()), layout=w.Layout(width="28em"))


def _prompt_html(q, number: int | None) -> str:
    """The question's text in plain weight, after its number in bold ("<b>Q2.</b> ...") when given."""
    head = f"<b>Q{number}.</b> " if number is not None else ""
    return head + html.escape(q.prompt_text())


def question_widget(quiz, q, number: int | None = None):
    """One question's widgets, wired to ``quiz``; returns the VBox (children: prompt, entry,
    buttons, feedback). ``number``: shown before the prompt (Q1, Q2, ...)."""
    import ipywidgets as w
    from .answers import describe
    prompt = w.HTML(_prompt_html(q, number))
    prompt.add_class(f"gpumem-prompt-{q.id}")
    entry = _entry(q)
    check = w.Button(description="Check", button_style="primary")
    show = w.Button(description="Show answer")
    again = w.Button(description="New numbers" if q.drawn else "Try again")
    out = w.HTML()
    out.add_class(f"gpumem-feedback-{q.id}")

    def say(ok, text):
        out.value = f'<div style="color:{COLOURS[ok]}">{html.escape(text)}</div>'

    def respond(value):          # feedback first, then the save (and its line if it failed)
        ok, text, saves = quiz.judge(q.id, value)
        say(ok, text)
        note = quiz.record(saves)
        if note:
            say(ok, f"{text} {note}")

    def on_check(_):
        respond(entry.value)

    def on_show(_):
        respond("show")

    def on_again(_):
        quiz.renew(q.id, quiet=True)
        prompt.value = _prompt_html(q, number)
        if hasattr(q, "options"):
            entry.value = None
        else:
            entry.value, entry.placeholder = "", describe(q.unit_now())
        out.value = ""

    check.on_click(on_check)
    show.on_click(on_show)
    again.on_click(on_again)
    box = w.VBox([prompt, entry, w.HBox([check, show, again]), out])
    box.add_class(f"gpumem-question-{q.id}")
    return box


def quiz_box(quiz):
    """Every question of ``quiz``, numbered, one under the other (CSS class ``gpumem-quiz``)."""
    import ipywidgets as w
    box = w.VBox([question_widget(quiz, q, i) for i, q in enumerate(quiz.questions, 1)])
    box.add_class("gpumem-quiz")
    return box
