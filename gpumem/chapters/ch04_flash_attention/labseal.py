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

Beside these, :func:`intact` (checked at every op the watch sees, from a closure of its
``__torch_dispatch__``) names a grader module's or class's attribute patched during the call.

Not covered: code that digs the closure's cells out of a function (``w.flag.__closure__``) or
mutates the sets the watch fills during the call, once it has the watch through a reference to a
stack getter saved before the check; that is beyond an in-kernel guard (instructors grade from a
fresh kernel).
"""

_SEALED: set[int] = set()          # ids of the watches entered now
TAMPERED = "it rebound the grader's watch ({}): leave the watch alone, its verdict is not yours to set"


def tally():
    """``(flag, count, read)`` over one closure: ``flag(message)`` keeps the first message,
    ``count(key, n)`` adds ``n >= 0`` to ``"exps"`` or ``"reads"`` and returns the total,
    ``read(key)`` returns ``"broken"`` (the first message, '' if none) or a count."""
    state = {"broken": "", "exps": 0, "reads": 0}

    def flag(message: str) -> None:
        state["broken"] = state["broken"] or str(message)

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


def seal(obj, on: bool) -> None:
    """Seal ``obj`` (a :class:`Sealed`) or unseal it."""
    (_SEALED.add if on else _SEALED.discard)(id(obj))


def kept(*objs) -> list:
    """Each object (None aside) with a copy of its attributes now (``vars``)."""
    return [(obj, dict(vars(obj))) for obj in objs if obj is not None]


def intact(*owners):
    """A function that returns '' or the first attribute of ``owners`` (the grader's modules and
    classes) that is no longer the object it was now, or (classes) was added: a grader patched
    during the learner's call and restored before it returns is seen at the next op."""
    kept = [(owner, dict(vars(owner)), isinstance(owner, type)) for owner in owners]

    def changed() -> str:
        for owner, attrs, cls in kept:
            now = vars(owner)
            names = [k for k, v in attrs.items() if now.get(k, attrs) is not v]
            names += [k for k in now if k not in attrs] if cls else []
            if names:
                return f"{owner.__name__.rsplit('.', 1)[-1]}.{names[0]}"
        return ""
    return changed


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


def seal_dispatch(cls, owners):
    """``cls.__torch_dispatch__``: at every op, first the grader's integrity (:func:`intact`
    of ``owners``, snapshot taken once this is set), then ``cls._dispatch`` as it was now."""
    dispatch, check = cls._dispatch, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        patched = check()
        if patched:
            self.flag(f"it patched the grader ({patched}) while lab 04 was graded: leave the grader alone")
        return dispatch(self, func, types, args, kwargs)
    cls.__torch_dispatch__ = __torch_dispatch__
    check = intact(*owners)
    return __torch_dispatch__
