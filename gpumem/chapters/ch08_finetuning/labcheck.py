"""Lab 08's ``check()``: a fine-tuning step's bytes by role counted by hand; the most faithful setup that fits.

The learner writes two functions; while each call runs, gpumem's own fine-tuning counts raise
"count it yourself" (:mod:`.lab_guard`):

* ``role_bytes(model, ft)``: one GPU's bytes by role (:data:`ROLES`) for a model's dimensions (a
  dict) and a :class:`.lab_draw.LabFinetune` (a ``Finetune`` with an NF4 block size and double
  quantisation on or off), graded on three models and six setups each drawn at every check
  (:func:`.lab_draw.states_cases`: the QLoRA ones with NF4 blocks gpumem does not count) against
  :func:`.lab_draw.truth`; the first wrong role is named with the direction
  and a factor (the bytes off, under 1 %), and a hint where the mistake is a known one; the case
  label gives the model's dimensions, vocabulary and whether its head is tied;
* ``choose_recipe(model, capacity, activations, ladder)``: the first setup, a rung of the case's
  ``ladder`` (:data:`.lab_draw.LADDER` with its ``qlora`` rung's NF4 block and double quantisation
  drawn: :func:`.lab_draw.ladder`) with a checkpoint policy (``"none"`` before ``"full"`` within a
  rung: :data:`.lab_draw.SETUPS`), whose model states plus its activation peak (given, per rung
  and policy) fit the card's capacity after chapter 08's single-GPU reserve (``scale.usable``:
  1 GiB CUDA context + 5 % of capacity, no NCCL communicator on one GPU), returned as (that rung's
  ``Finetune``, policy), None if none fits, graded on five cases whose answers are drawn first
  (:func:`.lab_draw.choose_cases`: both policies among them). In the None case the QLoRA rung
  keeps fp32 absmaxes and gpumem's own count (block 64, double quantised) would fit it: a copy of
  the library's chooser returns ``qlora`` there, and the row names the rung's NF4 choice it did
  not count.
"""

import random

from gpumem.course.grading import Report, Row, call, returned, run_case
from gpumem.memory.finetune import ROLES, Finetune

from . import lab_draw, lab_guard, scale

LAB = "lab08_finetune_recipe"
GB = 10**9


def off_by(got: int, want: int) -> str:
    """How ``got`` differs from ``want`` without saying ``want``: direction and a rounded factor."""
    if want == 0:
        return f"you counted {got:,} B where the setup keeps none"
    if got == 0:
        return "you counted nothing where the setup keeps bytes"
    factor = got / want
    if abs(factor - 1) < 0.01:       # a ratio would print as 1x or 0.999x: give the bytes
        return (f"off by {got - want:+,} B ({100 * (factor - 1):+.3f} %): a small term (per tensor, per "
                "block, a rounding up) is off")
    return f"yours is {factor:.3g}x the right count ({'too high' if factor > 1 else 'too low'})"


def _hint(role: str, ft: Finetune, got: dict, want: dict) -> str:
    if all(isinstance(v, int) for v in got.values()) and sum(got.values()) == sum(want.values()):
        return "your total is right but bytes sit under the wrong role: see what each role holds"
    if role == "quant_constants" and got[role] == 0:
        return ("NF4 at a flat 4 bits skips its constants: one absmax per ft.nf4_block weights, and what "
                "bitsandbytes' quantize_4bit keeps beside them per quantised tensor")
    if role == "quant_constants":
        return (f"ft.nf4_block is {ft.nf4_block} here, and the absmaxes are "
                f"{'quantised to 8 bits (double quantisation)' if ft.double_quant else 'kept in fp32'}: "
                "see what quantize_4bit stores in each case")
    if role == "base_weights" and ft.base_dtype == "nf4" and got[role] > want[role]:
        return "the packed codes are 4 bits a weight; the absmaxes and scales go under quant_constants"
    if role in ("adapter_weights", "grads", "optimizer_moments") and ft.lora:
        return ("each adapted matrix has its own in and out features: k and v write n_kv_heads x head_dim, "
                "q writes and o reads n_heads x head_dim, gate/up write and down reads ffn")
    if role == "optimizer_moments" and ft.optimizer == "adamw-8bit":
        return "8-bit AdamW keeps two fp32 states for a tensor under 4,096 elements"
    if role == "dequant_buffer":
        return ("QLoRA dequantises the largest quantised matrix to bf16; 8-bit absmaxes are first rebuilt "
                "in fp32 (dequantize_4bit), fp32 ones are used as they are")
    return ""


def describe(ft: Finetune) -> str:
    """A setup in a few words, for a row (the case the learner got wrong)."""
    if not ft.lora:
        return f"full, {ft.optimizer}"
    kind = "QLoRA" if ft.base_dtype == "nf4" else "LoRA"
    nf4 = (f", NF4 block {getattr(ft, 'nf4_block', 64)}, double quant {getattr(ft, 'double_quant', True)}"
           if ft.base_dtype == "nf4" else "")
    return f"{kind} r={ft.lora_rank} on {','.join(ft.lora_targets)}, {ft.adapter_dtype} adapters, {ft.optimizer}{nf4}"


def states_problem(got, want: dict, ft: Finetune) -> str:
    """The first role where ``got`` differs from ``want`` ('' if none), in words."""
    where = describe(ft)
    if not isinstance(got, dict):
        return f"{where}: " + returned(got, "a dict role -> bytes")
    extra = [r for r in got if r not in ROLES]
    if extra:
        return f"{where}: unknown role {extra[0]!r}; roles are {', '.join(ROLES)}"
    got = {r: got.get(r, 0) for r in ROLES}
    for role in ROLES:
        g, w = got[role], want[role]
        if isinstance(g, bool) or not isinstance(g, int):
            return f"{where}, {role}: bytes are a whole number (int), got {g!r}"
        if g != w:
            hint = _hint(role, ft, got, want)
            return f"{where}, {role}: {off_by(g, w)}" + (f" -- {hint}" if hint else "")
    return ""


