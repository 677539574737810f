"""Lab 04's guards around a learner's call, beside :mod:`.labguard`'s op watch.

* :func:`no_library_backward`: while the learner's code runs, the library's attention backwards
  (chapter 04's query-outer ``tiled_backward`` and ``TiledAttention.backward``, the grader's own
  references in :mod:`.labref`; :mod:`.labgpu` adds its own measurement) raise "write the
  key-block loop yourself". Their code objects are swapped, as lab 06's guard does, so a
  reference saved before grading (``from gpumem.memory.flash_tiled import tiled_backward``) is caught too.
* :func:`no_copies`: a profile hook over the learner's call that refuses (and reports through
  the watch's ``flag``, so an ``except`` cannot hide it) any frame running the original code of
  those functions (a ``types.FunctionType`` rebuilt on ``tiled_backward.__code__`` before the
  check keeps it) or a copy of chapter 04's backward by content (its printed source pasted under
  another name: :class:`gpumem.course.copy_watch.Prints`, names, file and lines left out).
* :func:`key_block_calls`: every call of the learner's ``key_block_backward`` made inside their
  ``flash_backward`` (however it is reached: a profile hook on its code), with its ``j0`` (the
  seventh parameter) and a copy of what it returned; :func:`assembled` checks that dK, dV are those
  blocks side by side and dQ their sum.
"""

import contextlib
import sys

import torch
from torch.utils._python_dispatch import _disable_current_modes

from gpumem.course import copy_watch, lab_audit
from gpumem.course.case_limits import TIMED_OUT, TookTooLong
from gpumem.course.grading import LearnerError, call
from gpumem.memory import flash_tiled

from . import labref, labseal

MESSAGE = "write the key-block loop yourself: {} is off while lab 04 is graded"
BLOCKED = (("flash_tiled.tiled_backward", flash_tiled.tiled_backward),
           ("flash_tiled.TiledAttention.backward", flash_tiled.TiledAttention.backward),
           ("labref.grads", labref.grads), ("labref.key_block", labref.key_block),
           ("labref.dense", labref.dense), ("labref.kernel_grads", labref.kernel_grads),
           ("labref._block", labref._block))

ORIGINAL = {fn.__code__: name for name, fn in BLOCKED}    # taken at import, before any swap
COPIED = "write the key-block loop yourself: it ran {} ({}) while lab 04 is graded"
_PRINTS: list = []
C_EVENTS = frozenset({"c_call", "c_return", "c_exception"})   # a builtin called, returned, raised


def prints() -> copy_watch.Prints:
    """Content fingerprints of chapter 04's backward (``tiled_backward``, ``TiledAttention.backward``),
    built once: copy_watch's similarity match, so a paste, a rebuilt function or a mechanically
    edited copy (wrapped returns, added statements) is found alike."""
    if not _PRINTS:
        _PRINTS.append(copy_watch.Prints([(flash_tiled, "flash_tiled")], only=("tiled_backward", "backward")))
    return _PRINTS[0]


def copied(frame) -> str:
    """The chapter-04 backward that ``frame`` runs a copy of, '' if none or if it is the course's own code."""
    return prints().copied(frame)


@contextlib.contextmanager
def no_copies(flag):
    """While the block runs, a call into the original code of :data:`BLOCKED` or into a copy of
    chapter 04's backward calls ``flag(message)`` and raises it."""
    before, original = sys.getprofile(), dict(ORIGINAL)    # a copy: ORIGINAL emptied in the call does nothing
    watch = prints()                                       # taken once: every call event reads it
    seen = watch._seen                                     # code objects matched before (Prints.match)

    def hook(frame, event, arg):
        try:
            if event in C_EVENTS:     # no watch of lab 04 reads them, and they are most of the events (the
                return                # watch's own bookkeeping calls builtins): skipped, the grading runs faster
            if event == "call":
                code, hit = frame.f_code, ""
                if code in original:
                    hit = COPIED.format(original[code], "its code, rebuilt into a function of yours")
                else:             # code matched before with these globals and near no body: nothing to ask
                    was = seen.get(id(code))
                    known = was is not None and not was[2] and was[0] is code and was[1] is frame.f_globals
                    name = "" if known else watch.copied(frame)
                    hit = COPIED.format(name, "chapter 04's backward, copied under another name") if name else ""
                if hit:
                    flag(hit)
                    hook.graders_refusals = [hit]       # lab_watch: this refusal unsets the hook (review r23)
                    raise RuntimeError(hit)
            if before is not None:
                before(frame, event, arg)
        except TookTooLong:       # the case's time limit struck in the hook: Python unsets it, no refusal
            hook.graders_refusals = [TIMED_OUT]         # (review r34 #2: read as "it called sys.setprofile")
            raise
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(before)


def _refusing_code(name: str, message: str = MESSAGE):
    scope: dict = {}
    exec(f"def refuse(*args, **kwargs):\n    raise RuntimeError({message.format(name)!r})\n", scope)
    return scope["refuse"].__code__


