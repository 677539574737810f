"""The checklist machinery (``gpumem.course.checklist``) on questions built here, apart from any
chapter: items ticked from saved progress, pointers appended once, the summary of what to
revisit, headings read from a notebook, one item shown as text or widgets."""

import json

import pytest

from gpumem.course import checklist as cl
from gpumem.course.progress import progress_file
from gpumem.course.quiz import Choice, Numeric

A = cl.Pointer("01_memory_anatomy", "A section")
B = cl.Pointer("02_zero", "Another section")


def _items():
    double = Numeric("double", "Twice {x}?", answer=lambda n: 2 * n["x"], unit="GB", hint="Add it twice.",
                     explanation="2 x {x} = {answer} GB.", draw=lambda rng: {"x": rng.choice([3, 5, 7, 11])})
    pick = Choice("pick", "Which is prime?", ["4", "6", "7", "9"], answer=2, hint="Divisors.",
                  explanation="7 has no divisor but 1 and itself.")
    fixed = Numeric("fixed", "Bytes per bf16 number?", answer=2, unit="bytes", hint="16 bits.",
                    explanation="16 bits are 2 bytes.")
    return [cl.Item("one", "First item", [double, pick], {"double": (A,), "pick": (A, B)}),
            cl.Item("two", "Second item", [fixed], {"fixed": (B,)})]


def test_items_are_one_quiz_and_explanations_end_with_their_pointers():
    c = cl.Checklist("cl-test", _items())
    assert [q.id for q in c.quiz.questions] == ["double", "pick", "fixed"] and c.quiz.name == "cl-test"
    pick = c.quiz._get("pick")
    assert pick.explanation_text() == ('7 has no divisor but 1 and itself. See notebook 01_memory_anatomy, '
                                       'section "A section"; notebook 02_zero, section "Another section".')
    double = c.quiz._get("double")
    assert double.explanation_text().startswith(f"2 x {double.numbers['x']} = ")
    again = cl.Checklist("cl-test", c.items)          # a second checklist does not point twice
    assert again.quiz._get("pick").explanation_text().count("See notebook") == 1
    assert c.pointers() == [A, B] and c.item("2") is c.items[1] and c.item("one") is c.items[0]
    with pytest.raises(KeyError):
        c.item("three")


def test_every_question_needs_a_pointer_and_keys_are_unique():
    items = _items()
    items[1].see = {}
    with pytest.raises(ValueError, match="no pointer"):
        cl.Checklist("cl-bad", items)
    items = _items()
    items[1].key = "one"
    with pytest.raises(ValueError, match="duplicate"):
        cl.Checklist("cl-bad", items)


def test_view_and_summary_follow_the_saved_progress(capsys):
    c = cl.Checklist("cl-test", _items())
    assert "[ ] 1. First item (0/2)" in c.view() and "0 of 2 items done." in c.view()
    c.answer("pick", "7")
    c.answer("fixed", "show")
    view = c.view()
    assert "[~] 1. First item (1/2)" in view and "      [x] pick" in view and "      [ ] double" in view
    assert "[ ] 2. Second item (0/1)" in view
    summary = c.summary()
    assert summary.splitlines() == [
        "To revisit (2 of 2 items):",
        "1. First item (1/2 answered)",
        '   - double: notebook 01_memory_anatomy, section "A section"',
        "2. Second item (0/1 answered)",
        '   - fixed, answer shown: notebook 02_zero, section "Another section"']
    # a later session: the progress file is read again
    fresh = cl.Checklist("cl-test", _items())
    fresh.quiz.renew("fixed", quiet=True)
    fresh.answer("fixed", "2 B")
    double = fresh.quiz._get("double")
    fresh.answer("double", f"{2 * double.numbers['x']} GB")
    assert "2 of 2 items done." in fresh.view() and fresh.summary() == "All 2 items done: nothing to revisit."
    saved = json.loads(progress_file().read_text())["cl-test"]
    assert saved["pick"]["correct"] and saved["fixed"]["revealed"] == 1
    capsys.readouterr()


