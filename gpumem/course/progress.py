"""Saved quiz progress, so a learner sees what they have done across sessions and chapter 07 can
grade it: ``progress.json`` in ``$GPUMEM_HOME``, else in ``~/.gpumem``.

One entry per quiz and question: ``{"correct": bool, "attempts": int}``, plus ``"revealed"``
(how often the answer was shown) once it has been. A question answered correctly stays correct.

The file never loses a learner's work:

* every save reads the file, adds its change and writes it back under a lock on
  ``progress.json.lock`` (``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows), so two
  notebooks or processes saving at once keep both their answers;
* a write goes to a temporary file in the same folder, flushed to disk, then ``os.replace``-d
  over the old one: a reader sees the old file or the new one, never half of one;
* a file that cannot be read, is not JSON or has the wrong shape is never overwritten: it is kept
  beside the new one as ``progress.json.unreadable-<YYYYmmddTHHMMSS>``, with one printed line
  saying so, and the entries of the right shape in it carry on in the new file;
* a save killed half-way leaves the old file whole; its temporary file is removed by the next save;
* a save that fails (a read-only or missing folder, a lock held too long) returns one line saying
  so and keeps the change in memory: this session's progress still shows, and the next save that
  works writes it too. Saving never raises.
"""

import json
import os
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path

LOCK_TIMEOUT = 10.0          # seconds a save waits for another process's save before giving up
_pending: dict[str, list] = {}   # per file: changes not written yet, replayed on the next save
_told: set[str] = set()          # lines already printed this session (said once)

try:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
except ImportError:          # Windows: a byte-range lock on the lock file's first byte
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def progress_file() -> Path:
    """Where quiz progress is saved: ``progress.json`` in ``$GPUMEM_HOME``, else ``~/.gpumem``.
    Raises OSError when neither is set and the user has no home folder."""
    home = os.environ.get("GPUMEM_HOME")
    if not home:
        try:
            home = Path.home() / ".gpumem"
        except (RuntimeError, KeyError) as err:
            raise OSError("no home folder to save quiz progress in; set GPUMEM_HOME") from err
    return Path(home) / "progress.json"


def _count(v) -> bool:
    return type(v) is int and v >= 0


def _entry_ok(entry) -> bool:
    return (isinstance(entry, dict) and type(entry.get("correct")) is bool
            and _count(entry.get("attempts")) and ("revealed" not in entry or _count(entry["revealed"])))


def valid_entries(data) -> tuple[dict, str]:
    """The entries of ``data`` (parsed JSON) that have the right shape, and what was wrong with
    the rest ('' when nothing)."""
    if not isinstance(data, dict):
        return {}, f"holds {type(data).__name__ if data is not None else 'null'}, not quizzes"
    good, bad = {}, 0
    for quiz, entries in data.items():
        if not isinstance(entries, dict):
            bad += 1
            continue
        good[quiz] = {qid: e for qid, e in entries.items() if _entry_ok(e)}
        bad += len(entries) - len(good[quiz])
    return good, (f"had {bad} part(s) of the wrong shape" if bad else "")


def _read(path: Path) -> tuple[dict, str]:
    """The valid entries of the file and what was wrong with it ('' for none; {} when absent)."""
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return {}, ""
    except OSError as err:
        return {}, f"cannot be read ({_why(err)})"
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (ValueError, RecursionError):
        return {}, "is not valid JSON (cut short or overwritten?)"
    return valid_entries(data)


def _why(err: OSError) -> str:
    return f"{err.strerror}: {err.filename}" if err.strerror and err.filename else str(err)


@contextmanager
def _locked(path: Path):
    """Hold the lock of ``path`` (creating its folder); TimeoutError after LOCK_TIMEOUT s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline, wait = time.monotonic() + LOCK_TIMEOUT, 0.001
        while not _try_lock(fd):
            if time.monotonic() > deadline:
                raise TimeoutError(f"another process held {path.name}.lock for over {LOCK_TIMEOUT:g} s")
            time.sleep(wait)
            wait = min(wait * 2, 0.05)
        try:
            yield
        finally:
            _unlock(fd)
    finally:
        os.close(fd)


def _set_aside(path: Path) -> Path:
    """Give the bad file a second name beside it (or move it there); returns that name."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside, n = path.with_name(f"{path.name}.unreadable-{stamp}"), 1
    while os.path.lexists(aside):
        aside, n = path.with_name(f"{path.name}.unreadable-{stamp}-{n}"), n + 1
    try:
        os.link(path, aside)      # both names until the new file replaces the old one
    except OSError:
        os.rename(path, aside)    # no hard links here (or a folder): move it
    return aside