@contextlib.contextmanager
def no_library_backward(*extra):
    """Inside the block every function of :data:`BLOCKED` (and of ``extra``, (name, function)
    pairs, or triples with the message) raises; restored after, whatever happens."""
    saved = []
    try:
        for name, fn, *message in (*BLOCKED, *extra):
            saved.append((fn, fn.__code__))
            fn.__code__ = _refusing_code(name, *message)
        yield
    finally:
        for fn, code in saved:
            fn.__code__ = code


@contextlib.contextmanager
def chained(on_event):
    """``on_event(frame, event, arg)`` for every profile event while the block runs, chained to the
    hook already set (the lab's guard watches the same calls); the records of labblock, labring
    and labzig."""
    before = sys.getprofile()

    def hook(frame, event, arg):
        try:
            if event in C_EVENTS:     # as in no_copies: the records read only call and return events
                return
            on_event(frame, event, arg)
            if before is not None:
                before(frame, event, arg)
        except TookTooLong:                         # as in no_copies: the case's time limit, no refusal
            hook.graders_refusals = [TIMED_OUT]
            raise
        except BaseException:
            hook.graders_refusals = [on_event]      # lab_watch: a refusal unsets the hook (review r23)
            raise
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(before)


@contextlib.contextmanager
def key_block_calls(*fns):
    """Record ``(j0, returned)`` of each call of any of ``fns``' code while the block runs."""
    calls, stack = [], []
    codes = {getattr(fn, "__code__", None) for fn in fns} - {None}

    def record(frame, event, arg):
        if frame.f_code in codes:
            if event == "call":
                names = frame.f_code.co_varnames
                stack.append(frame.f_locals.get(names[6]) if frame.f_code.co_argcount > 6 else None)
            elif event == "return" and stack:
                with _disable_current_modes():
                    got = tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t
                                for t in arg) if isinstance(arg, (tuple, list)) else arg
                calls.append((stack.pop(), got))
    with chained(record):
        yield calls


def assembled(calls, got) -> str:
    """'' when dq is the sum of the recorded dq_parts and dk, dv the recorded blocks side by side
    (zero where no block was computed), else what differs."""
    dq, dk, dv = got
    want_dq = torch.zeros(dq.shape, dtype=torch.float64)          # the sum, checked in fp64 only
    want_dk, want_dv = torch.zeros_like(dk), torch.zeros_like(dv)
    seen = set()
    for j0, part in calls:
        if not (isinstance(j0, int) and isinstance(part, tuple) and len(part) == 3
                and all(isinstance(t, torch.Tensor) for t in part)):
            return "a key_block_backward call did not take an int j0 or return three tensors"
        n = part[1].shape[2] if part[1].dim() == 4 else -1
        if j0 in seen or part[0].shape != dq.shape or part[1].shape != part[2].shape or n < 0 \
                or j0 + n > dk.shape[2] or part[1].shape[:2] + part[1].shape[3:] != dk.shape[:2] + dk.shape[3:]:
            return f"the key_block_backward call for key {j0} does not fit one key block of dK, dV"
        seen.add(j0)
        want_dq += part[0].double().cpu()
        want_dk[:, :, j0:j0 + n], want_dv[:, :, j0:j0 + n] = part[1], part[2]
    checks = (("dq", dq, want_dq),) if dq.dtype == torch.float64 else ()
    for name, t, w in (*checks, ("dk", dk, want_dk), ("dv", dv, want_dv)):
        bad = labref.first_wrong(name, t, w)
        if bad:
            what = "the sum of the dq_part" if name == "dq" else f"the {name}_blk blocks side by side"
            return f"{name} is not {what} that key_block_backward returned ({bad})"
    return ""


REFUSAL = "lab 04 grades your own tiles: the grader's frames are off while your function runs"
# review r32 #1: K read element by element from IndexError messages, rebuilt with torch.full
WENT_ON = ("a torch op raised an error inside your call ({}) and your code went on: an error's message "
           "can carry numbers out of torch, where the watch cannot follow them; let an op's error end the call")


def guarded(fn, watch, *args):
    """The learner's call inside the watch with the library's backwards off and the watch sealed
    (labseal: an attribute of it rebound during the call is named first); (result, broken)."""
    hits: list[str] = []
    with no_library_backward(), watch as w, no_copies(w.flag):
        before = labseal.kept(w, w._functions, w.exp2, w.exp2 and w.exp2.products)
        try:
            with lab_audit.refusing(REFUSAL, hits):    # frames, the collector's objects (review r13 #3)
                got = call(fn, *args)
        except LearnerError:
            if not w.broken:       # a rule the watch saw first (its hook raised, and Python then unset
                raise              # the profile hook: an audit event the refusal reports) names the slip
            raise LearnerError(f"RuntimeError: {w.broken}") from None
        finally:
            tampered = labseal.rebound(before)
    reached = f"{REFUSAL} ({hits[0]})" if hits else ""
    went_on = WENT_ON.format(w.read("raised")) if w.read("raised") else ""
    return got, tampered or w.broken or reached or went_on or w.foreign(got)
