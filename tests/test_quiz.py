"""Quiz machinery: answers with units, hint before answer, revealing, fresh seeded numbers, saved
progress, plain-text mode and the widgets. The questions here are built in the test, so the
engine is checked apart from any chapter's content."""

import json

import pytest

from gpumem.course import answers, quiz as q
from gpumem.errors import UsageError


def _quiz(name="test-quiz"):
    """A small quiz: a drawn numeric question with a trap, a fixed one, and a choice."""
    sizes = q.Numeric(
        "sizes", "{count} tensors of {mib:,} MiB: how many GB?",
        answer=lambda n: n["count"] * n["mib"] * 2**20 / 1e9, unit="GB", rel_tol=0.002,
        hint="Go through bytes.", explanation="{count} x {mib:,} x 2^20 B = {answer} GB.",
        traps=((lambda n: n["count"] * n["mib"] / 1000, "A MiB is 2^20 bytes."),),
        draw=lambda rng: {"count": rng.choice([2, 3, 5, 7]), "mib": rng.choice([1024, 4096, 81_559])})
    per_param = q.Numeric("per-param", "Bytes per parameter of bf16 weights + bf16 grads + fp32 Adam?",
                          answer=lambda: 2 + 2 + 12, unit="bytes", rel_tol=0.0, hint="Add each copy.",
                          explanation="2 + 2 + 12.")
    pick = q.Choice("pick", "Which is prime?", ["4", "6", "7", "9"], answer=2, hint="Divisors.",
                    explanation="7 has no divisor but 1 and itself.")
    return q.Quiz(name, [sizes, per_param, pick])


@pytest.mark.parametrize("text, unit, expected", [
    ("16 B", "bytes", 16), ("16", "bytes", 16), (16, "bytes", 16), ("3.75 bytes", "bytes", 3.75),
    ("3.75 bytes/param", "bytes", 3.75), ("3.75 B per parameter", "bytes", 3.75),
    ("317.5 GB", "GB", 317.5), ("317.5GB", "GB", 317.5), ("1,129 GB", "GB", 1129),
    ("74.5 GiB", "GiB", 74.5), ("74.5 gib", "GiB", 74.5),
    ("80 GB", "GiB", 80e9 / 2**30),                 # 74.505... GiB: converted, not refused
    ("74.5 GiB", "GB", 74.5 * 1_073_741_824 / 1e9),  # 79.99... GB
    ("81,559 MiB", "GB", 81_559 * 1_048_576 / 1e9), ("1.5e3 MB", "GB", 1.5),
    ("15", "GPUs", 15), ("15 GPUs", "GPUs", 15), ("1 GPU", "GPUs", 1), ("562 fetches", "fetches", 562),
    ("250 ms", "s", 0.25), ("12.5 %", "%", 12.5), ("-3", "", -3),
])
def test_answers_with_units_are_converted_to_the_questions_unit(text, unit, expected):
    got, _ = answers.to_unit(text, unit)
    assert got == pytest.approx(expected, rel=1e-12)


def test_a_conversion_is_said():
    got, note = answers.to_unit("80 GB", "GiB")
    assert note == "80 GB read as 74.51 GiB"
    assert answers.to_unit("80 GiB", "GiB")[1] == "" and answers.to_unit(80, "GiB")[1] == ""


@pytest.mark.parametrize("text, unit, says", [
    ("16 apples", "GB", "'apples'"), ("5 s", "GB", "wants GB"), ("15 GB", "GPUs", "GPUs"),
    ("eighty", "GB", "is not a number"), ("", "GB", "is not a number"), (True, "GB", "not a number"),
    ("12 parsecs", "s", "'parsecs'"),
])
def test_nonsense_is_one_line_naming_the_value(text, unit, says):
    with pytest.raises(UsageError) as err:
        answers.to_unit(text, unit)
    message = str(err.value)
    assert says in message and "\n" not in message


def test_wrong_answer_gets_a_hint_then_the_answer(capsys):
    quiz = _quiz()
    assert not quiz.answer("per-param", 8)
    first = capsys.readouterr().out
    assert first.startswith("Not quite. Hint: Add each copy.") and "16" not in first
    assert not quiz.answer("per-param", "12 B")
    second = capsys.readouterr().out
    assert second.startswith("Not quite: the answer is 16 bytes. 2 + 2 + 12.")
    # the answer was shown: a right answer now is not counted
    assert quiz.answer("per-param", 16) is True
    assert "not counted" in capsys.readouterr().out
    entry = json.loads(q.progress_file().read_text())["test-quiz"]["per-param"]
    assert entry == {"correct": False, "attempts": 2, "revealed": 1}
    quiz.renew("per-param", quiet=True)        # a new try starts clean
    assert quiz.answer("per-param", "16 bytes")
    assert capsys.readouterr().out.startswith("Correct. 2 + 2 + 12.")
    assert json.loads(q.progress_file().read_text())["test-quiz"]["per-param"]["correct"] is True


def test_answer_on_request_and_unreadable_values_are_not_attempts(capsys):
    quiz = _quiz()
    assert not quiz.answer("per-param", "16 apples")
    assert capsys.readouterr().out.startswith("Unit 'apples' in '16 apples'")
    assert not quiz.answer("pick", 9)
    assert "not one of the options" in capsys.readouterr().out
    assert not q.progress_file().exists()        # nothing was graded yet
    quiz.reveal("pick")
    assert capsys.readouterr().out.startswith("The answer is 7. 7 has no divisor")
    assert quiz.answer("sizes", "show") is False
    assert "The answer is" in capsys.readouterr().out
    saved = json.loads(q.progress_file().read_text())["test-quiz"]
    assert saved["pick"] == {"correct": False, "attempts": 0, "revealed": 1}


