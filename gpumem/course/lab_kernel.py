"""The kernel's side of grading in a fresh process (:mod:`.lab_fresh`): what is read before that
process starts, and what the kernel's own report path must still be.

:func:`refusal` reads what is carried (the rules of :mod:`.lab_vet` and the kernel-wide scan's, on
the carried text only), looks for threads and processes a cell left running, and checks the few
standard-library modules the report comes back through (:data:`_STDLIB`: review r17 of labs 01 and
05 swapped ``json.loads`` in the kernel). The kernel is the learner's: what it shows can always be
changed there (``sys.stdout``); ``python -m gpumem grade NOTEBOOK`` (:mod:`.lab_file`) is the grade no
kernel cell can touch (what the definitions do while graded is watched there as everywhere, by the
grading process's own guards: review r18 of lab 05).
"""

import importlib
import os
import sys

from . import genuine
from .lab_vet import problem, value_problem


def refusal(sent: dict, ns: dict) -> str | None:
    """Why nothing is graded: a carried definition breaks a rule (:mod:`.lab_vet`) or reaches into the
    grader (the kernel-wide scan's rules, :mod:`.lab_history`, read on what is carried: only that runs
    where the check grades, so the learner's other cells are theirs), or a thread or process a cell
    started still runs (it could rewrite what comes back, or answer for the learner)."""
    from .lab_history import _reach, gpumem_names
    from .lab_reach import course_import
    program = [line for _, line in sent["values"]] + [line for _, line in sent["after"]]
    bound = frozenset().union(*(gpumem_names(text) for text in program + [d[2] for d in sent["defs"]]))
    for name, line in sent["values"] + sent["after"]:
        if why := value_problem(line):
            return f"`{name}`: {why}"
    for name, cell, source, _ in sent["defs"]:
        if why := problem(source, ns) or _reach(source, ours=bound) or course_import(source):
            return f"`{name}` ({cell}): {why.split('; the lab forbids')[0]}"
    from .lab_audit import foreign_children, foreign_threads, install, orphans, reap
    if threads := foreign_threads():
        return f"a thread your cells started still runs ({threads[0]}): restart the kernel and run your cells"
    install()                  # the kernel adopts its descendants' orphans from here on (Linux)
    reap()
    if children := foreign_children() or orphans():       # review r16 of lab 05: a helper on a socket
        return f"a process your cells started still runs ({children[0]}): stop it or restart the kernel"
    if changed := stdlib_changed():
        return f"{changed} was changed in this kernel (the report comes back through it): restart the kernel"
    return None


# What the kernel's side of grade_apart runs through, besides gpumem (sealed by grader_seal): a cell
# that swapped json.loads forged the report as it came back (review r17 of labs 01 and 05).
_STDLIB = {"json": (), "json.decoder": (), "json.scanner": (), "json.encoder": (), "secrets": (),
           "subprocess": ("Popen", "PIPE", "STDOUT"), "threading": ("Thread",)}      # (): every name
_NATIVE = {"json": "_json", "json.decoder": "_json", "json.scanner": "_json", "json.encoder": "_json",
           "secrets": "_random", "subprocess": "_posixsubprocess", "threading": "_thread"}


def _own(value, name: str, qual: str, codes: dict, c_module) -> bool:
    """Is ``value`` what the module's file binds to ``qual`` (its code, or its C counterpart's)?"""
    import types
    from .grader_seal import _runs_the_files_code
    if isinstance(value, type):
        return (value.__module__, value.__qualname__) == (name, qual) and all(
            _own(v, name, f"{qual}.{k}", codes, c_module) for k, v in vars(value).items()
            if type(v) is types.FunctionType)
    if isinstance(value, types.BuiltinFunctionType):
        return c_module is not None and vars(c_module).get(getattr(value, "__name__", "")) is value
    mine = codes.get(qual, ())
    return type(value) is types.FunctionType and (
        _runs_the_files_code(value, _path(name), mine) or any(genuine.same(value.__code__, c) for c in mine))


def _path(name: str) -> str:
    return getattr(sys.modules.get(name), "__file__", "") or ""


def stdlib_changed() -> str | None:
    """The first name of :data:`_STDLIB` (the report's way back into the kernel) that is not what its
    module's file binds, or an ``os`` function that is not ``posix``'s, or None."""
    for name, names in _STDLIB.items():
        module = importlib.import_module(name)
        codes, c_module = genuine.file_codes(_path(name)), sys.modules.get(_NATIVE[name])
        wanted = names or [q for q in codes if "." not in q and "<" not in q and not q.startswith("_")]
        for qual in wanted:
            value = vars(module).get(qual)
            if value is not None and qual in codes and not _own(value, name, qual, codes, c_module):
                return f"{name}.{qual}"
            if qual in ("PIPE", "STDOUT") and value != {"PIPE": -1, "STDOUT": -2}[qual]:
                return f"{name}.{qual}"
    posix = sys.modules.get("posix")
    for qual, value in vars(posix or object).items():
        if callable(value) and not qual.startswith("_") and qual in vars(os) and vars(os)[qual] is not value:
            return f"os.{qual}"
    return None


def notes(sent: dict) -> list[str]:
    """One line for each name the fresh process will not have, printed before it grades."""
    return [f"note: `{name}` is not carried to the grading process ({why}); a function that reads it fails "
            "there: make it inside that function" for name, why in sent["left"].items()]
