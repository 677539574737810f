"""Is this code object the code its file defines? The graders' test for "the course's own code".

A file name proves nothing: ``compile(source, "/…/gpumem/memory/finetune.py", "exec")`` gives code
that claims to be gpumem's (review r8 of lab 08: code compiled under a gpumem file name was
trusted by the labs' audit hook, and read the grader's frames). :func:`genuine` compiles the file
the code names, afresh, and looks for a code object with the same qualified name, bytecode, names
and constants; the file must be gpumem's or the installed Python's (:func:`trusted`), so a
learner's own module is not (a file a learner adds inside gpumem/ would be). Used by
:mod:`.grader_seal` (is every function of the grading machinery still the file's?) and
:mod:`.lab_audit` (may this caller read frames?).
"""

import os
import site
import sys
import types
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=512)
def _compiled(path: str, mtime: float) -> dict[str, tuple[types.CodeType, ...]]:
    """Qualified name -> every code object of that name the file defines (compiled afresh: a
    name defined twice, e.g. in both branches of an ``if``, keeps both)."""
    codes: dict[str, list[types.CodeType]] = {}

    def walk(code: types.CodeType) -> None:
        codes.setdefault(code.co_qualname, []).append(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)
    try:
        walk(compile(Path(path).read_text(), path, "exec"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return {}
    return {name: tuple(found) for name, found in codes.items()}


def file_codes(path: str) -> dict[str, tuple[types.CodeType, ...]]:
    """The code objects ``path`` defines, by qualified name (empty if it is not a readable file)."""
    try:
        mtime = Path(path).stat().st_mtime
    except OSError:
        return {}
    return _compiled(path, mtime)


def same(a: types.CodeType, b: types.CodeType) -> bool:
    """Same bytecode, names and constants (nested functions compared the same way)."""
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars) != (b.co_code, b.co_names, b.co_varnames, b.co_freevars):
        return False
    ca, cb = a.co_consts, b.co_consts
    return len(ca) == len(cb) and all(
        same(x, y) if isinstance(x, types.CodeType) and isinstance(y, types.CodeType) else
        (type(x) is type(y) and x == y) for x, y in zip(ca, cb))


_OWN = str(Path(__file__).resolve().parents[1]) + os.sep                    # gpumem's own files
def _installed_roots() -> tuple[str, ...]:
    """The installed Python's prefixes and every site-packages folder, the user's own too
    (``pip install --user``, as on a shared workshop machine)."""
    roots = [sys.prefix, sys.base_prefix, sys.exec_prefix]
    try:
        roots += [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:                               # a virtualenv's old site.py lacks them
        pass
    return tuple({str(Path(p).resolve()) + os.sep for p in roots})


_INSTALLED = _installed_roots()


@lru_cache(maxsize=4096)
def trusted(path: str) -> bool:
    """A file of gpumem's or of the installed Python (standard library, site-packages); a file a
    learner wrote elsewhere (a notebook's folder, /tmp) is not, even if it defines the code."""
    try:
        real = str(Path(path).resolve())
    except (OSError, RuntimeError, ValueError):
        return False
    return real.startswith(_OWN) or real.startswith(_INSTALLED)


def genuine(code: types.CodeType) -> bool:
    """True when ``code`` is code its own file (``co_filename``, gpumem's or the installed
    Python's) defines, as that file reads now."""
    return trusted(code.co_filename) and \
        any(same(code, other) for other in file_codes(code.co_filename).get(code.co_qualname, ()))


def wrappers_genuine(obj) -> bool:
    """Every layer of a (decorated) callable that has Python code runs its file's own code:
    ``functools.wraps`` around a learner's function does not hide it (``inspect.unwrap`` would)."""
    seen = 0
    while obj is not None and seen < 16:
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType) and not genuine(code):
            return False
        obj, seen = getattr(obj, "__wrapped__", None), seen + 1
    return True
