"""Quiz machinery: grading, feedback, saved progress, plain-text mode."""

import json

from gpumem.course import quiz as q
from gpumem.chapters.ch00_setup import QUIZ as SETUP


def test_numeric_answer_is_computed_and_tolerant():
    question = SETUP._get("gib-of-80gb")
    assert abs(question.value() - 80e9 / 2**30) < 1e-9      # 74.505... computed, not typed
    assert question.grade("74.5") and question.grade(74.6)
    assert not question.grade(80) and not question.grade("eighty")


def test_choice_grading_by_index_or_text():
    question = SETUP._get("cpu-real")
    assert question.grade(2) and question.grade(question.options[2])
    assert not question.grade(0)


def test_answer_prints_feedback_and_saves_progress(capsys):
    assert not SETUP.answer("cpu-real", 0)
    out = capsys.readouterr().out
    assert out.startswith("Not quite: the answer is Real DeepSpeed")
    assert SETUP.answer("cpu-real", 2)
    assert capsys.readouterr().out.startswith("Correct.")
    saved = json.loads(q.progress_file().read_text())
    assert saved["00_setup"]["cpu-real"] == {"correct": True, "attempts": 2}
    listing = q.checklist([SETUP])
    assert "[x] cpu-real" in listing and "[ ] gib-of-80gb" in listing


def test_text_mode_without_a_kernel(capsys, monkeypatch):
    monkeypatch.setenv("GPUMEM_QUIZ_MODE", "text")
    assert SETUP.show() is None
    out = capsys.readouterr().out
    assert "[gib-of-80gb]" in out and "(2) Real DeepSpeed" in out and 'quiz.answer("<id>"' in out


def test_widget_answers_through_the_same_grader():
    import ipywidgets as w
    box = q._question_widget(SETUP, SETUP._get("cpu-real"))
    radio, button, out = box.children[1], box.children[2], box.children[3]
    assert isinstance(radio, w.RadioButtons)
    radio.value = 2
    button.click()
    assert "Correct." in out.value
    radio.value = 1
    button.click()
    assert "Not quite" in out.value
