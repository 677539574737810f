"""Lab 01: no copy of the course's code runs inside a learner's function.

:mod:`.labguard` switches the course's functions off while a learner's function runs, and refuses
copies registered in ``sys.modules`` or loaded from gpumem's files during the call. A copy made
*before* the check, ``exec(inspect.getsource(gpumem.memory.activations), lib)`` in a notebook
cell, is neither (review r4 of lab 01, cheap pass 3). Its functions still have the course's
bytecode, though: while the learner's function runs, a profile hook compares each Python frame's
code with the fingerprints of every function in the guarded modules' files, taken as chapter 03's
``labprints`` takes them: (name, bytecode, names used) for functions of at least
:data:`SHORT` bytes, and (bytecode, names used) alone from :data:`LONG` bytes, so a rename does
not hide a long function. Bytecode changes with any inserted statement, though (review r6: a
``_zz = 0`` put at the top of every function of an AST copy of ``gpumem.memory.activations``
passed), so a long function is also known by what it *uses*: the global and attribute names it
reads and the strings it holds, less its docstring (:func:`uses`). A frame whose code uses all of
that, whatever else it adds or in whatever order, is a copy; only functions with at least
:data:`DISTINCT` such names and strings are matched this way, so a learner's own formula (a few
names) is not mistaken for one. A match fails the call, even if the learner catches the exception.
Turning the hook off (``sys.setprofile``, ``sys.settrace``) is refused through an audit hook
while the call runs, and so is starting a thread (the hook watches one thread; a reference to
``_thread.start_new_thread`` bound before the check is not seen). A copy rewritten by hand (other
names and strings throughout) is not seen here. Review r8 renamed every name and added one
statement per function, which defeats both matches above; the shared content match
(:class:`gpumem.course.copy_watch.Prints` over ``gpumem.memory.activations`` and
``activation_parts``, :func:`shared`) names such a copy, and the hook asks it too. OLMo 2's
full-width q/k norms (part 2's first case) do not stop a copy by themselves: one added line fixes them.
"""

import _thread
import contextlib
import functools
import importlib
import inspect
import os
import sys
import threading
import types

SHORT = 24                 # bytes of bytecode: shorter functions are too common to match
LONG = 64                  # from this length a function is matched without its name
DISTINCT = 10              # names and strings a long function needs to be matched by what it uses
SAYS = "(the course's code, or a copy of it) ran inside your function: derive it yourself"
_WATCHING = [False]        # read by the audit hook
_REFUSED = ("sys.setprofile", "sys.settrace")
_THREADS = ((_thread, "start_new_thread"), (threading, "_start_new_thread"))   # the hook is per thread


def _walk(code: types.CodeType):
    """``code`` and the code objects nested in it, functions only."""
    if code.co_flags & inspect.CO_OPTIMIZED:
        yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk(const)


def uses(code: types.CodeType) -> frozenset:
    """The global and attribute names ``code`` reads and the strings it holds (its first constant,
    the docstring or None in CPython 3.11, left out): unchanged by inserted or reordered
    statements and by renamed locals."""
    return frozenset(code.co_names) | frozenset(("str", c) for c in code.co_consts[1:] if isinstance(c, str))


@functools.lru_cache(maxsize=None)
def prints(names: tuple[str, ...]) -> tuple[dict, dict, list, dict]:
    """(named, unnamed, by use, verdicts) fingerprints of every function in the files of the
    modules ``names``; ``verdicts`` caches :func:`match`'s answer for each code object seen."""
    named, unnamed, used = {}, {}, []
    for name in names:
        try:
            path = importlib.import_module(name).__file__
            with open(path, encoding="utf-8") as f:
                top = compile(f.read(), path, "exec")
        except (ImportError, OSError):
            continue
        for code in _walk(top):
            if not code.co_name.startswith("<") and len(code.co_code) >= SHORT:
                shown = f"{name.replace('gpumem.chapters.', '').replace('gpumem.', '')}.{code.co_qualname}"
                named[(code.co_name, code.co_code, code.co_names)] = shown
                if len(code.co_code) >= LONG:
                    unnamed[(code.co_code, code.co_names)] = shown
                    if len(mine := uses(code)) >= DISTINCT:
                        used.append((mine, shown))
    return named, unnamed, used, {}


