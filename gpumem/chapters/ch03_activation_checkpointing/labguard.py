"""Lab 03's guard: while the learner's code runs, ready-made checkpoints refuse to run.

The lab asks for the mechanism itself, so for the duration of each graded call (and of the
backward the grader runs through the learner's function) these raise ``Shortcut``
("... write the mechanism yourself"):

* ``torch.utils.checkpoint``'s entry points: ``checkpoint`` (both variants), ``checkpoint_sequential``,
  ``CheckpointFunction``, ``create_selective_checkpoint_contexts`` and the non-reentrant generator
  behind ``checkpoint`` (so a reference taken before grading, ``from torch.utils.checkpoint import
  checkpoint``, refuses too);
* what wraps them: ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``, the
  ``tag_activation_checkpoint`` higher-order op, DeepSpeed's ``checkpointing`` module;
* the course's own ``Checkpoint`` (``gpumem.memory.recompute``) and the grader's own answers
  (``labplace``: the search for the best placement; ``labcases``: the closed forms and the search
  its draw filters with, review r29 #6, not its rules of thumb; ``labsac`` and ``labsacrun``: the
  operators to keep under a budget, and their measurement).

While the block runs, numbers may not leave torch either (``labescape``: NumPy, DLPack, storage),
and :func:`guarded` with ``answers`` (``estimate_peak`` and ``place_checkpoints``, called through
``labcheck._ask``) runs its body under :func:`gpumem.course.lab_audit.refusing`: starting another
process (``os.system``, ``subprocess``, ``os.posix_spawn``, ``os.fork``: an interpreter where no
guard watches, review r8), reading the grader's frames or the collector's objects, trace and profile
hooks and threads are refused. The checkpoint's bodies are not: the grader's own steps there run
torch code that reads the stack (``torch.manual_seed`` on a machine without CUDA records
``traceback.format_stack()``), and the checkpoint is graded on what torch measures, not on a number.

Two layers: the modules' attributes are swapped for refusals, and a profile hook
(``sys.setprofile``) refuses any call into the code of those functions however it was reached,
and any copy of that code run under another name (``labprints``: matched by bytecode, or by the
names it uses when statements were added; code naming torch's checkpoint's privates; by content,
:func:`shared_prints`, when every name was changed as well; the grader's placement answers by
content too, :func:`answer_prints`, review r30 #1; one code object at a time, so a copy of
``labplace.best_placements`` split across several helper functions is not caught: review r35 #2),
and sees the C calls that take numbers out of torch through references bound before the check. Every
refusal is recorded, so a learner who catches the exception is still reported. Everything is put
back on the way out, on an error or a time limit too.
"""

import contextlib
import functools
import os
import sys

from gpumem.course import copy_watch, lab_audit
from gpumem.course.case_limits import alarm_held

from . import labprints
from .labescape import Escapes, _graders, sentence

MESSAGE = "write the mechanism yourself"
REACHED = "lab 03's grader refuses this while your code runs"      # lab_audit's refusals
ANSWER = "the grader's own answer ({})"                              # as _banned_code names them
_PRINTS: list = []
_INHERITED = object()
HELPERS = labprints.HELPERS          # torch.utils.checkpoint's RNG and input helpers: allowed
# labcases' closed forms and searches (review r29 #6); its rules of thumb (equal_lengths, shortcuts)
# are a learner's honest first try, graded on their placements, not refused. Calls are refused, and
# copies under other names by content (answer_prints; review r30 #1: renamed locals passed 34/34).
CASES_ANSWERS = ("_balanced_peak", "_equal_peak", "may_ask", "question", "draw")
PLACE_ANSWERS = ("best_placements",)      # not labplace.moments: the learner's estimate_peak is that loop


class Shortcut(RuntimeError):
    """A ready-made checkpoint was called where the lab asks for the learner's own."""


def _refusal(name: str, hits: list):
    def refuse(*args, **kwargs):
        hits.append(name)
        raise Shortcut(f"{name} is off limits in this lab: {MESSAGE}")
    return refuse


def _targets() -> list[tuple[object, str, str]]:
    """(owner, attribute, name shown) for every entry point reachable now."""
    import torch.utils.checkpoint as tuc

    from gpumem.memory import recompute
    out = [(tuc, n, f"torch.utils.checkpoint.{n}") for n in
           ("checkpoint", "checkpoint_sequential", "create_selective_checkpoint_contexts",
            "_checkpoint_without_reentrant_generator")]
    out.append((tuc.CheckpointFunction, "apply", "torch.utils.checkpoint.CheckpointFunction"))
    out.append((recompute.Checkpoint, "apply", "the course's Checkpoint (gpumem.memory.recompute)"))
    wrappers = sys.modules.get("torch.distributed.algorithms._checkpoint.checkpoint_wrapper")
    if wrappers is not None:
        out += [(wrappers, n, f"torch.distributed's {n}") for n in ("checkpoint_wrapper", "apply_activation_checkpointing")]
    hop = sys.modules.get("torch._higher_order_ops.wrap")
    if hop is not None:
        out += [(hop, n, f"torch._higher_order_ops.wrap.{n}") for n in ("tag_activation_checkpoint",
                                                                      "wrap_activation_checkpoint")]
    ds = sys.modules.get("deepspeed.runtime.activation_checkpointing.checkpointing")
    if ds is not None:
        out += [(ds, n, f"DeepSpeed's checkpointing.{n}") for n in ("checkpoint", "non_reentrant_checkpoint")]
        out.append((ds.CheckpointFunction, "apply", "DeepSpeed's CheckpointFunction"))
    return [(o, a, n) for o, a, n in out if hasattr(o, a)]


