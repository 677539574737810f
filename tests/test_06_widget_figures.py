"""Issue 24, item 1: the planner widget's figures live outside pyplot.

The inline backend's end-of-execution flush renders and closes every figure in pyplot's registry;
in JupyterLab it can run on another kernel thread than the widget's callback, and it drew the
widget's half-built chart (the browser test ``test_browser_planner.py`` shows it). A figure that
never enters the registry cannot be taken that way: checked here with pyplot's own list of open
figures, before and after the widget's render."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gpumem.chapters.ch06_combining_strategies import plots, widget  # noqa: E402
from gpumem.course import drawing  # noqa: E402


def test_widget_render_leaves_pyplot_untouched():
    plt.close("all")
    _text, fig, result = widget.render("llama-3-8b", "h100-80gb", 8, 4096, 64)
    assert plt.get_fignums() == [] and fig.canvas.manager is None
    assert plt.get_fignums() == [] and plots.time_bars(result).canvas.manager is None
    png = drawing.figure_png(fig)
    assert png.startswith("iVBORw0KGgo")           # base64 of the PNG signature \x89PNG\r\n\x1a\n


def test_a_pyplot_figure_is_still_closed_after_showing():
    fig, _ax = plt.subplots()
    assert plt.get_fignums() == [fig.number]
    drawing.figure_png(fig)
    assert plt.get_fignums() == []
