"""Lab 08's rows for ``choose_recipe(model, capacity, host_ram, seq, batch, ladder)`` (part 3).

A case (:mod:`.lab_cases`) is a GPU, its host's RAM, a model, seq x batch and a ladder; the answer
is the first setup (rung, policy) whose GPU bytes fit the usable bytes and, for the base on the
CPU, whose host bytes fit the host's RAM. A wrong answer's row says why, from the grader's figures,
what is first wrong: the learner's own counts (role_bytes, activation_peak, base_on_cpu rows) if
they fail and, in place of the grader's, would change this case's answer (then only where the
setup stands, :func:`gauge`: review r31 #3); else the reserve when the
setup fits what the card reports; the dequantised matrix (and the NF4 choice) when the setup is over by less than that role alone; the NF4 choice when gpumem's own
count of the rung would fit; the host's RAM; the policy; the ladder's order.
"""

from gpumem.course.grading import Row, call, returned, run_case
from gpumem.memory import gpus
from gpumem.memory.finetune import Finetune

from . import lab_draw, lab_guard, scale
from .lab_text import ROW_CHARS, GB, describe, model_line

RESERVE = "the single-GPU reserve (1 GiB of CUDA context + 5 % of capacity)"


def nf4_note(ft) -> str:
    """The QLoRA rung's NF4 choice in words, for a row (empty for the paper's block of 64, double quantised)."""
    block, dq = getattr(ft, "nf4_block", 64), getattr(ft, "double_quant", True)
    if (block, dq) == (64, True):
        return ""
    return (f" -- this ladder's qlora keeps one {'8-bit' if dq else 'fp32'} absmax per {block} weights"
            f"{'' if dq else ' (no double quantisation)'}: count its quant_constants as your role_bytes "
            "does, not as the QLoRA paper's (8-bit absmaxes per 64)")


def label(setup) -> str:
    """A setup (rung, policy) in words."""
    rung, policy = setup
    where = " (base on the CPU)" if rung == "qlora-cpu" else ""
    return f"{rung}{where} {'without checkpointing' if policy == 'none' else 'with every layer checkpointed'}"


def _gap(n_bytes: int) -> str:
    """A gap in MiB, or in bytes under one MiB (review r24: "by 0 MiB" read as no gap at all)."""
    return f"{n_bytes / 2**20:,.0f} MiB" if n_bytes >= 2**20 else f"{n_bytes:,} B"


def _over(got, need: int, usable: int) -> str:
    return (f"{label(got)} needs {need / GB:.1f} GB on the GPU, over {usable / GB:.1f} GB usable by "
            f"{_gap(need - usable)}")          # r22: the gap, so a 1 GB reserve shows its 70 MiB


def gauge(got, want, figures: dict, usable: int, host_ram: int) -> str:
    """The learner's setup (rung, policy) against the grader's figures, one line and no diagnosis:
    what a row says after one of the learner's counts is named first (review r31 #3: a diagnosis
    there blamed a role that was right, against the count just named)."""
    if got is None:
        return f"{label(want)} fits ({lab_draw.total(figures, want) / GB:.1f} GB of {usable / GB:.1f} GB usable)"
    need, host = lab_draw.total(figures, got), figures[got[0]][2]
    if need > usable:
        return _over(got, need, usable)
    if host > host_ram:
        return (f"{label(got)} fits the GPU, but the host must hold {host / GB:.1f} GB, over its "
                f"{host_ram / GB:.1f} GB of RAM")
    return (f"{label(got)} fits ({need / GB:.1f} GB of {usable / GB:.1f} GB usable), but it is not the first "
            "setup that does")


