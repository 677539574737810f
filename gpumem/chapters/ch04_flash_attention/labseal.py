"""Lab 04's seal on the grader's op watch, so that a learner's call that reaches the watch cannot
blind it (review r10 of lab 04: ``_get_current_dispatch_mode()`` returned the watch, and rebinding
its ``flag``, ``foreign``, ``exp2`` and ``exps`` passed a full-row backward on 10 of 10 rows).

Three layers, beside :mod:`.labfence` (which refuses the mode-stack getters during the call) and
:func:`gpumem.course.lab_audit.refusing` (which refuses frames and the collector's objects):

* :func:`tally`: the verdict (the first rule broken) and the counts (exponentials, numbers read
  out) live in a closure; the watch holds only the functions that write and read them, and the
  counts only grow;
* :class:`Sealed`: while the watch is entered, setting or deleting any of its attributes calls
  its ``flag`` with what was touched, then raises (an ``except`` cannot hide the attempt);
* :func:`kept` and :func:`rebound`: the grader notes every attribute of the watch (and of the
  objects it names) before the learner's call and names, after it, any that was rebound, added
  or deleted by a route that skips ``__setattr__`` (``object.__setattr__``, ``vars(w)[...]``).

Beside these, :func:`intact` (checked at every op the watch sees) names a grader module's or class's
attribute patched during the call, and the watch's closure cells (``_cells``) are checked there too.
The watch's ``__torch_dispatch__``, :func:`intact`'s check and :mod:`.labfence`'s stand-ins have
no closure (review r13 #2: the ``dispatch`` cell swapped for a pass-through during the call and
restored passed 25/25): :func:`bake` puts their references in their code's constants, and
:func:`seal`'s audit hook refuses reading the ``__code__`` of this module's or labfence's functions
during the call (the real mode getters are in there). A ``__torch_dispatch__`` swapped on the
class is named by the function mode (:class:`.labguard._Functions`).

Not covered: code run before the check that digs the hook's list out of ``seal.__code__`` (or
lab_audit's), or that swaps the function mode's class attribute and the watch's together with no
torch op between. An in-kernel guard cannot close these: the durable fix is to grade the learner's
*function source* in a separate process in which no learner cell has run (a fresh kernel still
runs the learner's cells, cheat included).
"""

import sys
import threading

from .labbake import bake

_SEALED: set[int] = set()          # ids of the watches entered now
TAMPERED = "it rebound the grader's watch ({}): leave the watch alone, its verdict is not yours to set"


def tally():
    """``(flag, count, read)`` over one closure: ``flag(message)`` keeps the first message (the
    verdict; ``flag(op, "raised")`` keeps the first op that raised, apart), ``count(key, n)`` adds
    ``n >= 0`` to ``"exps"``, ``"reads"`` or ``"qk"`` and returns the total, ``read(key)`` returns
    ``"broken"`` (the first message, '' if none), ``"raised"`` or a count."""
    state = {"broken": "", "raised": "", "exps": 0, "reads": 0, "qk": 0}

    def flag(message: str, key: str = "broken") -> None:
        key = "raised" if key == "raised" else "broken"
        state[key] = state[key] or str(message)

    def count(key: str, n) -> int:
        state[key] += max(0, int(n))
        return state[key]

    def read(key: str):
        return state[key]
    return flag, count, read


class Sealed:
    """While :func:`seal` holds (from the watch's ``__enter__`` to its ``__exit__``), setting or
    deleting an attribute flags the watch and raises ``AttributeError``."""

    def _refuse(self, name: str):
        message = TAMPERED.format(f"{type(self).__name__}.{name}")
        object.__getattribute__(self, "flag")(message)
        raise AttributeError(message)

    def __setattr__(self, name, value):
        if id(self) in _SEALED:
            self._refuse(name)
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if id(self) in _SEALED:
            self._refuse(name)
        object.__delattr__(self, name)


def _hook(event, args):
    if event != "object.__getattr__" or args[1] != "__code__":
        return
    active, get_ident, runtime_error, scopes, getattr_ = [
        x.__next__() for x in ("@active", "@get_ident", "@error", "@scopes", "@getattr")]
    scope = getattr_(args[0], "__globals__", None)          # read only, unlike __module__
    if active and (scope is scopes[0] or scope is scopes[1]):
        for thread, flag in active:
            if thread == get_ident():
                message = (f"it read the code of the grader's {getattr_(args[0], '__name__', '?')} while lab 04 "
                           f"was graded (what it calls is baked in there): leave the grader alone")
                flag(message)
                raise runtime_error(message)


