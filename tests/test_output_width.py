"""Issue 24, item 3: what the chapters show fits 100 columns.

Executes nothing: it reads the outputs stored in the executed chapter notebooks. Every line of
text a reader is shown (stream output, and the text/plain of a result that has no richer form)
is at most 100 characters. Library source is shown as a highlighted Markdown code block
(``drawing.show_source``), which keeps the code's own lines and scrolls inside its block; its
text/plain stand-in is not what a reader sees, so it is not measured.

The renderers behind the ledger's explanations wrap at word boundaries: checked here against
the claims' own text, word for word.
"""

import json
import re

import pytest

from conftest import ROOT

NOTEBOOKS = sorted(ROOT.glob("notebooks/0*.ipynb"))
WIDTH = 100
RICH = ("text/html", "text/markdown", "image/png", "image/svg+xml")


def shown_text(out) -> str:
    """The text of one stored output as a reader sees it ('' when a richer form is shown)."""
    if out.get("output_type") == "stream":
        text = out.get("text", "")
    else:
        data = out.get("data", {})
        if any(k in data for k in RICH):
            return ""
        text = data.get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


def wide_lines(path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text())["cells"]
    return [(i, line) for i, c in enumerate(cells) if c["cell_type"] == "code"
            for out in c.get("outputs", []) for line in shown_text(out).splitlines() if len(line) > WIDTH]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_fit_100_columns(path):
    wide = wide_lines(path)
    assert not wide, "\n".join(f"cell {i}: {len(line)} columns: {line[:90]}" for i, line in wide[:5])


def test_a_line_of_101_columns_is_caught(tmp_path):
    """The scan itself: a stream line of 101 characters is reported, a Markdown code block is not."""
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["x" * 100 + "\n", "y" * 101 + "\n"]},
        {"output_type": "display_data", "metadata": {},
         "data": {"text/markdown": "```python\n" + "z" * 120 + "\n```", "text/plain": "z" * 120}}]}]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert wide_lines(path) == [(0, "y" * 101)]


# chapter 01's claims trace whole models (half a minute): its ledger's width is checked in the
# stored notebook above; a made-up claim with a long word stands in for the renderer here
@pytest.mark.parametrize("chapter", ["ch03_activation_checkpointing", "ch04_flash_attention", "ch05_offload",
                                     "ch06_combining_strategies"])
def test_ledger_explanations_wrap_at_word_boundaries(chapter):
    import importlib

    from gpumem.course import ledger
    claims = importlib.import_module(f"gpumem.chapters.{chapter}.claims").CLAIMS
    text = ledger.explanations(claims)                        # the default width: 100
    assert all(len(line) <= WIDTH for line in text.splitlines())
    one_line = ledger.explanations(claims, width=None)
    # the same words in the same order: wrapping only turned spaces into line breaks + indent
    assert re.split(r"\s+", text.strip()) == re.split(r"\s+", one_line.strip())
    # each claim's paragraph starts on a line of its own with its id
    heads = [line for line in text.splitlines() if not line.startswith("    ")]
    assert [h.split("]")[0] + "]" for h in heads] == [f"[{c.id}]" for c in claims]


def test_a_long_word_is_never_cut():
    from gpumem.course import ledger
    url = "https://example.org/" + "a" * 90                      # longer than a line's room
    claim = ledger.Claim("x1", "a figure", 1e9, lambda: 1e9, lambda: "see " + url + " for the table", unit="GB")
    text = ledger.explanations([claim])
    assert url in text.split() and text.splitlines()[0] == "[x1] agrees: see"