def why_not(got, want, figures: dict, usable: int, rungs=lab_draw.LADDER, capacity: int | None = None,
            lib_fits: bool = False, counted_qlora: bool = False, host_ram: int | None = None,
            buffer: int = 0) -> str:
    """Why the learner's setup (rung, policy) is not the answer, in words (module docstring).
    ``buffer``: the got rung's dequant_buffer (0 for a bf16 base)."""
    spare = usable - lab_draw.total(figures, want) if want is not None else usable
    close = (f" -- by {_gap(spare)}: a reserve larger than 1 GiB + 5 % of capacity misses it"
             if 0 <= spare <= 2**28 else "")
    if got is None:
        return f"{label(want)} fits ({lab_draw.total(figures, want) / GB:.1f} GB of {usable / GB:.1f} GB usable)" + close
    need = lab_draw.total(figures, got)
    if need > usable:
        over = _over(got, need, usable)
        reserve = (f" -- it fits the {capacity / GB:.1f} GB the card reports, not what is left after {RESERVE}"
                   if capacity is not None and need <= capacity else "")
        if got[0] == "qlora-cpu":           # review r23: a near miss is the reserve, not base_on_cpu's count
            return over + (f" -- reserve 1 GiB (2**30 B) + 5 % of the card's {capacity / GB:.1f} GB" if reserve else
                           " -- with the base on the CPU the GPU still holds base_on_cpu's gpu bytes: compare them too")
        if got[0] == "qlora" and lib_fits:
            if reserve and counted_qlora:        # both could be off: the reserve first, as their count is right
                ft = rungs[got[0]]
                return (over + f": reserve 1 GiB + 5 % of the card's {capacity / GB:.1f} GB? role_bytes is right "
                        f"here; else your chooser miscounts: one {'8-bit' if ft.double_quant else 'fp32'} absmax "
                        f"per {ft.nf4_block} weights{'' if ft.double_quant else ' (no double quantisation)'}: "
                        "count its quant_constants")
            return over + nf4_note(rungs[got[0]])
        if buffer and got[0] == "qlora" and need - usable <= buffer:
            return (over + ", less than its dequant_buffer alone "      # r25: the gap is in `over` already
                    f"({buffer / 2**20:,.0f} MiB: the largest matrix dequantised to bf16) -- count each rung's "
                    "states as role_bytes does, every role (a per-parameter 4.127 bits leaves out the dequantised "
                    f"matrix{' and this ladder' + chr(39) + 's NF4 constants' if nf4_note(rungs[got[0]]) else ''})"
                    + (f"; or your reserve: {reserve[4:]}" if reserve else ""))
        if reserve and counted_qlora:        # the reserve, or a chooser that does not use role_bytes' count
            return (over + f" -- reserve 1 GiB (2**30 B) + 5 % of the card's {capacity / GB:.1f} GB; or your "
                    "chooser counts this rung's states short, though your role_bytes counts them right: use it")
        return over + reserve
    host = figures[got[0]][2]
    if host_ram is not None and host > host_ram:
        return (f"{label(got)} fits the GPU, but the host must hold {host / GB:.1f} GB (the base, the adapters, "
                f"their gradients and moments), over its {host_ram / GB:.1f} GB of RAM")
    if want is not None and want[0] == got[0]:
        return (f"{label(got)} fits, but the rung fits without checkpointing too: no layer needs its "
                f"forward run twice{close}")
    return (f"{label(got)} fits, but an earlier rung of the ladder fits too{close}" if want is not None and
            lab_draw.SETUPS.index(want) < lab_draw.SETUPS.index(got) else
            f"{label(got)} fits, but it is not the first setup that does{close}")


def _setup_of(got, rungs) -> tuple[str | None, str]:
    """(rung name or None, problem) for a learner's return value; problem is "" when well formed."""
    shape = "(a rung's own Finetune from the ladder, 'none' or 'full'), or None"
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], Finetune)):
        return None, returned(got, shape)
    if got[1] not in lab_draw.POLICIES:
        return None, f"the checkpoint policy {got[1]!r} is not 'none' or 'full'"
    name = next((n for n, ft in rungs.items() if ft == got[0]), None)
    if name is None:
        return None, f"{describe(got[0])} is not a rung of this case's ladder: return the rung's own Finetune"
    return name, ""


def _counts(role_bytes, model: dict, ft, states: int) -> bool:
    """Whether the learner's ``role_bytes`` (guarded) sums to ``states`` for ``ft``; False if it fails."""
    try:
        got = call(lab_guard.guarded(role_bytes), dict(model), ft)
        return isinstance(got, dict) and sum(got.values()) == states
    except Exception:       # noqa: BLE001 - any failure means "not counted right"
        return False


COUNTS = ("role_bytes", "activation_peak", "base_on_cpu")


def fix_first(which: str) -> str:
    """A row's prefix naming one of the learner's :data:`COUNTS` as what to fix first."""
    return f"your {which} is wrong (see its rows): fix that first; "