def _seal(obj, on: bool) -> None:
    active, get_ident, sealed = [x.__next__() for x in ("@active", "@get_ident", "@sealed")]
    entry = (get_ident(), obj.flag)
    if on:
        sealed.add(id(obj))
        active.append(entry)
    else:
        sealed.discard(id(obj))
        while entry in active:
            active.remove(entry)


def _install():
    """``seal(obj, on)``: seal ``obj`` (a :class:`Sealed`) or unseal it; while sealed, an audit hook
    (installed once, for good) refuses, in its thread, reading the ``__code__`` of this package's
    functions and :mod:`.labfence`'s (by their ``__globals__``, which cannot be rebound): the
    references :func:`bake` put there (the real mode getters, the watch's ``dispatch``) are the
    grader's. The list of sealed watches is baked into both."""
    active = []
    from . import labfence
    sys.addaudithook(bake(_hook, active=active, get_ident=threading.get_ident, error=RuntimeError,
                          scopes=(globals(), vars(labfence)), getattr=getattr))
    return bake(_seal, active=active, get_ident=threading.get_ident, sealed=_SEALED)



def kept(*objs) -> list:
    """Each object (None aside) with a copy of its attributes now (``vars``)."""
    return [(obj, dict(vars(obj))) for obj in objs if obj is not None]


def _changed():
    kept, vars_, missing = [x.__next__() for x in ("@kept", "@vars", "@missing")]
    for owner, attrs, names in kept:
        now = vars_(owner)
        for k, v in attrs:
            if now.get(k, missing) is not v:
                return f"{owner.__name__.rsplit('.', 1)[-1]}.{k}"
        for k in (now if names is not None else ()):
            if k not in names:
                return f"{owner.__name__}.{k}"
    return ""


def intact(*owners, skip=()):
    """A function that returns '' or the first attribute of ``owners`` (the grader's modules and
    classes) that is no longer the object it was now, or (classes) was added: a grader patched
    during the learner's call and restored before it returns is seen at the next op. What it
    compares against is baked into its code (:func:`bake`), in tuples. ``skip``: attribute names
    of classes it leaves to another check (the watch's own ``__torch_dispatch__``)."""
    kept = tuple((owner, tuple((k, v) for k, v in vars(owner).items() if k not in skip),
                  frozenset(vars(owner)) | frozenset(skip) if isinstance(owner, type) else None)
                 for owner in owners)
    return bake(_changed, kept=kept, vars=vars, missing=object())


def cells(*functions) -> tuple:
    """Each closure cell of ``functions`` (None aside) with what it holds now."""
    return tuple((c, c.cell_contents) for f in functions if f is not None for c in (f.__closure__ or ()))


def _swapped(watch):
    held = "@held".__next__()
    for cell, contents in watch._cells:
        if cell.cell_contents is not contents:
            return "a closure cell of the watch"
    for cell, contents in held:
        if cell.cell_contents is not contents:
            return "a closure cell of the grader"
    return ""


def rebound(before: list) -> str:
    """'' or the message naming every attribute of :func:`kept`'s objects that is no longer the
    object it was (rebound, added, deleted)."""
    missing = object()
    names = []
    for obj, attrs in before:
        now = vars(obj)
        names += [f"{type(obj).__name__}.{k}" for k in sorted(set(attrs) | set(now))
                  if now.get(k, missing) is not attrs.get(k, missing)]
    return TAMPERED.format(", ".join(names)) if names else ""


def _torch_dispatch(self, func, types, args=(), kwargs=None):
    check, swapped, dispatch = [x.__next__() for x in ("@check", "@swapped", "@dispatch")]
    return dispatch(self, func, types, args, kwargs, check, swapped)     # it runs both checks first


def seal_dispatch(cls, owners, held=()):
    """``cls.__torch_dispatch__``: at every op, first the grader's integrity (:func:`intact` of
    ``owners``, snapshot taken now, this attribute aside: a swapped ``__torch_dispatch__`` never
    runs, so the function mode checks it, :func:`.labguard._Functions`; the watch's closure cells, ``watch._cells``, and
    the cells of the functions ``held``, as they are now), then ``cls._dispatch`` as it was now:
    both checks are passed to it, which runs them first (with the profile hook off, as the rest of
    the grader's work at an op). No closure: what it calls is baked into its code (:func:`bake`)."""
    swapped, check = bake(_swapped, held=cells(*held)), intact(*owners, skip=("__torch_dispatch__",))
    cls.__torch_dispatch__ = bake(_torch_dispatch, check=check, dispatch=cls._dispatch, swapped=swapped)
    return cls.__torch_dispatch__, check, swapped


_UNSEALED = ("seal",)        # grader_seal: made with code baked in (bake), not the file's
seal = _install()
