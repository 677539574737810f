"""Instruction signatures for :mod:`.copy_watch`: a function reduced to what a copy keeps.

:func:`signature` is a code object's instructions with their constants and operators, without
names, lines, file or jump offsets; :func:`_shingles` hashes its runs of :data:`SHINGLE`
instructions after :func:`_shape` reads every load alike (a constant moved into a global, a
renamed local) and drops statements that only call something with no arguments (``_nop()``):
review r7's copy of the chapters' code (constants hoisted into globals, a no-op call before every
statement) matched no protected body under the older, exact signature.
"""

import dis
import types
from functools import lru_cache

GUARD_CALLS = {"audit", "graders_only", "refuse_if_active"}   # a leading call of these is dropped
_SKIP = {"RESUME", "NOP", "EXTENDED_ARG", "CACHE", "MAKE_CELL", "COPY_FREE_VARS", "RETURN_GENERATOR"}
_NAMED = set(dis.hasname) | set(dis.haslocal) | set(dis.hasfree)
# A paste changes jump offsets and LOAD_METHOD vs LOAD_GLOBAL's NULL bit + LOAD_ATTR (3.11 compiles
# ``math.sqrt(d)`` either way, as ``import math`` is in the same source or not): not in a signature.
_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)


def _const(value):
    return signature(value) if isinstance(value, types.CodeType) else (
        type(value)(_const(v) for v in value) if isinstance(value, (tuple, frozenset)) else value)


def _drop_guard(ops: list) -> list:
    """``ops`` without its leading statements that call one of :data:`GUARD_CALLS` (bare calls, result dropped)."""
    while True:
        end = next((i for i, (name, _) in enumerate(ops[:12]) if name == "POP_TOP"), None)
        head = ops[:end or 0]
        if not (head and any(a in GUARD_CALLS for _, a in head)
                and all(n.startswith(("LOAD_", "PRECALL", "CALL", "PUSH_NULL")) for n, _ in head)):
            return ops
        ops = ops[end + 1:]


@lru_cache(maxsize=4096)
def signature(code: types.CodeType) -> tuple:
    """``code``'s instructions with their constants and operators, without names, lines, file,
    jump offsets or the LOAD_METHOD/LOAD_ATTR choice; a leading guard statement dropped (module docstring)."""
    ops = []
    for ins in dis.get_instructions(code):
        if ins.opname in _SKIP:
            continue
        name = "LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname
        if ins.opcode in _NAMED:
            arg = ins.argval if ins.argval in GUARD_CALLS else None
        elif ins.opcode in dis.hasconst:
            arg = _const(ins.argval)
        elif ins.opcode in _JUMPS:
            arg = None
        else:
            arg = ins.arg
        ops.append((name, arg))
    return tuple(_drop_guard(ops))


SHINGLE, COVER = 8, 0.6   # instructions per shingle; share of a body's shingles that makes a copy


_LOADS = {"LOAD_CONST", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE"}
_NOP = (("LOAD", None), ("PRECALL", 0), ("CALL", 0), ("POP_TOP", None))   # ``_nop()`` as a statement


def _shape(sig: tuple) -> tuple:
    """``sig`` with every load alike (a constant moved into a global, or a renamed local, reads the
    same) and statements that only call something with no arguments (``_nop()``) left out."""
    ops = [("LOAD", None) if op in _LOADS else (op, a) for op, a in sig]
    out: list = []
    for item in ops:
        out.append(item)
        if len(out) >= 4 and tuple(out[-4:]) == _NOP:
            del out[-4:]
    return tuple(out)


def _shingles(sig: tuple, k: int = SHINGLE) -> set[int]:   # hashes of sig's runs of k instructions
    sig = _shape(sig)
    return {hash(sig[i:i + k]) for i in range(len(sig) - k + 1)}


def _valued(code: types.CodeType, values: dict | None) -> frozenset:
    """The numbers, strings and None the globals ``code`` names hold (a constant moved into one)."""
    kinds = (int, float, str, type(None))
    return _atoms(v for n in code.co_names if type(v := (values or {}).get(n, ...)) in kinds)


def _atoms(values) -> frozenset:
    """Constants as the source wrote them: tuples the compiler folded (``(1, 2)``, ``x[:, 1:]``)
    split into their items, and a number's sign dropped (``-1`` is ``-`` applied to ``1``)."""
    out = set()
    for v in values:
        if isinstance(v, (tuple, frozenset)):
            out |= _atoms(v)
        else:
            out.add(abs(v) if type(v) in (int, float) else v)
    return frozenset(out)


def _loaded(sig: tuple) -> frozenset:      # the constants sig loads, nested functions' bodies aside
    return _atoms(a for op, a in sig if op == "LOAD_CONST" and not (isinstance(a, tuple) and a and all(
        isinstance(x, tuple) and len(x) == 2 and x[0] in dis.opmap for x in a)))
