"""Lab 08's ``check()``: a fine-tuning step's bytes counted by hand; the most faithful setup that fits.

The learner writes four functions; while each call runs, gpumem's own fine-tuning counts raise
"count it yourself" (:mod:`.lab_guard`):

* ``role_bytes(model, ft)``: one GPU's bytes by role (:data:`ROLES`) for a model's dimensions (a
  dict) and a :class:`.lab_draw.LabFinetune` (a ``Finetune`` with an NF4 block size and double
  quantisation on or off), graded on three models and six setups each drawn at every check
  (:func:`.lab_draw.states_cases`: the QLoRA ones with NF4 blocks gpumem does not count) against
  :func:`.lab_draw.truth`; the first wrong role is named with the direction
  and a factor (the bytes off, under 1 %), and a hint where the mistake is a known one; the case
  label gives the model's dimensions, vocabulary and whether its head is tied;
* ``activation_peak(model, ft, seq, batch, policy, dropout)``: one step's activation peak, graded on
  four drawn models (:func:`.lab_acts.acts_cases`) against the engine's ``finetune_activation_bytes``
  with peft's ``lora_dropout`` counted (:func:`.lab_acts.peak_parts`; rows by :mod:`.lab_parts`):
  the frozen base still saves, peft's fp32 adapters copy their inputs, and with dropout each
  adapter saves its own dropped copy and a mask (the prompt gives rules and a trace, not these);
* ``base_on_cpu(model, ft, seq, batch, policy)``: GPU, host and PCIe bytes with every parameter on
  the CPU (chapter 08's ``scale.base_offloaded``, :func:`.lab_acts.offloaded`), on two drawn models;
* ``choose_recipe(model, capacity, host_ram, seq, batch, ladder)``: the first setup, a rung of the
  case's ``ladder`` (:data:`.lab_draw.LADDER`: its last rung QLoRA with the base on the CPU; the
  QLoRA rungs' NF4 choice drawn) with a checkpoint policy, whose GPU bytes fit the card's capacity
  after chapter 08's single-GPU reserve (``scale.usable``) and, base on the CPU, whose host bytes
  fit ``host_ram``; None if none fits; graded on six cases whose answers are drawn first
  (:mod:`.lab_cases`), rows by :mod:`.lab_choose`.
"""

import random

from gpumem.course import seeds
from gpumem.course.grading import Report, Row, call, returned, run_case
from gpumem.memory.finetune import ROLES, Finetune

from . import lab_acts, lab_cases, lab_draw, lab_guard
from .lab_choose import grade_choose
from .lab_parts import grade_acts, grade_offload
from .lab_text import ROW_CHARS, GB, describe, model_line, off_by  # noqa: F401 (the rows' words)

LAB = "lab08_finetune_recipe"


def _maps_once(ft: Finetune, extra: int, model: dict | None) -> str:
    """The hint for NF4 constants short by one map per quantised tensor but one (review r28 #1: the
    nested map counted once, as 8-bit AdamW's shared maps are): '' for any other gap."""
    if model is None or extra >= 0:
        return ""
    others = model["n_layers"] * len(lab_draw.matrices(lab_draw.config(model))) - 1   # every projection's
    maps = {lab_draw.NF4_CODE: "the NF4 code (state.code)"}
    if ft.double_quant:
        maps |= {lab_draw.NESTED_MAP: "the nested map (state2.code)",
                 lab_draw.NF4_CODE + lab_draw.NESTED_MAP: "the NF4 code and the nested map"}
    said = next((words for size, words in maps.items() if -extra == size * others), "")
    return (f"each quantised tensor keeps its own copy of {said}, unlike 8-bit AdamW's shared maps: "
            "see which storage the cell's two weights share") if said else ""


def _adapter_widths(model: dict, ft: Finetune) -> tuple[int, set[int]]:
    """A LoRA layer's adapter parameters over its rank (in + out of each adapted projection), and the
    same with q's, k/v's or ffn's width taken for another (d_model, q's, k/v's): the slips of shape."""
    h, F = model["d_model"], model["ffn"]
    q, kv = model["n_heads"] * model["head_dim"], model["n_kv_heads"] * model["head_dim"]

    def count(q, kv, f):
        shape = {"q": h + q, "k": h + kv, "v": h + kv, "o": q + h, "gate": h + f, "up": h + f, "down": f + h}
        return sum(shape[t] for t in ft.lora_targets)
    right = count(q, kv, F)
    return right, {count(a, b, c) for a in (h, q, kv) for b in (h, q, kv) for c in (F, h)} - {right}