def test_show_prints_one_item_in_text_mode(capsys, monkeypatch):
    monkeypatch.setenv("GPUMEM_QUIZ_MODE", "text")
    c = cl.Checklist("cl-test", _items())
    c.show("one")
    out = capsys.readouterr().out
    assert out.startswith("Item 1 of 2: First item\n[double] Twice ")
    pick = c.quiz._get("pick")
    assert f"({pick.options.index('7')}) 7" in out and "(a number in GB; other byte units are converted)" in out and "[fixed]" not in out
    assert "double (number, GB)" in c.outline() and "pick (choice)" in c.outline()


def test_show_builds_widgets_in_a_kernel(monkeypatch):
    import ipywidgets as w
    shown = []
    monkeypatch.setattr(cl, "widgets_available", lambda: True)
    monkeypatch.setattr("IPython.display.display", shown.append)
    cl.Checklist("cl-test", _items()).show("two")
    box = shown[0]
    assert isinstance(box, w.VBox) and "Item 2: Second item" in box.children[0].value
    assert len(box.children) == 2 and "gpumem-quiz" in box._dom_classes


def test_notebook_headings_and_missing_pointers(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["# Title\n", "text\n", "## A section\n"]},
                    {"cell_type": "code", "source": "# not a heading"},
                    {"cell_type": "markdown", "source": "### Deeper one"}]}
    (tmp_path / "01_memory_anatomy.ipynb").write_text(json.dumps(nb))
    assert cl.notebook_headings(tmp_path / "01_memory_anatomy.ipynb") == ["Title", "A section", "Deeper one"]
    missing = cl.missing_pointers([A, B, cl.Pointer("01_memory_anatomy", "Nowhere")], tmp_path)
    assert missing == [B, cl.Pointer("01_memory_anatomy", "Nowhere")]


def test_quiz_progress_counts_per_quiz():
    c = cl.Checklist("cl-test", _items())
    c.answer("pick", "7")
    c.answer("fixed", "show")
    assert cl.quiz_progress([c.quiz]) == "[~] cl-test: 1 of 3 answered correctly, 1 answer(s) shown"


# -- a shown answer earns nothing in the same sitting (review D5) --------------------------------

def _saved(name="cl-test") -> dict:
    return json.loads(progress_file().read_text()).get(name, {}) if progress_file().exists() else {}


def earns(c, qid, value, capsys) -> bool:
    """Whether an answer is counted: its feedback says "Correct" (a right answer that is not
    counted returns True from ``answer`` too, and says so)."""
    capsys.readouterr()
    c.answer(qid, value)
    return capsys.readouterr().out.startswith("Correct")


def test_choice_options_are_shuffled_per_attempt_and_keep_the_right_text():
    c = cl.Checklist("cl-test", _items())
    pick, orders = c.quiz._get("pick"), set()
    for _ in range(40):
        c.quiz.renew("pick", quiet=True)
        assert sorted(pick.options) == ["4", "6", "7", "9"] and pick.expected() == "7"
        orders.add(tuple(pick.options))
    assert len(orders) > 6 and len({o.index("7") for o in orders}) == 4


def test_show_renew_same_index_is_not_credited(capsys):
    """The exploit of the review: show, renew, answer the index that was right: not counted."""
    for seed in range(20):
        c = cl.Checklist("cl-test", _items())
        c.quiz.seed(seed)
        c.answer("pick", "show")
        shown = c.quiz._get("pick").answer
        c.renew("pick")
        assert not earns(c, "pick", shown, capsys)
        c.answer("pick", "7")                                    # nor the right text
        out = capsys.readouterr().out
        assert out.startswith("Right, but") and "not counted" in out and "answered double right" in out
        assert not _saved().get("pick", {}).get("correct") and "[ ] pick" in c.view()


