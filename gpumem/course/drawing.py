"""Drawing helpers for the chapters' ASCII diagrams: a framed box and a proportional bar.

Diagrams are rendered from the library's numbers, never typed; nbval compares the rendered text.
"""

WIDTH = 78


def box(title: str, lines: list[str], width: int = WIDTH) -> str:
    """A framed panel with a title row; long lines wrap inside the frame."""
    inner = width - 4
    out = ["┌" + "─" * (width - 2) + "┐", f"│ {title:<{inner}} │", "├" + "─" * (width - 2) + "┤"]
    for line in lines:
        while len(line) > inner:   # wrap long lines rather than break the frame
            out.append(f"│ {line[:inner]} │")
            line = "  " + line[inner:]
        out.append(f"│ {line:<{inner}} │")
    out.append("└" + "─" * (width - 2) + "┘")
    return "\n".join(out)


def bar(value: int, scale: int, width: int = 20) -> str:
    """``value`` as a share of ``scale``, drawn in ``width`` cells (█ filled, · empty)."""
    n = 0 if scale == 0 else min(width, round(width * value / scale))
    return "█" * n + "·" * (width - n)


def figure_png(fig) -> str:
    """``fig`` as a PNG (base64 text, as a notebook stores it), cropped to what it draws. A
    pyplot figure is closed afterwards, so the inline backend does not draw it a second time;
    a ``matplotlib.figure.Figure`` built without pyplot is in no registry and needs no closing."""
    import base64
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=fig.dpi)
    if getattr(fig.canvas, "manager", None) is not None:   # pyplot's: drop it from pyplot's registry
        import matplotlib.pyplot as plt
        plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def show_figures(*figs, alt: str | None = None) -> None:
    """Display each matplotlib figure in a notebook as a PNG alone (``alt``, when given, is its
    text form), never matplotlib's ``<Figure size ...>`` text (:func:`figure_png` renders it).
    Every chapter's ``plots.show`` is this function."""
    from IPython.display import display
    for fig in figs:
        data = {"image/png": figure_png(fig)}
        display(data | ({"text/plain": alt} if alt else {}), raw=True)


def show_source(*objs) -> None:
    """Each function's source as a highlighted Python block (Markdown), its text form beside it.
    Source keeps its own line lengths: a code block scrolls sideways, a table or a ledger must not."""
    import inspect

    from IPython.display import Markdown, display
    for obj in objs:
        src = inspect.getsource(obj).rstrip("\n")
        display(Markdown(f"```python\n{src}\n```"))


def progress_wanted() -> bool:
    """Whether a long cell should show a progress bar: in a live kernel, not in text mode (nbval,
    ``tools/execute_notebooks.py``: ``GPUMEM_QUIZ_MODE=text``) and not when tqdm is told to be quiet."""
    import os
    if os.environ.get("GPUMEM_QUIZ_MODE") == "text" or os.environ.get("TQDM_DISABLE"):
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None


def progress(items, desc: str = "", total: int | None = None):
    """``items`` with a tqdm bar where :func:`progress_wanted`, else ``items`` unchanged."""
    if not progress_wanted():
        return items
    from tqdm.auto import tqdm
    return tqdm(items, desc=desc, total=total, leave=False)


class busy:
    """``with busy("tracing 80 layers, about 60 s"):`` a bar with the seconds elapsed while a
    long call without steps of its own runs (where :func:`progress_wanted`; else nothing)."""

    def __init__(self, desc: str):
        self.desc, self.bar, self.stop = desc, None, None

    def __enter__(self):
        if not progress_wanted():
            return self
        import threading

        from tqdm.auto import tqdm
        self.bar = tqdm(total=None, desc=self.desc, bar_format="{desc}: {elapsed} elapsed", leave=False)
        self.stop = threading.Event()

        def tick():
            while not self.stop.wait(1.0):
                self.bar.refresh()
        threading.Thread(target=tick, daemon=True).start()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.stop.set()
            self.bar.close()
        return False
