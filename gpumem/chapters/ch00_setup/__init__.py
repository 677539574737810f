"""Chapter 00, setup: how the course works, and its first quiz (the environment report and the
chapter map are course machinery: ``gpumem.course.envcheck``, ``gpumem.course.catalog``).

``environment_report()`` is envcheck's report as the notebook shows it: the checkout's own
folder written as ``<course>``, so that a stored output names no one's machine.
"""

from pathlib import Path

from .quiz import QUIZ

__all__ = ["QUIZ", "environment_report"]


def environment_report() -> str:
    """What is installed and what works here, with this checkout's path shown as ``<course>``."""
    from gpumem.course import envcheck
    root = str(Path(__file__).resolve().parents[3])
    return envcheck.report().replace(root, "<course>")
