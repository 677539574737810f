"""Saved quiz progress, so a learner sees what they have done across sessions and chapter 07 can
grade it: ``progress.json`` in ``$GPUMEM_HOME``, else in ``~/.gpumem``.

One entry per quiz and question: ``{"correct": bool, "attempts": int}``, plus ``"revealed"``
(how often the answer was shown) once it has been. A question answered correctly stays correct.
"""

import json
import os
from pathlib import Path


def progress_file() -> Path:
    """Where quiz progress is saved: ``progress.json`` in ``$GPUMEM_HOME``, else ``~/.gpumem``."""
    return Path(os.environ.get("GPUMEM_HOME", Path.home() / ".gpumem")) / "progress.json"


def load_progress() -> dict:
    """Saved quiz progress by quiz and question; empty when the file is missing or unreadable."""
    path = progress_file()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _update(quiz: str, qid: str, change) -> None:
    path = progress_file()
    data = load_progress()
    entry = data.setdefault(quiz, {}).setdefault(qid, {"correct": False, "attempts": 0})
    change(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


def save_result(quiz: str, qid: str, correct: bool) -> None:
    """Record one graded attempt at a question; once answered correctly it stays correct."""
    def change(entry):
        entry["attempts"] += 1
        entry["correct"] = entry["correct"] or correct
    _update(quiz, qid, change)


def save_reveal(quiz: str, qid: str) -> None:
    """Record that the answer of a question was shown (on request or after two wrong tries)."""
    def change(entry):
        entry["revealed"] = entry.get("revealed", 0) + 1
    _update(quiz, qid, change)