def match(code: types.CodeType, found: tuple) -> str | None:
    """The course function whose code ``code`` repeats, or whose names and strings it all uses,
    or None."""
    named, unnamed, used, verdicts = found
    if hit := named.get((code.co_name, code.co_code, code.co_names)) or unnamed.get((code.co_code, code.co_names)):
        return hit
    if code not in verdicts:
        mine = uses(code)
        verdicts[code] = next((shown for theirs, shown in used if theirs <= mine), None)
    return verdicts[code]


def _audit(event, args):
    if _WATCHING[0] and event in _REFUSED:
        raise RuntimeError(f"{event} is switched off while your function is graded")


sys.addaudithook(_audit)


class _Either:
    """Several :class:`gpumem.course.copy_watch.Prints` asked in turn (the first that names a copy)."""

    def __init__(self, *prints):
        self.prints = prints

    def match(self, code, values=None, bound=None) -> str:
        return next((hit for p in self.prints if (hit := p.match(code, values, bound))), "")

    def copied(self, frame) -> str:
        return next((hit for p in self.prints if (hit := p.copied(frame))), "")


@functools.lru_cache(maxsize=None)
def shared():
    """The shared content fingerprints (:mod:`gpumem.course.copy_watch`) of the library's
    activation counts and of the grader's chain count (``labtruth._chain_bytes``: review r11 ran a
    copy of it with its table ``_KEEPS`` renamed, which the match on names used above misses),
    built once."""
    from gpumem.course import copy_watch
    from gpumem.memory import activation_parts, activations
    truth = types.SimpleNamespace(__file__=os.path.join(os.path.dirname(__file__), "labtruth.py"))   # its file only:
    return _Either(copy_watch.Prints([(activations, "gpumem.memory.activations"),         # labtruth imports this
                                      (activation_parts, "gpumem.memory.activation_parts")]),
                   copy_watch.Prints([(truth, f"{__package__}.labtruth")], only=("_chain_bytes",)))


@contextlib.contextmanager
def no_copies(found: tuple, content=None, hits: list | None = None):
    """Run the block with the profile hook on; a copy that ran (caught or not) fails it
    (``content``: a :class:`gpumem.course.copy_watch.Prints` asked as well; ``hits``: the list
    the copies found are appended to, for a caller whose inner guard raises first)."""
    hits = [] if hits is None else hits
    before = sys.getprofile()

    def hook(frame, event, arg):
        if event == "call" and (said := match(frame.f_code, found) or (content and content.copied(frame))):
            hits.append(said)
            _WATCHING[0] = False           # raising here unsets the hook: not the learner's doing
            hook.graders_refusals = hits   # (nor, for lab_watch, the learner's request; review r23)
            raise RuntimeError(f"{said} {SAYS}")
    def no_thread(*args, **kwargs):
        raise RuntimeError("starting a thread is switched off while your function is graded")
    threads = [(owner, attr, getattr(owner, attr)) for owner, attr in _THREADS]
    for owner, attr, _ in threads:
        setattr(owner, attr, no_thread)
    sys.setprofile(hook)
    _WATCHING[0] = True
    try:
        yield
    finally:
        _WATCHING[0] = False
        on = sys.getprofile() is hook
        sys.setprofile(before)
        for owner, attr, original in threads:
            setattr(owner, attr, original)
    if hits:
        raise RuntimeError(f"{hits[0]} {SAYS}")
    if not on:
        raise RuntimeError("the copy watch was switched off inside your function: derive it yourself")
