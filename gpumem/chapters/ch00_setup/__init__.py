"""Chapter 00, setup: how the course works, and its first quiz (the environment report and the
chapter map are course machinery: ``gpumem.course.envcheck``, ``gpumem.course.catalog``)."""

from .quiz import QUIZ

__all__ = ["QUIZ"]
