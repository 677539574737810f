"""What keeps a launched rank honest: it dies with its parent and shows it is alive.

Each rank started by :func:`gpumem.runs.launch.run` calls :func:`start` before it imports torch:

* **dies with its parent.** On Linux the kernel sends it SIGKILL when the parent dies
  (``prctl(PR_SET_PDEATHSIG)``); the parent's pid is checked right after, for a parent that died
  before the call. Everywhere, a thread reads the pipe the parent holds open on the rank's stdin:
  end-of-file means the parent is gone, and the rank ends at once. The heartbeat thread also checks
  that its parent is still the launcher (an orphan is adopted by another process).
* **shows it is alive.** A heartbeat thread touches ``heartbeat<rank>`` in the job folder every
  second; a stopped rank (SIGSTOP, a frozen machine) stops touching it, and the launcher ends the
  group when one heartbeat is older than its deadline.
* **leaves Ctrl-C to the parent.** A terminal's Ctrl-C reaches the whole process group; the
  launcher ends the ranks itself, so a rank ignores SIGINT rather than dying with a traceback.

The launcher's side is here too: :func:`stalled` reads the heartbeats, and
:func:`signals_stop_the_run` turns Ctrl-C and SIGTERM into one exception while ranks run.
No torch here: the guard must run before the slow imports.
"""

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ..errors import UsageError

PARENT_ENV = "GPUMEM_LAUNCH_PARENT"    # the launcher's pid
PIPE_ENV = "GPUMEM_LAUNCH_PIPE"        # "1": stdin is a pipe the launcher holds open
HEARTBEAT_S = 1.0
ORPHAN_EXIT = 70   # a rank that outlived its launcher exits with this code (nobody reads it)


def die_with_parent(parent: int) -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; True if the kernel agreed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        armed = libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != parent:   # the parent died before the call: nothing would signal us
        os._exit(ORPHAN_EXIT)
    return armed


def _watch_stdin() -> None:
    """End the process when the parent's end of the stdin pipe closes (the parent died)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os._exit(ORPHAN_EXIT)


def _beat(path: Path, parent: int) -> None:
    while True:
        try:
            path.touch()
        except OSError:
            pass   # the folder is being removed: the launcher is ending the group
        if os.getppid() != parent:
            os._exit(ORPHAN_EXIT)
        time.sleep(HEARTBEAT_S)


def start(job: Path, rank: int) -> None:
    """Guard this rank: parent-death signal, stdin watchdog, heartbeat, Ctrl-C left to the parent."""
    parent = int(os.environ.get(PARENT_ENV, os.getppid()))
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get(PIPE_ENV) == "1":
        threading.Thread(target=_watch_stdin, name="gpumem-parent-watch", daemon=True).start()
    threading.Thread(target=_beat, args=(job / f"heartbeat{rank}", parent), name="gpumem-heartbeat",
                     daemon=True).start()


# ---- the launcher's side -------------------------------------------------------------------

def stalled(path: Path, rank: int, beats: dict, stall_s: float) -> bool:
    """Whether ``rank``'s heartbeat file has not changed for ``stall_s`` seconds of the launcher's
    clock. ``beats[rank]`` is (last stamp seen, when it was seen); start it at (None, launch time)."""
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = None
    seen, since = beats[rank]
    now = time.monotonic()
    if stamp != seen:
        beats[rank] = (stamp, now)
        return False
    return now - since > stall_s


class Stop(KeyboardInterrupt):
    """Ctrl-C or SIGTERM arrived while ranks ran; ``how`` names it."""

    def __init__(self, how: str, signum: int = signal.SIGINT):
        super().__init__(how)
        self.how, self.signum = how, int(signum)


@contextlib.contextmanager
def signals_stop_the_run():
    """While ranks run, Ctrl-C and SIGTERM raise :class:`Stop` once; a repeat does nothing, so the
    clean-up it started finishes. A handler the program installed itself is left alone (only the
    defaults and gpumem's own are replaced); outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def stop(signum, frame):
        if fired:
            return
        fired.append(signum)
        raise Stop("Ctrl-C (KeyboardInterrupt)" if signum == signal.SIGINT else signal.Signals(signum).name,
                   signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(sig)
        if current in (signal.default_int_handler, signal.SIG_DFL) \
                or getattr(current, "__module__", "").startswith("gpumem"):
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stall_seconds(given, env_name: str, default: float) -> float:
    """The heartbeat deadline: ``given``, else ``$<env_name>``, else ``default``; bad values refused."""
    text = given if given is not None else os.environ.get(env_name, default)
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0 < value < 86400:   # nan fails both comparisons
        source = "stall_timeout" if given is not None else env_name
        raise UsageError(f"{source} {str(text)[:40]!r} is not a number of seconds; accepted: more than 0, "
                         "less than 86400")
    return value


def inductor_default(value: str | None) -> bool:
    """Whether inductor's cache folder is unset or torch's default, ``<tmp>/torchinductor_<user>``
    (the temp folder of whichever process looked it up first)."""
    return value is None or Path(value).name.startswith("torchinductor_")
