"""Chapter 01's scenario explorer shows its controls once (issue 24, item 2: it displayed its box
and also returned the ``interactive``, which Jupyter displayed a second time)."""

import pytest


def test_explorer_displays_one_box_and_returns_nothing(monkeypatch):
    w = pytest.importorskip("ipywidgets")
    import IPython.display
    from gpumem.chapters.ch01_memory_anatomy import diagrams
    from gpumem.course import quiz
    shown = []
    monkeypatch.setattr(quiz, "widgets_available", lambda: True)
    monkeypatch.setattr(IPython.display, "display", lambda *objs: shown.extend(objs))
    assert diagrams.scenario_explorer(model="llama-3-8b") is None
    assert len(shown) == 1 and isinstance(shown[0], w.VBox)
    rows = shown[0].children
    controls = [c for row in rows[:2] for c in row.children]
    assert len(controls) == 8 and isinstance(rows[2], w.Output)
    assert controls[0].value == "llama-3-8b"
