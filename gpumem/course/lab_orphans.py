"""Processes a learner's cells started that no longer show as the kernel's children (issue 21, r11).

:func:`gpumem.course.lab_audit.foreign_children` refuses a graded call while a child process of the
kernel runs. Review r11 beat it with a helper double-forked in a cell (fork, ``setsid``, fork again,
the middle exits): the helper is re-parented to init (pid 1) or to the nearest *child subreaper*
among its ancestors, is no longer the kernel's child, and answered the grader's questions through a
pipe (lab 01 31/31, lab 03's choose_saved 15/15). Two nets, whatever channel the helper talks through:

* :func:`adopt` (Linux, called each time ``lab_audit.install`` runs, i.e. before each graded
  call; in an IPython kernel only): the kernel becomes a child subreaper
  (``prctl(PR_SET_CHILD_SUBREAPER, 1)``), so an orphan of any of its descendants is re-parented to
  the kernel and ``foreign_children`` lists it (whatever its environment).
  :func:`reap` collects the zombies such orphans leave when they end, never a pid that an object
  in this process still holds as its ``pid`` (``subprocess.Popen``, ``multiprocessing``'s
  processes, a pty's child): their owners' waits keep their exit status.
* :func:`orphans`, for a helper started before the first check: a live process of this user,
  started after the kernel, whose parent is init or one of the kernel's ancestors above its parent
  (where an orphan of the kernel lands; the kernel's parent's own children, such as other kernels,
  nbval's or pytest-xdist's siblings, are not looked at), and that came from this kernel: it
  carries the kernel's token in :data:`MARK` (set in ``os.environ`` when this module loads: every
  program started since inherits it), or it is a fork that did not exec (the kernel's command line
  and environment), or the kernel is a Jupyter kernel (``JPY_PARENT_PID``, its server's pid) and
  the process's environment holds all of the kernel's (a program it started before). Programs of
  another terminal or session (tmux, an editor, ``nohup`` jobs, systemd's user services, another
  job of the same CI runner) carry neither and are not refused.

Not caught: a helper given an environment of its own (``env={}``, or ``MARK`` removed) and a
command line of its own, started before the first check (after it, a kernel adopts it), or in a
process that is no IPython kernel (a script grading in-process adopts nothing); a helper whose
orphan lands on the kernel's parent (a kernel whose parent is init, e.g. a Jupyter server run as a
container's pid 1 without ``--init``); a process started from outside the kernel (another
terminal); a C library's own child that it waits for later by pid with no Python object holding
that pid (:func:`reap` could take its exit status). Linux reads /proc. Elsewhere (macOS) there is
no subreaper: :func:`adopt` does nothing and :func:`orphans` uses psutil where it is installed
(else it sees nothing), as ``foreign_children`` sees no children.
"""

import ctypes
import gc
import os
import pathlib
import sys

PR_SET_CHILD_SUBREAPER = 36
MARK = "GPUMEM_LAB_KERNELS"     # the tokens of the processes (with lab_audit loaded) a program descends from
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")   # as lab_audit's
_PROC = pathlib.Path("/proc")
_LINUX = sys.platform.startswith("linux") and (_PROC / "self" / "stat").exists()
_HELD: set = set()          # (pid, start) of zombie children found held by an object here: left alone
_SELF: dict = {}            # pid -> (start, environment entries, command line) of this process


def in_kernel() -> bool:
    """This process runs an IPython kernel (a learner's, nbval's, a notebook runner's)."""
    app = sys.modules.get("ipykernel.kernelapp")
    try:
        return bool(app is not None and app.IPKernelApp.initialized())
    except Exception:             # noqa: BLE001 - an ipykernel of another shape
        return False


def adopt(on: bool | None = None) -> bool:
    """Linux: make this process a child subreaper (its descendants' orphans become its children),
    or stop (``on=False``). ``None``: only in a kernel (:func:`in_kernel`): a test run or script
    that grades in-process keeps init reaping its orphans at once (a test waiting for a killed
    launcher's ranks to go would wait on zombies here). True when set; False elsewhere."""
    if on is None:
        on = in_kernel()
        if not on:
            return False
    if not _LINUX:
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0 and on
    except (OSError, AttributeError):
        return False


def _psutil():
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _read(path: str) -> bytes:
    """The start of a /proc file, read with two system calls (pathlib's read_text took most of a
    graded call's watch: :func:`orphans` reads every process's stat before each call)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[int, float, str]:
    """(parent pid, start time, state letter) of ``pid``; OSError when it is gone or unreadable."""
    if _LINUX:
        try:
            fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
            return int(fields[1]), float(fields[19]), fields[0].decode()
        except (IndexError, ValueError) as e:
            raise OSError(str(e)) from None
    psutil = _psutil()
    if psutil is None:
        raise OSError("no /proc and no psutil")
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return p.ppid(), p.create_time(), "Z" if p.status() == psutil.STATUS_ZOMBIE else "R"
    except psutil.Error as e:
        raise OSError(str(e)) from None


def _pids() -> list[int]:
    if _LINUX:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    psutil = _psutil()
    return psutil.pids() if psutil is not None else []


def _uid(pid: int) -> int:
    """The real uid (/proc's status line: a non-dumpable process's /proc folder belongs to root)."""
    if _LINUX:
        for line in (_PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
        raise OSError("no Uid line")
    try:
        return _psutil().Process(pid).uids().real
    except Exception as e:        # noqa: BLE001 - psutil's errors, or none installed
        raise OSError(str(e)) from None


def _environ(pid: int) -> frozenset:
    if _LINUX:
        return frozenset(e for e in (_PROC / str(pid) / "environ").read_bytes().split(b"\0") if e)
    try:
        return frozenset(f"{k}={v}".encode() for k, v in _psutil().Process(pid).environ().items())
    except Exception as e:        # noqa: BLE001
        raise OSError(str(e)) from None


def command(pid: int) -> str:
    """``pid``'s command line ("" while it is still exec-ing, or when unreadable)."""
    try:
        if _LINUX:
            return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        return " ".join(_psutil().Process(pid).cmdline()).strip()
    except Exception:             # noqa: BLE001 - gone, denied, or no psutil
        return ""