def _adapter_hint(role: str, ft: Finetune, got: int, want: int, model: dict | None) -> str:
    """An adapter role's hint (review r35 #1): a count 2x or 0.5x off asks about the dtype; one that
    matches a wrong width of q, k/v or ffn asks about the shapes (stating none); else none."""
    said, dtype = [], ft.adapter_dtype
    linear = role != "optimizer_moments" or ft.optimizer == "adamw"      # bytes in proportion to the count
    if want and linear and (got == 2 * want or 2 * got == want):
        said.append({"adapter_weights": f"how many bytes does a {dtype} adapter value take?",
                     "grads": f"in which dtype does autograd keep a {dtype} parameter's gradient?",
                     "optimizer_moments": f"in which dtype does AdamW keep a {dtype} parameter's states?"}[role])
    if model is not None and want and linear:
        right, wrong = _adapter_widths(model, ft)
        if any(got * right == want * n for n in wrong):
            said.append("what are in and out for each adapted projection of this model: is every one of "
                        "q, k, v, o, gate, up and down d_model wide on both sides?")
    return " Or ".join(said)


def _hint(role: str, ft: Finetune, got: dict, want: dict, model: dict | None = None) -> str:
    if all(isinstance(v, int) for v in got.values()) and sum(got.values()) == sum(want.values()):
        return "your total is right but bytes sit under the wrong role: see what each role holds"
    if role == "quant_constants" and got[role] == 0:
        return ("NF4 at a flat 4 bits skips its constants: one absmax per ft.nf4_block weights, and what "
                "bitsandbytes' quantize_4bit keeps beside them per quantised tensor")
    if role == "quant_constants" and (said := _maps_once(ft, got[role] - want[role], model)):
        return said
    if role == "quant_constants":
        return (f"ft.nf4_block is {ft.nf4_block} here, and the absmaxes are "
                f"{'quantised to 8 bits (double quantisation)' if ft.double_quant else 'kept in fp32'}: "
                "see what quantize_4bit stores in each case")
    if (role == "base_weights" and ft.base_dtype == "nf4" and model is not None
            and got[role] - want[role] == lab_draw.prepare_cast(model)):       # review r15 #3
        return ("you counted peft's prepare_model_for_kbit_training: its fp32 cast of every parameter that "
                "is not 4-bit (embedding, head, norms: 2 B more each); these rungs are QLoRA without it "
                "(part 1's prompt), so those stay bf16")
    if role == "base_weights" and ft.base_dtype == "nf4" and got[role] > want[role]:
        return "the packed codes are 4 bits a weight; the absmaxes and scales go under quant_constants"
    if role == "base_weights" and ft.base_dtype == "nf4" and got[role] < want[role]:       # review r31 #5
        return "which tensors does QLoRA store as NF4?"
    if role in ("adapter_weights", "grads", "optimizer_moments") and ft.lora:      # review r35 #1: questions
        return _adapter_hint(role, ft, got[role], want[role], model)
    if role == "optimizer_moments" and ft.optimizer == "adamw-8bit":
        return ("the moments of the tensors 8-bit AdamW leaves unquantised are off: find in init_state which "
                "tensors those are, and what it keeps for them")                       # review r28 #2
    extra = got[role] - want[role] if isinstance(got[role], int) else 0
    if role == "optimizer_scales" and ft.optimizer == "adamw-8bit" and extra > 0 and extra % 2048 == 0:
        return ("every quantised tensor's state holds qmap1 and qmap2, but they are the optimizer's two maps "
                "(name2qmap), shared: count the two 256-value fp32 maps once")           # review r24
    if role == "dequant_buffer":
        return ("QLoRA dequantises the largest quantised matrix to bf16; 8-bit absmaxes are first rebuilt "
                "in fp32 (dequantize_4bit), fp32 ones are used as they are")
    return ""


def states_problem(got, want: dict, ft: Finetune, model: dict | None = None) -> str:
    """The first role where ``got`` differs from ``want`` ('' if none), in words (``model``: the
    case's dimensions, for the hints that are worked out from them)."""
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
            hint = _hint(role, ft, got, want, model)
            return f"{where}, {role}: {off_by(g, w, hint)}"
    return ""


def _grade_states(report: Report, fn, cases: list) -> None:
    for model, setups in cases:
        case = model_line(model)
        if fn is None:
            report.rows.append(Row("role_bytes", case, "todo", "define role_bytes(model, ft)"))
            continue

        def body(model=model, setups=setups):
            for ft, want in setups:
                bad = states_problem(call(lab_guard.guarded(fn), dict(model), ft), want, ft, model)
                if bad:
                    return "wrong", bad
            return "ok", ""
        run_case(report, "role_bytes", case, body, limit=ROW_CHARS)


def check(ns: dict, show: bool = True, rng: random.Random | None = None) -> Report:
    """Grade the lab's functions on cases drawn now, which it never shows (module docstring)."""
    rng = rng or seeds.rng()
    lab_guard.refresh()              # the blocked functions and their copies, found now (review r14)
    report = Report(LAB)
    _grade_states(report, ns.get("role_bytes"), lab_draw.states_cases(rng))
    grade_acts(report, ns.get("activation_peak"), lab_acts.acts_cases(rng))
    grade_offload(report, ns.get("base_on_cpu"), lab_acts.offload_cases(rng), ns.get("activation_peak"))
    grade_choose(report, ns.get("choose_recipe"), lab_cases.choose_cases(rng), ns)
    if show:
        print(report.summary())
        print("GPU part: none in this lab (the bytes are graded by formula)")
    return report
