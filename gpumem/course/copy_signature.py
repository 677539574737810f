"""Instruction signatures for :mod:`.copy_watch`: a function reduced to what a copy keeps.

:func:`signature` is a code object's instructions with their constants and operators, without
names, lines, file or jump offsets; :func:`_shingles` hashes its runs of :data:`SHINGLE`
instructions after :func:`_shape` reads every load alike (a constant moved into a global, a
renamed local) and drops statements that only call something with no arguments (``_nop()``):
review r7's copy of the chapters' code (constants hoisted into globals, a no-op call before every
statement) matched no protected body under the older, exact signature. Review r8's copies
(constants moved into keyword defaults, ``_pz = 0`` before every statement, one constant computed)
are met by :func:`bound_values`/:func:`frame_values`, the dead stores left out of a signature, and
:func:`consts_met`. Review r24's copy of ``grad_swap.exposed_seconds`` with its argument check
deleted held 0.6 of the body's shingles, under :data:`COVER`: a leading run of checks
(``if ...: raise ...``, ``assert``) is left out of every signature (:func:`_drop_checks`), so a
copy reads the same with or without them. Review r27 wrote ``t += x`` as ``t = t + x``: an in-place
operator reads as the plain one. A docstring compiles to no instruction: never in one.
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
_INPLACE = 13         # 3.11's BINARY_OP: 0-12 the operators (NB_ADD ...), 13-25 the same in place (NB_INPLACE_ADD ...)
_SIMPLE = {"LOAD_CONST", "LOAD_FAST", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME"}


def _const(value):
    return signature(value) if isinstance(value, types.CodeType) else (
        type(value)(_const(v) for v in value) if isinstance(value, (tuple, frozenset)) else value)


_EFFECTS = ("STORE_", "DELETE_", "IMPORT_", "RETURN", "YIELD", "BEFORE_", "PUSH_EXC", "POP_EXCEPT", "RERAISE",
            "SETUP_", "CHECK_EXC", "FOR_ITER", "SEND", "GET_", "MATCH_", "WITH_", "RAISE", "SWAP", "COPY")


def _expression(ops: list, info: list, calls: bool, most: int = 16) -> int | None:
    """Where the expression whose value ends ``ops`` starts (review r25/r26: a value dropped, ``shard``,
    ``-shard``, ``(shard,)``, or stored in a local never read, ``_pz = abs(shard)``): the shortest
    tail of at most ``most`` instructions that pushes one value and never reaches below where it
    started, with no jump, jump target or instruction of another kind of effect, and no call unless
    ``calls`` (a call whose result is dropped, ``out.append(x)``, is often the function's work:
    left in, so the library's short functions keep their fingerprints); None if none."""
    total = 0
    for k in range(len(ops) - 1, max(-1, len(ops) - 1 - most), -1):
        effect, flow = info[k]
        if flow or ops[k][0].startswith(_EFFECTS) or (not calls and ops[k][0] in ("CALL", "PRECALL")):
            return None
        total += effect
        if total == 1:
            depth = 0
            for e, _ in info[k:]:
                depth += e
                if depth < 1:
                    break
            else:
                return k
    return None


def _guard_call(ops: list) -> int:
    """How many of ``ops`` a leading statement that calls one of :data:`GUARD_CALLS` takes (a bare
    call, result dropped; 0 if ``ops`` starts with none)."""
    end = next((i for i, (name, _) in enumerate(ops[:12]) if name == "POP_TOP"), None)
    head = ops[:end or 0]
    if head and any(a in GUARD_CALLS for _, a in head) \
            and all(n.startswith(("LOAD_", "PRECALL", "CALL", "PUSH_NULL")) for n, _ in head):
        return end + 1
    return 0


_NOT_A_CHECK = ("STORE_", "DELETE_", "IMPORT_", "POP_TOP", "RETURN", "YIELD", "PUSH_EXC", "POP_EXCEPT",
                "CHECK_EXC", "RERAISE", "FOR_ITER", "SEND", "SETUP_")


def _check(ops: list, at: list) -> int:
    """How many of ``ops`` a leading argument check takes (``if cond: raise ...`` or ``assert``:
    instructions up to the first ``RAISE_VARARGS``, every jump among them forward and no further
    than the instruction after it, one of them past it, and nothing stored, imported or dropped on
    the way); 0 if ``ops`` starts with none. ``at``: each op's (offset, jump target or None)."""
    r = next((i for i, (name, _) in enumerate(ops) if name == "RAISE_VARARGS"), None)
    if r is None or r + 1 >= len(ops):
        return 0
    raised, end = at[r][0], at[r + 1][0]       # skipped or dead-store instructions may lie between
    jumps = [(offset, target) for offset, target in at[:r] if target is not None]
    if not any(raised < t for _, t in jumps) or any(not offset < t <= end for offset, t in jumps):
        return 0
    return 0 if any(name.startswith(_NOT_A_CHECK) for name, _ in ops[:r]) else r + 1


def _drop_checks(ops: list, at: list) -> list:
    """``ops`` without its leading guard calls (:func:`_guard_call`) and argument checks
    (:func:`_check`), in any order (review r24: a copy with its check deleted is still a copy)."""
    while (cut := _guard_call(ops) or _check(ops, at)):
        ops, at = ops[cut:], at[cut:]
    return ops


@lru_cache(maxsize=4096)
def signature(code: types.CodeType) -> tuple:
    """``code``'s instructions with their constants and operators, without names, lines, file,
    jump offsets or the LOAD_METHOD/LOAD_ATTR choice; leading guard statements and argument checks
    dropped (module docstring, :func:`_drop_checks`), and values computed and dropped or stored in a
    local never read (:func:`_expression`; review r8's copy_pad put ``_pz = 0`` before every
    statement, r25 and r26 ``shard`` and ``-shard``: no run of 8 instructions was left whole)."""
    ops, at, info = [], [], []
    every = list(dis.get_instructions(code))
    read = {ins.argval for ins in every if ins.opname in ("LOAD_FAST", "DELETE_FAST", "LOAD_CLOSURE")}
    for ins in every:
        if ins.opname in _SKIP:
            continue
        dead = ins.opname == "STORE_FAST" and ins.argval not in read      # ``_pz = 0``, ``_pz = -shard``
        if (dead or ins.opname == "POP_TOP") and (k := _expression(ops, info, calls=dead)) is not None:
            del ops[k:], at[k:], info[k:]   # a value computed and dropped (r8, r25, r26): left out
            continue
        name = "LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname
        if ins.opcode in _NAMED:
            arg = ins.argval if ins.argval in GUARD_CALLS else None
        elif ins.opcode in dis.hasconst:
            arg = _const(ins.argval)
        elif ins.opcode in _JUMPS:
            arg = None
        elif ins.opname == "BINARY_OP" and ins.arg >= _INPLACE:
            arg = ins.arg - _INPLACE        # ``t += x`` reads as ``t = t + x`` (review r27)
        else:
            arg = ins.arg
        ops.append((name, arg))
        at.append((ins.offset, ins.argval if ins.opcode in _JUMPS else None))
        effect = dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None)
        info.append((effect, ins.opcode in _JUMPS or ins.is_jump_target))
    return tuple(_drop_checks(ops, at))