def _banned_code() -> tuple[dict, dict, tuple]:
    """Code objects refused wherever they are called from ({code: name}), files whose every
    function is refused except ``HELPERS`` ({filename: name}), and the fingerprints of both
    (``labprints``: a copy of their code under another name)."""
    import torch.utils.checkpoint as tuc

    from gpumem.memory import recompute

    from . import labcases, labplace, labsac, labsacrun
    course = {f.__code__: "the course's Checkpoint (gpumem.memory.recompute)"
              for f in (recompute.Checkpoint.forward, recompute.Checkpoint.backward)}
    codes = dict(course)          # chapter 03 prints it and the lab asks to extend it: not matched by content
    for module in (labplace, labcases, labsac, labsacrun):
        short = module.__name__.rsplit(".", 1)[-1]
        codes.update({f.__code__: f"the grader's own answer ({short}.{f.__name__})"
                      for f in vars(module).values() if getattr(f, "__module__", "") == module.__name__
                      and hasattr(f, "__code__") and (module is not labcases or f.__name__ in CASES_ANSWERS)})
    hop = sys.modules.get("torch._higher_order_ops.wrap")
    for cls in (getattr(hop, "TagActivationCheckpoint", None), getattr(hop, "WrapActivationCheckpoint", None)):
        codes.update({f.__code__: f"torch's {cls.__name__} (torch._higher_order_ops.wrap)"
                      for f in vars(cls).values() if hasattr(f, "__code__")} if cls else {})
    torch_dir = os.path.dirname(os.path.dirname(tuc.__file__))     # .../torch
    files = {tuc.__file__: "torch.utils.checkpoint",
             os.path.join(torch_dir, "distributed", "algorithms", "_checkpoint", "checkpoint_wrapper.py"):
                 "torch.distributed...checkpoint_wrapper"}
    deepspeed = _package_dir("deepspeed")          # found without importing it (slow)
    if deepspeed:
        files[os.path.join(deepspeed, "runtime", "activation_checkpointing", "checkpointing.py")] = \
            "deepspeed...checkpointing"
    prints = labprints.merge(*(labprints.file_prints(f, n) for f, n in files.items()),
                             *(labprints.code_prints(c, lambda _, n=n: f"a copy of {n}", c not in course)
                               for c, n in codes.items()))
    return codes, files, prints


def _package_dir(name: str) -> str:
    """Where package ``name`` lives, '' if it is not installed; imports nothing."""
    import importlib.util
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None) if module else None
    if origin is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec else None
    return os.path.dirname(origin) if origin else ""


def shared_prints() -> copy_watch.Prints:
    """The shared content fingerprints (:mod:`gpumem.course.copy_watch`) of
    ``torch.utils.checkpoint``, built once. ``labplace`` is left out: they take the solution's own
    ``estimate_peak`` for ``labplace.moments`` (a short loop anyone writes alike; review r8)."""
    if not _PRINTS:
        import torch.utils.checkpoint as tuc
        _PRINTS.append(copy_watch.Prints([(tuc, "torch.utils.checkpoint")]))
    return _PRINTS[0]


@functools.lru_cache(maxsize=1)
def answer_prints() -> copy_watch.Prints:
    """Similarity fingerprints (:class:`gpumem.course.copy_watch.Prints`, as lab 04's) of the grader's
    placement answers: ``labcases``' :data:`CASES_ANSWERS` and ``labplace``'s :data:`PLACE_ANSWERS`.
    ``labprints``' content match needs every name of a body, so renaming two locals of an inlined
    ``_balanced_peak`` passed (review r30 #1); this one reads instructions and constants, names left
    out, and still knows a copy with statements added or its returns wrapped."""
    from . import labcases, labplace
    return copy_watch.Prints([(labcases, "labcases"), (labplace, "labplace")], only=CASES_ANSWERS + PLACE_ANSWERS)


def _copied(frame, copies, what: str = "{}") -> str:
    hit = copies.copied(frame)
    return f"a copy of {what.format(hit)} (its code under other names)" if hit else ""


