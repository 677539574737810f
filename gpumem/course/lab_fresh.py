"""Grade a lab in a fresh Python process in which no learner cell has run (every review's fix).

A check inside the learner's kernel shares it with every cell the learner ran: a cell can patch the
grader, start a thread that rewrites its answers, or leave a finalizer that swaps a module while it
grades (reviews r8-r15). The seal (:mod:`.grader_seal`) and the scan (:mod:`.lab_history`) refuse
the routes found so far; this module removes the ground they stand on. In a kernel,
``gpumem.chapters.check_lab`` calls :func:`grade_apart`, which

1. carries the learner's functions and classes to a new interpreter as *source text*
   (:mod:`.lab_carry`: ``def`` statements cut out of their cells, the modules and plain values they
   read), never as live objects, after :mod:`.lab_vet` has read that text (review r16: nothing may run
   while a definition is made, and graded code may not patch a library), the kernel-wide scan's rules
   (:mod:`.lab_history`) have read it too (what is carried only: the learner's other cells never run
   where the check grades, so they are the learner's), and no thread or process a cell started still
   runs (it could rewrite what comes back, or answer for the learner);
2. starts ``python -I -S`` (no ``PYTHON*`` variables, no user site, no site-packages ``.pth`` file,
   not the notebook's folder: the installed folders are handed over) with the environment the kernel
   was started with (Linux: ``/proc/self/environ``; a cell that sets a variable changes nothing there),
   imports a clean gpumem, runs only those definitions and grades them with the lab's own check, its
   guards included;
3. relays what that process prints (the summary, progress) as it comes, and takes its rows from a
   pipe only it holds: one message with this check's token, written with primitives taken before any
   learner code ran there, after which the process ends at once (``os._exit``: no exit handler or
   finalizer of the learner's runs after it). Ctrl-C stops it.

What a carried function does while graded is watched there as before (audit hook, seal, origin
rule), and after grading every library is compared with what it was before the definitions were
rebuilt (:mod:`.lab_intact`: a change, however made, voids the grade); what a cell did to the
kernel before the check no longer reaches the grade. A name the process could not carry (a tensor,
a model) is named before grading and in the row whose function needed it.

Known gap: the fresh process reads gpumem from disk, so a cell that rewrites gpumem's own files
changes the grader there too (as it would for anyone who runs that checkout); instructors grade from
a clean checkout.
"""

import importlib
import json
import linecache
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path

from . import genuine, lab_intact, lab_origin, lab_relay, lab_watch  # noqa: F401 -- lab_origin: imported before any learner code runs
from .grading import Report, Row, freeze
from .lab_bare import CARRIED, bare, masked
from .lab_carry import carry
from .lab_kernel import notes, refusal

_ROOT = str(Path(__file__).resolve().parents[2])       # the folder that holds gpumem
# -I: no PYTHON* variables, no user site, not the notebook's folder; -S: no site-packages .pth files
# (a line a cell wrote there would run first). The installed folders and sys.prefix come in argv[1]
# instead (without site a virtual environment's prefix is not set; gpumem.course.genuine reads it).
_BOOT = ("import sys, json; a = json.loads(sys.argv[1]); sys.prefix, sys.exec_prefix = a['prefix']; "
         "sys.path[:0] = a['path']; "
         "from gpumem.course.lab_fresh import main; sys.exit(main(int(sys.argv[2]), sys.argv[3]))")
_DROP = ("GPUMEM_TEST_CELLS",)             # read without a kernel: the fresh process has none
APART = "GPUMEM_GRADING_APART"             # set in the fresh process (lab_origin reads it at import)
CELL = "<{lab}.ipynb cell {n}>"            # lab_origin's shape of a cell's name without a kernel
_ENDED = "the grading process ended"
# What the fresh process writes its report with, taken before any learner code runs there.
_WRITE, _EXIT, _ESC, _STR = os.write, os._exit, json.encoder.encode_basestring_ascii, str


def _environment() -> dict[str, str]:
    """The variables this process started with (a cell's ``os.environ[...] = ...`` is not in them)."""
    try:
        raw = Path(f"/proc/{os.getpid()}/environ").read_bytes()
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
    except OSError:                        # not Linux: this process's variables as they are now
        env = dict(os.environ)
    return {**{k: v for k, v in env.items() if k not in _DROP}, APART: "1"}


def _python() -> str:
    """The interpreter this process was started as (Linux: ``/proc/self/cmdline``, which no cell can
    rewrite, as long as it is the very binary running; a cell's ``sys.executable = ...`` is not used)."""
    try:
        first = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
        exe = os.path.realpath(f"/proc/{os.getpid()}/exe")
        if os.path.isabs(first) and os.path.realpath(first) == exe:
            return first
        if os.path.realpath(_STARTED_AS) == exe:
            return _STARTED_AS
    except (OSError, UnicodeDecodeError):
        pass
    return _STARTED_AS