def test_every_option_after_a_reveal_earns_nothing(capsys):
    c = cl.Checklist("cl-test", _items())
    c.answer("pick", "show")
    for i in range(4):
        c.renew("pick")
        assert not earns(c, "pick", i, capsys)
    for text in ("4", "6", "7", "9"):
        c.renew("pick")
        assert not earns(c, "pick", text, capsys)
    assert not _saved()["pick"]["correct"]


def test_wrong_tries_on_a_choice_add_up_across_renews(capsys):
    """Eliminating options with a renew between wrong tries shows the answer at the second."""
    c = cl.Checklist("cl-test", _items())
    pick = c.quiz._get("pick")
    wrong = [t for t in pick.options if t != "7"]
    c.answer("pick", wrong[0])
    c.renew("pick")
    c.answer("pick", wrong[1])
    assert "the answer is 7" in capsys.readouterr().out
    c.renew("pick")
    assert not earns(c, "pick", "7", capsys)


def test_shown_numbers_are_never_credited_only_fresh_ones(capsys):
    c = cl.Checklist("cl-test", _items())
    double = c.quiz._get("double")
    for _ in range(10):                          # 4 possible numbers: renew avoids shown ones
        c.answer("double", "show")
        shown = double.prompt_text()
        c.renew("double")
        if double.prompt_text() == shown:        # all four shown: nothing fresh is left to draw
            assert not earns(c, "double", f"{2 * double.numbers['x']} GB", capsys)
    assert not _saved()["double"]["correct"]
    fixed = c.quiz._get("fixed")                 # a question without numbers: not in this sitting
    c.answer("fixed", "show")
    c.renew("fixed")
    capsys.readouterr()
    c.answer("fixed", "2 B")
    assert "the answer for these numbers was shown" in capsys.readouterr().out
    assert not _saved()["fixed"]["correct"] and fixed.prompt_text() == "Bytes per bf16 number?"
    again = cl.Checklist("cl-test", _items())    # a new sitting
    assert earns(again, "fixed", "2 B", capsys) and _saved()["fixed"]["correct"]


def test_fresh_numbers_after_a_reveal_are_credited(capsys):
    c = cl.Checklist("cl-test", _items())
    c.quiz.seed(1)
    double = c.quiz._get("double")
    c.answer("double", "show")
    shown = double.prompt_text()
    c.renew("double")
    assert double.prompt_text() != shown
    assert earns(c, "double", f"{2 * double.numbers['x']} GB", capsys) and _saved()["double"]["correct"]


def test_the_legitimate_path_after_a_reveal_earns_the_choice(capsys):
    """Show the choice, answer the item's other question right, then the choice: credited."""
    c = cl.Checklist("cl-test", _items())
    c.answer("pick", "show")
    c.renew("pick")
    c.answer("pick", "7")
    assert "answered double right since then" in capsys.readouterr().out
    double = c.quiz._get("double")
    assert earns(c, "double", f"{2 * double.numbers['x']} GB", capsys)
    c.renew("pick")
    assert earns(c, "pick", "7", capsys)
    assert _saved()["pick"]["correct"] and "[x] 1. First item (2/2)" in c.view()


def test_widget_try_again_shows_the_new_option_order(monkeypatch):
    import ipywidgets as w
    shown = []
    monkeypatch.setattr(cl, "widgets_available", lambda: True)
    monkeypatch.setattr("IPython.display.display", shown.append)
    c = cl.Checklist("cl-test", _items())
    c.show("one")
    pick = c.quiz._get("pick")
    box = next(b for b in shown[0].children if "gpumem-question-pick" in b._dom_classes)
    entry, again = box.children[1], box.children[2].children[2]
    for _ in range(5):
        again.click()
        assert [label for label, _ in entry.options] == pick.options and entry.value is None
    assert isinstance(entry, w.RadioButtons) and cl.Checklist.rule.startswith("A shown answer")
