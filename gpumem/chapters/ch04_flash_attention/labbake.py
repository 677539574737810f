"""Lab 04's baked functions (:func:`bake`): a function whose references live in its code object's
constants, not in closure cells a caller can rewrite (review r13 of lab 04, #2). Used by
:mod:`.labseal` and :mod:`.labfence` (a module of its own: labseal imports labfence)."""

import itertools
import types


def bake(template, **objects):
    """``template`` with every string constant ``"@name"`` replaced by ``itertools.repeat(objects[name])``
    (read only, hashable as code constants must be: the copy watch looks code up in a dict; the
    template takes each with ``.__next__()``): a function
    with no closure cells, whose references live in its code object's constants (a tuple, read
    only). A closure's cell can be rewritten by any caller (``f.__closure__[0].cell_contents = x``,
    review r13 of lab 04, cheat A: the watch's ``dispatch`` cell swapped for a pass-through during
    the call and restored); a code object cannot, and replacing ``__code__`` is an audit event."""
    def swap(c):
        if isinstance(c, tuple):                    # ``a, b = "@a", "@b"`` is one tuple constant
            return tuple(swap(x) for x in c)
        return itertools.repeat(objects[c[1:]]) if isinstance(c, str) and c[:1] == "@" and c[1:] in objects else c
    code = template.__code__.replace(co_consts=tuple(swap(c) for c in template.__code__.co_consts))
    return types.FunctionType(code, template.__globals__, template.__name__, template.__defaults__)
