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