def test_a_known_mistake_gets_its_own_hint(capsys):
    quiz = _quiz().seed(3)
    sizes = quiz._get("sizes")
    n = sizes.numbers
    assert not quiz.answer("sizes", n["count"] * n["mib"] / 1000)
    assert capsys.readouterr().out.startswith("Not quite. Hint: A MiB is 2^20 bytes.")
    quiz.renew("sizes", quiet=True)
    assert not quiz.answer("sizes", -1)
    assert "Go through bytes." in capsys.readouterr().out


def test_drawn_numbers_are_seeded_and_the_answer_follows_them():
    a, b = _quiz().seed(7), _quiz().seed(7)
    assert a._get("sizes").numbers == b._get("sizes").numbers
    seen = set()
    for _ in range(30):
        a.renew("sizes", quiet=True)
        n = a._get("sizes").numbers
        seen.add((n["count"], n["mib"]))
        # hand arithmetic for the numbers on screen
        gb = n["count"] * n["mib"] * 1_048_576 / 10**9
        assert a._get("sizes").grade(f"{gb:.3f} GB") and a._get("sizes").grade(f"{gb * 1e3:.0f} MB")
        assert f"{n['count']} tensors of {n['mib']:,} MiB" in a._get("sizes").prompt_text()
    assert len(seen) > 3                           # fresh numbers per attempt


def test_the_environment_seeds_quizzes(monkeypatch):
    monkeypatch.setenv("GPUMEM_QUIZ_SEED", "42")
    first = [_quiz().questions[0].numbers for _ in range(3)]
    assert first[0] == first[1] == first[2] == _quiz().seed(42).questions[0].numbers


def test_text_mode_shows_numbers_units_and_how_to_answer(capsys, monkeypatch):
    monkeypatch.setenv("GPUMEM_QUIZ_MODE", "text")
    quiz = _quiz().seed(1)
    assert quiz.show() is None
    out = capsys.readouterr().out
    n = quiz._get("sizes").numbers                 # show() drew this attempt's numbers
    assert f"[sizes] {n['count']} tensors of {n['mib']:,} MiB" in out
    assert "(a number in GB; other byte units are converted)" in out and "(2) 7" in out
    assert 'quiz.answer("<id>"' in out and '"show"' in out


def test_checklist_marks_what_was_answered():
    quiz = _quiz()
    quiz.answer("pick", "7")
    listing = q.checklist([quiz])
    assert "[x] pick" in listing and "[ ] per-param" in listing


def test_widget_answers_through_the_same_engine():
    import ipywidgets as w
    from gpumem.course.quiz_widgets import question_widget, quiz_box
    quiz = _quiz().seed(2)
    box = question_widget(quiz, quiz._get("pick"))
    prompt, radio, buttons, out = box.children
    check, show, again = buttons.children
    assert isinstance(radio, w.RadioButtons) and [b.description for b in buttons.children] == [
        "Check", "Show answer", "Try again"]
    radio.value = 1
    check.click()
    assert "Hint: Divisors." in out.value
    radio.value = 2
    check.click()
    assert "Correct." in out.value
    show.click()
    assert "The answer is 7." in out.value
    again.click()
    assert out.value == "" and radio.value is None

    sizes = quiz._get("sizes")
    box = question_widget(quiz, sizes)
    prompt, entry, buttons, out = box.children
    assert buttons.children[2].description == "New numbers"
    n = sizes.numbers
    entry.value = f"{n['count'] * n['mib'] * 2**20 / 2**30:.4f} GiB"     # GiB to a GB question
    buttons.children[0].click()
    assert "Correct (" in out.value and "read as" in out.value
    entry.value = "3 bananas"
    buttons.children[0].click()
    assert "bananas" in out.value
    before = prompt.value
    for _ in range(20):                       # New numbers redraws the prompt
        buttons.children[2].click()
        if prompt.value != before:
            break
    assert prompt.value != before and out.value == "" and entry.value == ""
    assert "gpumem-quiz" in quiz_box(quiz)._dom_classes


def test_widget_questions_are_numbered_and_the_prompt_is_not_bold():
    from gpumem.course.quiz_widgets import quiz_box
    quiz = _quiz().seed(2)
    prompts = [box.children[0].value for box in quiz_box(quiz).children]
    assert [p.split(" ", 1)[0] for p in prompts] == [f"<b>Q{i}.</b>" for i in range(1, len(prompts) + 1)]
    assert all(p.count("<b>") == 1 for p in prompts)                 # only the number is bold
    second = quiz_box(quiz).children[1]
    second.children[2].children[2].click()                          # Try again / New numbers redraws
    assert second.children[0].value.startswith("<b>Q2.</b> ")       # ... and keeps the number


HOSTILE_ANSWERS = [10**5000, "x" * 100_000, float("nan"), object()]


def test_no_answer_raises_or_floods_the_cell(tmp_path, monkeypatch, capsys):
    """Every question of every chapter, given absurd answers: feedback, never an exception, and
    never a wall of text (a 100,000-character answer is not echoed back)."""
    import importlib

    from gpumem.chapters import CHAPTERS
    monkeypatch.setenv("GPUMEM_HOME", str(tmp_path))
    tried = 0
    for chapter in CHAPTERS:
        quiz = getattr(importlib.import_module(chapter.package + ".quiz"), "QUIZ", None)
        for q in quiz.questions if quiz else ():
            for value in HOSTILE_ANSWERS:
                quiz.answer(q.id, value)
                assert len(capsys.readouterr().out) < 3000, (q.id, repr(value)[:20])
                tried += 1
    assert tried > 200