def _me() -> tuple[float, frozenset, str]:
    """This process's start time, environment as it started, and command line (once per pid)."""
    pid = os.getpid()
    if pid not in _SELF:
        try:
            env = _environ(pid)
        except OSError:
            env = frozenset(f"{k}={v}".encode() for k, v in os.environ.items())
        _SELF.clear()
        _SELF[pid] = (_stat(pid)[1], env, command(pid))
    return _SELF[pid]


def _landing() -> tuple[set[int], set[int]]:
    """Where an orphan of this process lands (init, or a subreaper among its ancestors; its parent
    is left out: its other children, e.g. other kernels, are not this one's orphans), and its
    ancestors."""
    chain, pid = [], os.getpid()
    while pid > 1 and len(chain) < 64:
        try:
            pid = _stat(pid)[0]
        except OSError:
            break
        chain.append(pid)
    return ({1} | set(chain)) - set(chain[:1]) - {0}, set(chain)


def _mark() -> bytes:
    """Add this process's token (pid and start time) to :data:`MARK` in its environment, which
    every program it starts from now on inherits; the token."""
    token = f"{os.getpid()}:{int(_me()[0])}"
    held = os.environ.get(MARK, "").split()
    if token not in held:
        os.environ[MARK] = " ".join(held + [token])
    return token.encode()


def _came_from_here(pid: int, env: frozenset, cmd: str, token: bytes) -> bool:
    """``pid`` carries this process's token (a program it started since this module loaded), or
    is a fork of it that did not exec (its command line, and its environment where readable), or
    this is a Jupyter kernel (``JPY_PARENT_PID``) and ``pid``'s environment holds all of its own
    (a program it started before)."""
    theirs = command(pid)
    try:
        their_env = _environ(pid)
    except OSError:           # a non-dumpable process's environment is unreadable
        return bool(theirs) and theirs == cmd
    marks = [e.split(b"=", 1)[1].split() for e in their_env if e.startswith(MARK.encode() + b"=")]
    jupyter = any(e.startswith(b"JPY_PARENT_PID=") for e in env)
    return any(token in m for m in marks) or (theirs == cmd and their_env == env) or (jupyter and env <= their_env)


def orphans() -> list[str]:
    """"pid N: command, re-parented to pid M" of each live process that came from this one and
    was re-parented away from it (module docstring); [] where processes cannot be listed."""
    try:
        start, env, cmd = _me()
        token = _mark()
    except OSError:
        return []
    (landing, ancestors), me, uid, out = _landing(), os.getpid(), os.getuid(), []
    for pid in _pids():
        try:
            ppid, born, state = _stat(pid)
            if pid == me or state == "Z" or ppid not in landing or pid in ancestors or born < start \
                    or _uid(pid) != uid or not _came_from_here(pid, env, cmd, token):
                continue
        except OSError:
            continue
        theirs = command(pid)
        if theirs and not any(h in theirs for h in HELPERS):
            out.append(f"pid {pid}: {theirs[:80]}, re-parented to pid {ppid}")
    return out


def children() -> list[int]:
    """This process's child pids (Linux: /proc; elsewhere psutil's, where installed)."""
    if _LINUX:
        out = []
        for task in (_PROC / str(os.getpid()) / "task").glob("*/children"):
            try:
                out += [int(p) for p in task.read_text().split()]
            except (OSError, ValueError):
                continue
        return out
    psutil = _psutil()
    try:
        return [p.pid for p in psutil.Process().children()] if psutil is not None else []
    except psutil.Error:
        return []


def reap() -> list[int]:
    """Collect this process's zombie children that no object here holds as its ``pid`` (the
    orphans :func:`adopt` brought in, once they end); the pids collected."""
    zombies = {}
    for pid in children():
        try:
            _, born, state = _stat(pid)
        except OSError:
            continue
        if state == "Z" and (pid, born) not in _HELD:
            zombies[pid] = born
    if not zombies:
        return []
    for obj in gc.get_objects():          # Popen objects, multiprocessing's, a pty's: their owners wait
        try:                              # no attribute hook of the object's own runs
            held = object.__getattribute__(obj, "__dict__")
        except Exception:                 # noqa: BLE001 - no __dict__
            continue
        pid = held.get("pid") if isinstance(held, dict) else None
        if isinstance(pid, int) and pid in zombies:
            _HELD.add((pid, zombies.pop(pid)))
    out = []
    for pid in zombies:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                out.append(pid)
        except ChildProcessError:
            continue
    return out


try:
    _mark()                   # programs started from here on carry this process's token
except OSError:
    pass