_ACTIVE: list[tuple[list, object]] = []       # (refusals, watch) of the guards now running


def refused() -> bool:
    """True inside :func:`no_shortcuts` once something was refused (or the watch switched off):
    the grader stops the case there rather than run the rest on a submission already failed."""
    return bool(_ACTIVE) and (bool(_ACTIVE[-1][0]) or sys.getprofile() is not _ACTIVE[-1][1])


@functools.lru_cache(maxsize=1)
def _answer_code() -> tuple[dict, tuple]:
    """The course's own peak formula and tracer ({code: name}, their fingerprints): refused while
    ``estimate_peak`` and ``place_checkpoints`` run (with the model found on the stack, they
    would give the answer without an estimate of the learner's own)."""
    from gpumem.memory import recompute_cost, recompute_trace
    codes = {f.__code__: f"the course's peak formula ({m.__name__.split('.')[-1]}.{f.__name__}: work it out yourself)"
             for m in (recompute_cost, recompute_trace) for f in vars(m).values()
             if getattr(f, "__module__", "") == m.__name__ and hasattr(f, "__code__")}
    return codes, labprints.merge(*(labprints.code_prints(c, lambda _, n=n: f"a copy of {n}")
                                    for c, n in codes.items()))


@contextlib.contextmanager
def no_shortcuts(answers: bool = False):
    """Refuse the ready-made checkpoints inside the block (and with ``answers`` the course's peak
    formula and tracer); yields the list of refusals."""
    hits: list[str] = []
    codes, files, prints = _banned_code()
    copies, answer_copies = shared_prints(), answer_prints()
    if answers:
        more, more_prints = _answer_code()
        codes, prints = {**codes, **more}, labprints.merge(prints, more_prints)
    seen: dict = {}                          # code object -> the banned name it matches, or ''
    c_exit = labprints.c_exit
    swapped = []
    previous = sys.getprofile()
    escapes, entered = Escapes(hits), False

    def watch(frame, event, arg):
        if event == "c_call":
            what = c_exit(arg, _graders(frame))
            if what:
                hits.append("escape: " + what)
                raise RuntimeError(sentence(what))
            return
        if event != "call":
            return
        code = frame.f_code
        name = seen.get(code)
        if name is None:
            name = codes.get(code)
            if name is None and code.co_name not in HELPERS and code.co_filename in files:
                name = f"{files[code.co_filename]}.{code.co_qualname}"
            name = seen[code] = (name or labprints.match(code, prints) or labprints.private(code)
                                 or _copied(frame, copies) or _copied(frame, answer_copies, ANSWER) or "")
        if name:
            hits.append(name)
            raise Shortcut(f"{name} is off limits in this lab: {MESSAGE}")
    watch.graders_refusals = hits            # lab_watch: its refusal unsets it (review r23)

    try:
        for owner, attr, name in _targets():
            swapped.append((owner, attr, vars(owner).get(attr, _INHERITED)))
            setattr(owner, attr, _refusal(name, hits))
        sys.setprofile(watch)
        _ACTIVE.append((hits, watch))
        escapes.__enter__()                  # and numbers may not leave torch (labescape)
        entered = True
        yield hits
        if sys.getprofile() is not watch and not hits:
            hits.append("sys.setprofile (the grader's watch was switched off)")
    finally:
        with alarm_held():                   # a time limit's repeated alarm cannot cut this short
            if _ACTIVE and _ACTIVE[-1][0] is hits:
                _ACTIVE.pop()
            sys.setprofile(previous)
            if entered:
                escapes.__exit__(None, None, None)
            for owner, attr, value in reversed(swapped):
                if value is _INHERITED:           # a class's inherited ``apply``: drop the override
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, value)



def shortcut_line(hits: list[str]) -> str:
    """The row's detail for a submission that reached a ready-made checkpoint (or took tensors
    out of torch: ``labescape``)."""
    if hits[0].startswith("escape: "):
        return sentence(hits[0][len("escape: "):])
    return f"it calls {hits[0]}, which the lab rules out: {MESSAGE}"


def guarded(body, answers: bool = False):
    """``body`` (a run_case body) run under :func:`no_shortcuts` (``answers``: the peak formula
    refused too); a refusal, even one the learner caught, replaces its result with a ``wrong``
    row naming what was called."""
    def run():
        reached: list[str] = []
        with no_shortcuts(answers) as hits:
            try:
                with lab_audit.refusing(REACHED, reached) if answers else contextlib.nullcontext():
                    result = body()
            except Exception:
                if hits or reached:
                    return "wrong", shortcut_line(hits) if hits else f"{REACHED} ({reached[0]})"
                raise
        if hits or reached:          # a shortcut first: stopping it unsets the profile hook, which lab_audit sees too
            return "wrong", shortcut_line(hits) if hits else f"{REACHED} ({reached[0]})"
        return result
    return run