def common(a: tuple, b: tuple) -> int:
    """Instructions ``a`` and ``b`` share in order (their longest common subsequence): a copy with
    statements put between its own keeps all of them, whatever it breaks of the runs (review r26)."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


SHINGLE, COVER = 8, 0.6   # instructions per shingle; share of a body's shingles that makes a copy
KEPT, SOME = 0.9, 0.3     # a body kept in order this much, by code holding this share of its shingles
CLOSE = 0.75              # a share of shingles at which over half a body's constants are enough (consts_met)


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


_KINDS = (int, float, str, type(None))


def _valued(code: types.CodeType, values: dict | None) -> frozenset:
    """The numbers, strings and None the globals ``code`` names hold (a constant moved into one)."""
    return _atoms(v for n in code.co_names if type(v := (values or {}).get(n, ...)) in _KINDS)


def _atoms(values) -> frozenset:
    """Constants as the source wrote them: tuples the compiler folded (``(1, 2)``, ``x[:, 1:]``)
    split into their items, and a number's sign dropped (``-1`` is ``-`` applied to ``1``)."""
    out = set()
    for v in values:
        if isinstance(v, (tuple, frozenset)):
            out |= _atoms(v)
        else:   # True is not 1 here (``keepdim=True`` supplied the 1.0 of a changed copy)
            out.add(abs(v) if type(v) in (int, float) else ("bool", v) if type(v) is bool else v)
    return frozenset(out)


def _plain(v) -> bool:    # a number, string or None, or a tuple of them
    return type(v) in _KINDS or (isinstance(v, tuple) and len(v) < 64 and all(_plain(x) for x in v))


def bound_values(fn) -> frozenset:
    """The numbers, strings and None a function carries outside its body: its defaults
    (``__defaults__``, ``__kwdefaults__``) and closure cells (review r8's mut3 moved every constant
    of a copy into a keyword-only default, read with LOAD_FAST like a parameter)."""
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:                      # an empty cell
            pass
    kw = getattr(fn, "__kwdefaults__", None) or {}
    return _atoms(v for v in (*(getattr(fn, "__defaults__", None) or ()), *kw.values(), *cells)
                  if _plain(v))


def frame_values(frame) -> frozenset:
    """What :func:`bound_values` reads, from a running frame: the values its parameters and free
    variables hold (a default, or a constant the caller passed, or a closure's)."""
    code = frame.f_code
    flags = code.co_flags
    n = code.co_argcount + code.co_kwonlyargcount + bool(flags & 0x04) + bool(flags & 0x08)   # *args, **kw
    names = set(code.co_varnames[:n]) | set(code.co_freevars)
    local = frame.f_locals
    return _atoms(v for k in names if _plain(v := local.get(k, ...)))


def consts_met(needed: frozenset, loaded: frozenset, cover: float) -> bool:
    """True if ``loaded`` holds enough of the constants ``needed`` (those a protected body loads):
    all of them, all but one when the body loads 4 or more (review r8: ``range(0, ...)`` pasted as
    ``range(len(()), ...)`` took out the only 0 of chapter 04's backward's six), and more than half
    of them when the code holds :data:`CLOSE` of the body's shingles (a copy with a few of a long
    body's numbers computed). The learner's own code that reads like the answer holds few of its
    shingles or differs in many constants (the library's ``offload_traffic`` holds 0.96 of
    ``finetune.grouped``'s shingles and none of its 12 strings). Limit: a copy whose every number is
    computed (``len(((),))``) keeps 3 of that backward's 6 and 0.79 of its shingles, which reads as
    the same body with other numbers: not named."""
    missing = len(needed - loaded)
    allowed = max(1 if len(needed) >= 4 else 0, (len(needed) - 1) // 2 if cover >= CLOSE else 0)
    return missing <= allowed


def _loaded(sig: tuple) -> frozenset:      # the constants sig loads, nested functions' bodies aside
    return _atoms(a for op, a in sig if op == "LOAD_CONST" and not (isinstance(a, tuple) and a and all(
        isinstance(x, tuple) and len(x) == 2 and x[0] in dis.opmap for x in a)))
