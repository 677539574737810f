"""The grader seal's part for FLOP counts: torch's ``flop_registry`` and the course's formulas.

Every FLOP count of the labs rests on ``torch.utils.flop_counter``. :func:`counter_problem` says
when its registry is not torch's own (entries replaced, wrapped, emptied); ``grader_seal`` records
:func:`_counter_marks` with its other marks and asks :func:`counter_problem` at every check.
"""

import types

from . import genuine


def _counter_marks() -> dict[str, object]:
    """What every FLOP count of the labs rests on (review r13 of lab 03: a cell that set each entry
    of torch's ``flop_registry`` to ``lambda *a, **k: 0`` made "keep nothing" and "checkpoint every
    layer alone" cost 0 FLOPs, 21/21): the registry's entries, the course's CPU attention formulas
    and the counter's method, by identity (:func:`counter_problem` checks them against their files)."""
    from torch.utils import flop_counter

    from gpumem.memory import flops
    marks: dict[str, object] = {f"flop_registry[{k}]": v for k, v in flop_counter.flop_registry.items()}
    marks.update({f"flops.CPU_ATTENTION[{k}]": v for k, v in flops.CPU_ATTENTION.items()})
    marks["FlopCounterMode._count_flops"] = flop_counter.FlopCounterMode._count_flops
    return marks


def counter_problem() -> str:
    """'' when torch's FLOP counter is torch's own: at least 20 formulas in its registry, each the
    code ``torch/utils/flop_counter.py`` defines (a registry changed before gpumem was imported is
    seen too), else what is wrong."""
    from torch.utils import flop_counter
    if len(flop_counter.flop_registry) < 20:
        return "torch.utils.flop_counter.flop_registry (emptied)"
    for key, fn in flop_counter.flop_registry.items():
        if not _genuine_through(fn):
            return f"torch.utils.flop_counter.flop_registry[{key}]"
    return ""


def _genuine_through(fn, depth: int = 0) -> bool:
    """``fn`` and everything it runs are their files' own code: each ``__wrapped__`` layer and each
    function its closure holds (torch's entries are ``shape_wrapper``'s closure around the formula;
    review r15 of lab 03: ``functools.wraps`` around a zero passed a check of the unwrapped code)."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or not genuine.genuine(code) or depth > 4:
        return isinstance(code, types.CodeType) and genuine.genuine(code)
    inner = [f for c in (getattr(fn, "__closure__", None) or ()) if callable(f := _cell(c))
             and not isinstance(f, (types.BuiltinFunctionType, type))]     # C functions and classes: not code
    wrapped = getattr(fn, "__wrapped__", None)
    return all(_genuine_through(f, depth + 1) for f in inner + ([wrapped] if wrapped is not None else []))


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:            # an empty cell
        return None