def _model_line(m: dict) -> str:
    return (f"L={m['n_layers']} h={m['d_model']:,} a={m['n_heads']} kv={m['n_kv_heads']} "
            f"hd={m['head_dim']} F={m['ffn']:,} V={m['vocab']:,} {'tied' if m['tie_embeddings'] else 'untied'}")


def _grade_states(report: Report, fn, cases: list) -> None:
    for model, setups in cases:
        case = _model_line(model)
        if fn is None:
            report.rows.append(Row("role_bytes", case, "todo", "define role_bytes(model, ft)"))
            continue

        def body(model=model, setups=setups):
            for ft, want in setups:
                bad = states_problem(call(lab_guard.guarded(fn), dict(model), ft), want, ft)
                if bad:
                    return "wrong", bad
            return "ok", ""
        run_case(report, "role_bytes", case, body)


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
    return f"{rung} {'without checkpointing' if policy == 'none' else 'with every layer checkpointed'}"


def why_not(got, want, figures: dict, usable: int, rungs=lab_draw.LADDER, capacity: int | None = None,
            lib_fits: bool = False, counted_qlora: bool = False) -> str:
    """Why the learner's setup (rung, policy) is not the answer, from the grader's figures, in
    words. ``capacity``: what the card reports (a setup between usable and capacity points at the
    reserve); ``lib_fits``: gpumem's own count of the QLoRA rung (block 64, double quantised) fits,
    so a ``qlora`` answer points at the rung's NF4 choice; with ``counted_qlora`` (the learner's
    ``role_bytes`` counts this rung's states right) at the reserve first (review r10: a reserve
    left out was blamed on the NF4 count)."""
    if got is None:
        return f"{label(want)} fits ({lab_draw.total(figures, want) / GB:.1f} GB of {usable / GB:.1f} GB usable)"
    need = lab_draw.total(figures, got)
    if need > usable:
        over = f"{label(got)} needs {need / GB:.1f} GB (states + activations), over {usable / GB:.1f} GB usable"
        reserve = (f" -- it fits the {capacity / GB:.1f} GB the card reports, not what is left after "
                   "the single-GPU reserve (1 GiB of CUDA context + 5 % of capacity)"
                   if capacity is not None and need <= capacity else "")
        if got[0] == "qlora" and lib_fits:
            if reserve and counted_qlora:        # both could be off: the reserve first, as their count is right
                ft = rungs[got[0]]
                return (over + f" -- reserve 1 GiB + 5 % of the card's {capacity / GB:.1f} GB; or your chooser's "
                        f"count: this qlora keeps one {'8-bit' if ft.double_quant else 'fp32'} absmax per "
                        f"{ft.nf4_block} weights{'' if ft.double_quant else ' (no double quantisation)'}; "
                        "count its quant_constants as role_bytes does")
            return over + nf4_note(rungs[got[0]])
        return over + reserve
    if want is not None and want[0] == got[0]:
        return (f"{label(got)} fits, but the rung fits without checkpointing too: no layer needs its "
                "forward run twice")
    return (f"{label(got)} fits, but an earlier rung of the ladder fits too" if want is not None and
            lab_draw.SETUPS.index(want) < lab_draw.SETUPS.index(got) else
            f"{label(got)} fits, but it is not the first setup that does")


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


def _grade_choose(report: Report, fn, cases: list, role_bytes=None) -> None:
    from gpumem.memory import gpus
    wrong = any(r.function == "role_bytes" and r.status != "ok" for r in report.rows)
    for want, card, model, seq, batch, figures, rungs in cases:
        q = rungs["qlora"]
        case = (f"{card}, {_model_line(model)}, seq {seq} x {batch}, qlora NF4 block {q.nf4_block}"
                f"{'' if q.double_quant else ' no double quant'}")
        if fn is None:
            report.rows.append(Row("choose_recipe", case, "todo",
                                   "define choose_recipe(model, capacity, activations, ladder)"))
            continue
        acts = {name: dict(a) for name, (_, a) in figures.items()}

        def body(want=want, card=card, model=model, acts=acts, figures=figures, rungs=rungs):
            got = call(lab_guard.guarded(fn), dict(model), gpus.get(card).capacity, acts, rungs)
            right = None if want is None else (rungs[want[0]], want[1])
            if got == right:
                return "ok", ""
            name, problem = (None, "") if got is None else _setup_of(got, rungs)
            if problem:
                return "wrong", problem
            first = "your role_bytes is wrong (see its rows): fix that first; " if wrong else ""
            lib_fits = lab_draw.library_total(model, figures, rungs) <= scale.usable(card)
            counted = (name == "qlora" and role_bytes is not None
                       and _counts(role_bytes, model, rungs["qlora"], figures["qlora"][0]))
            return "wrong", first + why_not(None if got is None else (name, got[1]), want, figures,
                                            scale.usable(card), rungs, gpus.get(card).capacity, lib_fits, counted)
        run_case(report, "choose_recipe", case, body)


def check(ns: dict, show: bool = True, rng: random.Random | None = None) -> Report:
    """Grade the lab's functions on cases drawn now, which it never shows (module docstring)."""
    rng = rng or random.Random()
    report = Report(LAB)
    _grade_states(report, ns.get("role_bytes"), lab_draw.states_cases(rng))
    _grade_choose(report, ns.get("choose_recipe"), lab_draw.choose_cases(rng), ns.get("role_bytes"))
    if show:
        print(report.summary())
        print("GPU part: none in this lab (the bytes are graded by formula)")
    return report
