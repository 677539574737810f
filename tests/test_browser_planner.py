"""Real browser: chapter 06's planner widget redraws its chart right on every change of a control.

Issue 24, item 1: in JupyterLab the chart drew broken (bars with no axes, title or legend) on the
first one or two changes of a control, while driving the callback in the kernel always gave the
right image. The test starts JupyterLab as ``make lab`` does (``test_browser.lab_command``), runs
a notebook holding the chapter's import, one figure shown as the chapter shows it, and the widget
cell, then changes the model twice and the GPU count once, and checks each image the widget shows.

The good image is derived independently of the widget: ``plots.memory_bars`` for the same
question drawn in this process on Agg and saved as ``drawing.show_figures`` saves it. A good image
has the size of that one (within a few pixels) and dark pixels (tick labels, axis label, title,
legend text) outside the bars' area: left of the axes, under them and right of them.
"""

import base64
import io
import json
import time

import pytest

from test_browser import chromium, jupyter_lab, run_all_cells

pytestmark = pytest.mark.browser

CELLS = [
    "from gpumem.chapters import ch06_combining_strategies as ch",
    'r70 = ch.scenarios.ask("70b-8gpu")\nch.plots.show(ch.plots.memory_bars(r70, top=6))',
    "ch.widget.planner_widget()",
]
# the widget's defaults, then each change the test makes: (control, value) -> the question drawn
DEFAULT = dict(model="llama-3-70b", gpu="h100-80gb", gpus=8, seq=4096, global_batch=64)
CHANGES = [("model", "llama-3-8b"), ("model", "llama-3.1-405b"), ("gpus", 16)]


def _notebook(cells: list[str]) -> str:
    return json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                   "source": c} for c in cells],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5})


def _good_size(**question) -> tuple[int, int]:
    """The size of the right image for ``question``, drawn here on Agg as the widget saves it."""
    import matplotlib
    matplotlib.use("Agg")
    from PIL import Image

    from gpumem.chapters.ch06_combining_strategies import plots, widget
    _text, fig, _ = widget.render(**question)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=fig.dpi)
    return Image.open(buf).size


def _ink(img, box) -> int:
    """Dark pixels (text, spines, ticks: every channel < 100) inside ``box`` (l, t, r, b)."""
    region = img.convert("RGB").crop(box)
    return sum(1 for r, g, b in region.getdata() if max(r, g, b) < 100)


def _check_image(png: bytes, size: tuple[int, int], label: str, shots) -> None:
    from PIL import Image
    img = Image.open(io.BytesIO(png))
    shots.append((label, img.size))
    w, h = img.size
    assert abs(w - size[0]) <= 8 and abs(h - size[1]) <= 8, f"{label}: image {img.size}, a good one is {size}"
    # tick labels left of the axes, the x label under them, the legend right of them
    assert _ink(img, (0, 0, w // 6, h)) > 200, f"{label}: no tick labels left of the bars"
    assert _ink(img, (0, h - h // 8, w, h)) > 100, f"{label}: no x-axis label under the bars"
    assert _ink(img, (w - w // 8, 0, w, h)) > 100, f"{label}: no legend right of the bars"
    assert _ink(img, (0, 0, w, max(h // 10, 20))) > 100, f"{label}: no title above the bars"


@pytest.fixture
def planner_lab(tmp_path):
    work = tmp_path / "repo"
    (work / "notebooks").mkdir(parents=True)
    (work / "notebooks" / "planner_widget.ipynb").write_text(_notebook(CELLS))
    with jupyter_lab(tmp_path, work, "planner_widget.ipynb", token="gpumem-browser-planner") as url:
        yield url


def _widget_png(page, before: str | None, timeout: float = 60) -> str:
    """The src of the image the widget's Output shows, once it differs from ``before``."""
    img = page.locator(".widget-output img").last
    deadline = time.time() + timeout
    while True:
        src = img.get_attribute("src", timeout=timeout * 1000) if img.count() else None
        if src and src != before and src.startswith("data:image/png;base64,"):
            return src
        if time.time() > deadline:
            raise AssertionError("the widget's image did not change")
        time.sleep(0.2)


def test_planner_widget_redraws_a_whole_chart_on_every_change(planner_lab, tmp_path):
    from playwright.sync_api import sync_playwright

    shots: list = []
    question = dict(DEFAULT)
    with sync_playwright() as pw:
        browser = chromium(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(planner_lab)
            run_all_cells(page)
            page.locator(".widget-output img").last.wait_for(timeout=120_000)
            src = _widget_png(page, None)
            pngs = [("defaults", dict(question), src)]
            for control, value in CHANGES:
                question[control] = value
                if control == "model":
                    page.locator(".widget-dropdown select").first.select_option(value)
                else:   # the GPUs slider: one step right (8 -> 16) from the keyboard
                    page.locator(".widget-hslider .noUi-handle").first.focus()
                    page.keyboard.press("ArrowRight")
                src = _widget_png(page, src)
                time.sleep(1.0)              # a later message for the same change would land here
                src = _widget_png(page, None)
                pngs.append((f"{control}={value}", dict(question), src))
                page.screenshot(path=str(tmp_path / f"planner-{len(pngs) - 1}.png"), full_page=True)
        finally:
            page.screenshot(path=str(tmp_path / "planner.png"), full_page=True)
            browser.close()
    for label, q, src in pngs:
        png = base64.b64decode(src.split(",", 1)[1])
        (tmp_path / f"widget-{label.replace('=', '-')}.png").write_bytes(png)
        _check_image(png, _good_size(**q), label, shots)
    print(shots)