def own_differs(fn, args: tuple, want) -> bool:
    """Whether the learner's ``fn`` (guarded), called with ``args``, returns other than ``want``; True
    if it fails. The fact behind :func:`fix_first`: a count is blamed only where it is wrong for the
    case at hand (review r28 #6 for choose_recipe, r31 #2 for base_on_cpu's gpu row)."""
    try:
        return call(lab_guard.guarded(fn), *args) != want
    except Exception:       # noqa: BLE001 - a count that fails here is wrong here
        return True


def _by_own(counts: dict, which: str, case: tuple, figures: dict, rungs, usable: int, host_ram: int):
    """The first setup that fits by the grader's figures with ``which``'s counts (the learner's
    function, guarded) in their place; raises if one is not bytes."""
    model, seq, batch = case
    fn, states = lab_guard.guarded(counts[which]), {}
    for name, policy in lab_draw.SETUPS:
        ft, (gpu, acts, host) = rungs[name], figures[name]
        gpu += acts[policy]
        if which == "base_on_cpu" and ft.offload:
            got = call(fn, dict(model), ft, seq, batch, policy)
            gpu, host = got["gpu"], got["host"]
        elif which == "role_bytes" and not ft.offload:
            if name not in states:
                states[name] = sum(call(fn, dict(model), ft).values())
            gpu += states[name] - figures[name][0]
        elif which == "activation_peak":      # the base on the CPU too (review r33 #2: else the reserve was blamed)
            gpu += call(fn, dict(model), ft, seq, batch, policy, 0.0) - acts[policy]
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (gpu, host)):
            raise TypeError("not bytes")
        if gpu <= usable and host <= host_ram:
            return name, policy
    return None


def _first(report, counts: dict, want, *where) -> str:
    """What to fix first: one of the learner's own counts with failing rows, where its counts, in
    place of the grader's, change this case's answer (review r28 #6: a 1 KiB slip was blamed for a
    reserve that alone missed)."""
    bad = {r.function for r in report.rows if r.status != "ok"}
    for which in (fn for fn in COUNTS if fn in bad):
        try:
            changes = _by_own(counts, which, *where) != want
        except Exception:       # noqa: BLE001 - a count that fails here changes the answer
            changes = True
        if changes:
            return fix_first(which)
    return ""


def grade_choose(report, fn, cases: list, counts: dict | None = None) -> None:
    """One row per case (:mod:`.lab_cases`): the learner's setup against the drawn answer; ``counts``:
    the notebook's namespace, where the learner's :data:`COUNTS` functions are read."""
    counts = {name: (counts or {}).get(name) for name in COUNTS}
    role_bytes = counts["role_bytes"]
    for want, card, host_ram, model, seq, batch, figures, rungs in cases:
        q = rungs["qlora"]
        case = (f"{card} + {host_ram // 2**30} GiB RAM, {model_line(model)}, seq {seq} x {batch}, qlora NF4 block "
                f"{q.nf4_block}{'' if q.double_quant else ' no double quant'}")
        if fn is None:
            report.rows.append(Row("choose_recipe", case, "todo",
                                   "define choose_recipe(model, capacity, host_ram, seq, batch, ladder)"))
            continue

        def body(want=want, card=card, host_ram=host_ram, model=model, seq=seq, batch=batch, figures=figures,
                 rungs=rungs):
            got = call(lab_guard.guarded(fn), dict(model), gpus.get(card).capacity, host_ram, seq, batch, rungs)
            right = None if want is None else (rungs[want[0]], want[1])
            if got == right:
                return "ok", ""
            name, problem = (None, "") if got is None else _setup_of(got, rungs)
            if problem:
                return "wrong", problem
            lib_fits = lab_draw.library_total(model, figures, rungs) <= scale.usable(card)
            counted = (name is not None and not rungs[name].offload and role_bytes is not None
                       and _counts(role_bytes, model, rungs[name], figures[name][0]))
            buffer = (lab_draw.truth(lab_draw.config(model), rungs[name])["dequant_buffer"]
                      if name in ("qlora", "qlora-cpu") else 0)
            first = _first(report, counts, want, (model, seq, batch), figures, rungs, scale.usable(card), host_ram)
            if first:          # review r31 #3: the count named first, then only where the setup stands
                return "wrong", first + gauge(None if got is None else (name, got[1]), want, figures,
                                              scale.usable(card), host_ram)
            return "wrong", why_not(
                None if got is None else (name, got[1]), want, figures, scale.usable(card), rungs,
                gpus.get(card).capacity, lib_fits, counted, host_ram, buffer)
        run_case(report, "choose_recipe", case, body, limit=ROW_CHARS)
