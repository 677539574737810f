"""Scratch folders that a killed run cannot leave behind for good.

A run that writes temporary files (the ranks' job folder, NVMe swap files, the disk ladder's rung)
makes its folder with :func:`make`. The folder's name carries the owner's process id, so when the
owner is killed (SIGKILL skips every clean-up) the next run of the same kind finds the folder with
:func:`sweep`, sees that its owner is gone and removes it, with one line saying so. The owner
still removes its own folder on every ordinary path (``with scratch.folder(...)``).
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "gpumem-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True   # someone else's process, or a platform without signal 0: keep the folder
    return True


def make(kind: str, base: str | os.PathLike | None = None) -> Path:
    """A new folder ``<base>/gpumem-<kind>-<pid>-<random>`` (base: the temp directory)."""
    if "-" in kind or not kind:
        raise ValueError(f"scratch kind {kind!r} must be one word without '-'")
    base = Path(base) if base is not None else Path(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-", dir=base))


def sweep(kind: str, base: str | os.PathLike | None = None) -> list[str]:
    """Remove ``kind`` folders under ``base`` whose owner process has ended; one note per folder."""
    base = Path(base) if base is not None else Path(tempfile.gettempdir())
    notes = []
    try:
        found = sorted(base.glob(f"{PREFIX}{kind}-*-*"))
    except OSError:
        return notes
    for path in found:
        pid_text = path.name[len(PREFIX) + len(kind) + 1:].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _alive(int(pid_text)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            notes.append(f"removed {path}, left by a {kind} run that was killed (pid {pid_text})")
    return notes


@contextlib.contextmanager
def folder(kind: str, base: str | os.PathLike | None = None, note=None):
    """Sweep what killed runs of ``kind`` left, then yield a fresh folder removed on exit.

    ``note`` (e.g. ``print`` or a logger) receives each sweep line; by default they go nowhere.
    """
    for line in sweep(kind, base):
        if note is not None:
            note(line)
    path = make(kind, base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