def _replace(tmp: str, path: Path) -> None:
    for _ in range(40):           # Windows refuses while a reader has the file open: retry
        try:
            os.replace(tmp, path)
            return
        except PermissionError:
            if os.name != "nt":
                raise
            time.sleep(0.05)
    os.replace(tmp, path)


def _write(path: Path, data: dict, set_aside: bool) -> Path | None:
    """Write ``data`` atomically; first keep the old file aside when ``set_aside``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        aside = _set_aside(path) if set_aside else None
        _replace(tmp, path)
        return aside
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def _apply(data: dict, change: tuple) -> None:
    quiz, qid, kind, correct = change
    entry = data.setdefault(quiz, {}).setdefault(qid, {"correct": False, "attempts": 0})
    if kind == "result":
        entry["attempts"] += 1
        entry["correct"] = entry["correct"] or correct
    else:
        entry["revealed"] = entry.get("revealed", 0) + 1


def _commit(path: Path, changes: list) -> tuple[dict, str]:
    """Under the lock: read, add ``changes``, write; a bad file is kept aside. Returns what was
    written and the line saying a file was set aside ('' when none). Raises OSError when nothing
    could be written (the old file is then untouched)."""
    with _locked(path):
        for stale in path.parent.glob(f".{path.name}.*.tmp"):   # left by a save killed mid-write
            with suppress(OSError):
                stale.unlink()
        data, problem = _read(path)
        if not changes and not problem:
            return data, ""
        for change in changes:
            _apply(data, change)
        aside = _write(path, data, set_aside=bool(problem))
    if not problem:
        return data, ""
    kept = sum(len(v) for v in data.values())
    return data, (f"Quiz progress: {path} {problem}; the original is kept as {aside.name} beside "
                  f"it, and {kept} answer record(s) carry on in a new {path.name}.")


def _say(line: str) -> None:
    if line and line not in _told:
        _told.add(line)
        print(line)


def load_progress() -> dict:
    """Saved quiz progress by quiz and question, with this session's unsaved changes; only entries
    of the right shape. A bad file is set aside (one printed line) and its valid entries kept.
    Never raises."""
    try:
        path = progress_file()
    except OSError as err:
        _say(f"Quiz progress: {err}; answers are kept for this session only.")
        path = None
    data, problem = _read(path) if path else ({}, "")
    if problem:
        try:
            data, note = _commit(path, [])
            _say(note)
        except OSError as err:
            _say(f"Quiz progress: {path} {problem}; it is left as it is and nothing is saved over "
                 f"it ({_why(err)}).")
    for change in _pending.get(str(path or ""), []):
        _apply(data, change)
    return data


def _save(change: tuple) -> str:
    try:
        path = progress_file()
    except OSError as err:
        _pending.setdefault("", []).append(change)
        return f"Progress not saved: {err}; kept for this session."
    pending = _pending.setdefault(str(path), [])
    pending.append(change)
    try:
        _, note = _commit(path, pending)
    except OSError as err:
        return f"Progress not saved ({_why(err)}); kept for this session."
    pending.clear()
    return note


def save_result(quiz: str, qid: str, correct: bool) -> str:
    """Record one graded attempt at a question; once answered correctly it stays correct.
    Returns '' when saved, else one line to show (the save failed, or a bad file was set aside)."""
    return _save((quiz, qid, "result", bool(correct)))


def save_reveal(quiz: str, qid: str) -> str:
    """Record that the answer of a question was shown (on request or after two wrong tries).
    Returns '' when saved, else one line to show."""
    return _save((quiz, qid, "reveal", None))