_STARTED_AS = sys.executable


def _cell_numbers() -> dict[str, int]:
    """Each cell file name -> the number IPython gave the cell (In [n])."""
    from .lab_origin import shell
    sh = shell()
    names = getattr(getattr(sh, "compile", None), "_filename_map", None) or {}
    return {k: v for k, v in names.items() if isinstance(v, int)}


def payload(lab: str, ns: dict, show: bool, carried=None) -> dict:
    """What the fresh process gets on its standard input (``carried``: already carried, e.g. from a
    notebook file by :mod:`.lab_file`; else carried from ``ns``)."""
    carried = carry(ns) if carried is None else carried
    numbers, names, n = _cell_numbers(), {}, 0
    for filename in carried.cells():
        named = re.search(r" cell (\d+)>$", filename)            # the course's tests' cells, history's
        number = numbers.get(filename, int(named.group(1)) if named else None)
        n = max(n + 1, number or 0)
        name = CELL.format(lab=lab, n=n if number is None else number)
        while name in names.values():                           # two files, one number: keep both
            n += 1
            name = CELL.format(lab=lab, n=n)
        names[filename] = name
    cells = {names[f]: text for f, text in carried.cells().items()}
    defs = [(name, names[f], source, own) for name, (f, source, own) in carried.defs.items()]
    return {"lab": lab, "show": bool(show), "values": list(carried.values.items()), "cells": cells,
            "defs": defs, "after": list(carried.after.items()), "left": carried.left,
            "token": secrets.token_hex(16)}


