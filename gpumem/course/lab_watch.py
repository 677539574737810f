"""The fresh grading process's own watch (:mod:`.lab_fresh`): what the learner's code may not ask for
there, whichever lab grades it and whenever it runs (while a definition is rebuilt, while graded, or
in a value the grader formats afterwards).

Review r17 passed labs from the blank notebook with code that ran in the grading process: it read
the report's token from ``/proc/self/mem`` or the grader's frames (``traceback.walk_stack``), wrote
a report of its own and ended the process; it asked a helper outside for the answers through a file
or a socket. :func:`install` adds an audit hook, before any learner code runs, that refuses these
events when the code that asked for them is the learner's:

* reading process memory or descriptors (``/proc/<pid>/mem``, ``map_files``, ``fd``, ``environ``);
* opening any file but a few system paths (``/dev/null``, ``/proc/self/stat`` ...), installed ones
  included (review r18: a helper wrote its answers under ``/dev/shm`` and in site-packages); an import
  the learner's call sets off reads its module's files, and is let through;
* a network socket, ``ctypes``, another process, another audit hook, ``os.putenv``;
* stack frames and the collector's object lists (``sys._getframe``, ``gc.get_objects`` ...).

*Who asked* is the innermost frame that is gpumem's genuine code or a learner's definition (compiled
under its cell's name, ``<lab.ipynb cell N>``; carried code cannot compile code of its own, lab_reach
refuses ``exec`` and ``compile``): gpumem asking (the grader, a guard, the course's function a learner
calls) is let through, a learner's definition is refused; installed libraries' frames, and code they
generate, are looked through. Each refusal raises
``RuntimeError`` there and is kept in the hook's own list, so a learner who catches it is still seen:
the process then reports one error row and nothing else (:func:`refused`).
"""

import os
import re
import sys
import threading

from . import genuine

OWN = genuine._OWN
_CELL = re.compile(r"<.+\.ipynb cell \d+>$")
_MEMORY = re.compile(r"^/proc/(self|thread-self|\d+)/(task/\d+/)?(mem|map_files|fd|fdinfo|environ|pagemap)")
_SYSTEM = ("/dev/null", "/dev/urandom", "/sys/", "/etc/", "/proc/self/stat", "/proc/meminfo",
           "/proc/cpuinfo", "/proc/stat", "/proc/self/cgroup", "/proc/self/mountinfo", "/proc/self/status")
_EVENTS = ("socket.", "ctypes.", "subprocess.Popen", "os.system", "os.exec", "os.fork", "os.posix_spawn",
           "os.spawn", "sys.addaudithook", "os.putenv", "os.unsetenv", "sys._getframe", "sys._current_frames",
           "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile")
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
# the standard library's modules that read their caller's frame for a name only (lab_audit's list)
_BENIGN = ("collections/__init__.py", "typing.py", "enum.py", "dataclasses.py", "abc.py", "functools.py",
           "logging/__init__.py", "warnings.py")
_HOOK: list = []


def _asker(frame, seen: dict) -> str:
    """'course', 'learner' or 'nobody': the innermost frame that is not an installed library's."""
    while frame is not None:
        code = frame.f_code
        found = seen.get(id(code))
        if found is None or found[0] is not code:
            name = code.co_filename
            if name.startswith(OWN) and genuine.genuine(code):
                kind = "course"
            elif _CELL.match(name):        # the learner's definitions, as lab_fresh names their cells
                kind = "learner"
            elif name.startswith("<frozen importlib"):     # an import a learner's call set off: the
                kind = "course"                            # interpreter reads a library's files
            else:                          # an installed library, or code one generates (torch's templates)
                kind = ""
            found = seen[id(code)] = (code, kind)
        if found[1]:
            return found[1]
        frame = frame.f_back
    return "nobody"


def _what(event: str, args) -> str | None:
    """The event's words when it is one the watch reads, else None."""
    if event == "open":
        path = args[0] if args else None
        if not isinstance(path, (str, bytes)):
            return None
        path = os.fsdecode(path)
        if _MEMORY.match(path):
            return f"it read {path}, this process's memory or descriptors"
        if path.startswith(_SYSTEM):
            return None
        return f"it opened {path}: graded code reads no file (a file can carry a helper's answers)"
    if event == "object.__getattr__":
        return f"it read a frame (.{args[1]})" if len(args) > 1 and args[1] in _FRAME_ATTRS else None
    if event.startswith(_EVENTS):
        return f"it asked for {event}, which graded code does not need"
    return None


def _through(frame) -> str:
    """Where in a library the request came from, when a library call of the learner's made it
    (review r22 of lab 04: ``torch.vmap`` asked for a frame while registering its decompositions,
    and the row blamed the learner alone): the library's outermost file below the learner's line."""
    paths = []
    while frame is not None and not _CELL.match(frame.f_code.co_filename):
        paths.append(frame.f_code.co_filename.replace(os.sep, "/").rpartition("site-packages/")[2])
        frame = frame.f_back
    if not paths:
        return ""
    if any("torch/_functorch/" in p or p.startswith("torch/func/") for p in paths):
        return (" (inside torch.vmap or torch.func, which register operators on first use, as graded "
                "code may not: loop or broadcast instead)")
    return f" (inside {paths[-1]}, a library your code called)"


def install() -> list:
    """Add the hook (once); returns its list of refusals."""
    if _HOOK:
        return _HOOK[0]
    hits: list = []
    busy, getframe, seen = threading.local(), sys._getframe, {}

    def hook(event, args):
        if getattr(busy, "on", False):
            return
        what = _what(event, args)
        if what is None or (event == "sys.setprofile" and getattr(sys.getprofile(), "graders_refusals", None)):
            return      # a grader's watch that refused is being unset by the interpreter (review r23)
        busy.on = True
        try:
            caller = getframe(1)
            if event == "sys._getframe" and caller.f_code.co_filename.endswith(_BENIGN) \
                    and genuine.genuine(caller.f_code):
                return
            asker = _asker(caller, seen)
        finally:
            busy.on = False
        if asker == "learner":
            what += _through(caller)
            hits.append(what)
            raise RuntimeError(f"refused in the grading process: {what}")
    sys.addaudithook(hook)
    _HOOK.append(hits)
    return hits


def refused() -> str | None:
    """The first refusal, or None."""
    return _HOOK[0][0] if _HOOK and _HOOK[0] else None