def grade_apart(lab: str, ns: dict, show: bool = True, entry: str = "gpumem.chapters:check_lab",
                options: dict | None = None, carried=None) -> Report:
    """Grade ``lab`` in a fresh process from the source of ``ns``'s definitions (module docstring);
    ``entry`` (``module:function``) grades there, called as ``entry(lab, ns, show=, apart=False,
    **options)`` (``options``: plain values, ``seed=0``)."""
    sent = payload(lab, ns, show, carried)
    sent["options"] = dict(options or {})
    if why := refusal(sent, ns):
        report = Report(lab, [Row("check", "what is carried to the grading process", "error", f"not graded: {why}")])
        if show:
            print(report.summary(), flush=True)
        return report
    if show:
        print(f"graded in a fresh Python process: {len(sent['defs'])} definitions of your cells, as text, "
              f"and {len(sent['values'])} modules and values they read", *notes(sent), sep="\n", flush=True)
    paths = [_ROOT] + [p for p in sys.path if p and os.path.isdir(p) and genuine.trusted(p)]
    where = {"prefix": [sys.prefix, sys.exec_prefix], "path": paths}
    read, write = os.pipe()
    try:
        argv = [_python(), "-I", "-S", "-c", _BOOT, json.encoder.JSONEncoder().encode(where), str(write), entry]
        proc = subprocess.Popen(argv,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=_environment(), start_new_session=True, pass_fds=(write,))
    finally:
        os.close(write)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(_read_all(read)), daemon=True)
    reader.start()
    try:
        proc.stdin.write(json.encoder.JSONEncoder().encode(sent).encode())
        proc.stdin.close()
        held = lab_relay.relay(proc, lab)
        code = proc.wait()
        reader.join()
    except BaseException:
        _stop(proc)
        raise
    finally:
        os.close(read)
    report = _report(lab, sent, got[0] if got else b"", code)
    void = len(report.rows) == 1 and report.rows[0].detail.startswith("not graded") and lab_relay.VOID in held
    sys.stdout.write(held.split(lab_relay.VOID, 1)[1] if void else held.replace(lab_relay.VOID, "\n"))
    sys.stdout.flush()
    if show and report.rows[0].detail.startswith(_ENDED):
        # the process may have printed a summary before it failed (review r19: "all correct" last, then
        # nothing): the verdict that counts is this one
        print(f"\nNOT GRADED: {report.rows[0].detail}", flush=True)
    return report


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _stop(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _report(lab: str, sent: dict, raw: bytes, code: int) -> Report:
    """The rows the fresh process handed back: one message, with this check's token, from a process
    that ended normally; anything else grades nothing."""
    try:
        got = json.decoder.JSONDecoder().decode(raw.decode())     # not json.loads: review r18 rebound its decoder
        assert code == 0 and isinstance(got, dict) and got["token"] == sent["token"]
        rows = [Row(*(str(x) for x in r)) for r in got["rows"]]
        assert all(len(r) == 4 for r in got["rows"])
        stopped = {str(k): str(v) for k, v in got["stopped"].items()}
    except (ValueError, KeyError, TypeError, AssertionError, AttributeError, UnicodeDecodeError):
        why = f"{_ENDED} (exit status {code}) without one report of its own"
        return Report(lab, [Row("check", "the grading process", "error", why)])
    for row in rows:
        for name, what in sent["left"].items():
            if f"name '{name}' is not defined" in row.detail:
                row.detail += (f" (the check grades your functions in a fresh process; `{name}`, {what}, "
                               "cannot be carried there: make it inside the function that uses it)")
    return Report(lab, rows, stopped)


def rebuild(sent: dict) -> dict:
    """A fresh namespace holding the carried definitions, each cell's carried lines kept in
    :data:`.lab_bare.CARRIED` and as many empty lines in ``linecache`` under its cell's name (line
    numbers read as in the notebook; the text is the grader's alone, review r37), with
    docstrings and comments emptied (:func:`.lab_bare.bare`: a table of answers kept there was read
    back by ``inspect.getdoc``, review r34 of lab 06). A definition kept under a second name
    (``first_try``) does not replace the one of its own name."""
    ns: dict = {"__name__": "__main__"}
    for name, cell in sent["cells"].items():
        cell = CARRIED[name] = bare(cell)
        linecache.cache[name] = (len(cell), None, masked(cell), name)     # review r37: no text readable
    for name, line in sent["values"]:
        _run(name, bare(line), "<carried values>", ns)
    missing = object()
    for name, cell, source, own in sent["defs"]:
        before = ns.get(own, missing)
        _run(name, bare(source), cell, ns)
        if own != name and own in ns:
            ns[name] = ns[own]
            if before is missing:
                del ns[own]
            else:
                ns[own] = before
    for name, line in sent["after"]:
        _run(name, line, "<carried names>", ns)
    return ns


def quiet() -> None:
    """bitsandbytes' CPU backend logs a warning when it cannot fetch an optional kernel from the Hub
    (lab 08's carried import; r20: "Failed to load CPU gemm_4bit_forward"): nothing is fetched here."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def main(fd: int, entry: str) -> int:
    """The fresh process: rebuild the learner's definitions from source, grade them, hand the rows
    back on ``fd`` with the primitives taken at import, and end at once (no exit handler, finalizer or
    thread of the learner's runs after the report)."""
    sent = json.loads(sys.stdin.read())
    quiet()
    module, _, function = entry.partition(":")
    check = getattr(importlib.import_module(module), function)      # the grader, before any learner code
    load = getattr(importlib.import_module(module), "load_lab", None)
    if load is not None:
        load(sent["lab"])                  # its guards and tables too, so that lab_intact records them
    # the repository's root came in only to import gpumem (whose submodules load by its __path__):
    # off sys.path now, so that graded code cannot import the repository's tests/ (review r19 of lab 06
    # imported tests/test_lab06_limits_truth, the answer key) or any other file there
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(_ROOT)]
    hits = lab_watch.install()
    freeze()                               # Report and Row take no new attributes from here on
    taken = lab_intact.take()
    lab_intact.keep(taken)
    ns = rebuild(sent)
    report = check(sent["lab"], ns, show=sent["show"], apart=False, **sent.get("options", {}))
    why = hits[0] if hits else lab_intact.changed(taken)
    if why:                                # refused or changed somewhere, caught or not: nothing else counts
        if not hits:
            why = f"graded code changed a library ({why}): libraries stay as the grader found them"
        report = Report(sent["lab"], [Row("check", "the grading process", "error", f"not graded: {why}")])
        # review r22 of lab 05: the check's own summary ("all correct") may be printed above this
        above = [lab_relay.VOID] if sent["show"] else []
        print(*above, report.summary(), sep="\n", flush=True)
    rows = ",".join("[" + ",".join(_ESC(_STR(x)) for x in (r.function, r.case, r.status, r.detail)) + "]"
                    for r in report.rows)
    stopped = ",".join(f"{_ESC(_STR(k))}:{_ESC(_STR(v))}" for k, v in dict(report.stopped).items())
    text = f'{{"token":{_ESC(sent["token"])},"rows":[{rows}],"stopped":{{{stopped}}}}}'.encode()
    try:
        sys.__stdout__.flush()
    except Exception:                      # noqa: BLE001 -- the report matters, not the last output
        pass
    while text:
        text = text[_WRITE(fd, text):]
    _EXIT(0)


def _run(name: str, source: str, filename: str, ns: dict) -> None:
    try:
        exec(compile(source, filename, "exec"), ns)
    except Exception as err:        # noqa: BLE001 -- named, and the check grades the rest
        print(f"note: `{name}` could not be rebuilt in the grading process: {type(err).__name__}: {err}",
              flush=True)
