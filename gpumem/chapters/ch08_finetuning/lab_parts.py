"""Lab 08's rows for ``activation_peak`` (part 2) and ``base_on_cpu`` (part 3's last rung).

Each row is one drawn model (:mod:`.lab_acts`); the first wrong figure is named with its setup and
policy, the direction and a factor (bytes under 1 %), and, where the difference is one the chapter
names, that piece: the frozen base's saves, the adapters' bf16 input copies, their bf16 casts, the
loss, RoPE's tables, the re-run layer, lora_dropout's copies and masks; for QLoRA, what peft's
``prepare_model_for_kbit_training`` would add and the rungs leave out (review r15 #3): every layer
checkpointed, the fp32 cast on the host. Some slips get a question instead (review r33 #1, #3):
the checkpoint's input counted again in the re-run, projections' inputs saved twice, norms counted
as the trace's plain ones, part of the loss's bytes, flash attention's logsumexp (review r35 #2,
#3), and two named pieces of the same bytes (each one's question, neither stated); an excess of no
known kind gets none. Part 3's rows never state the rule cell 13 asks for (review r31 #1, r33 #4):
a slip there gets a question naming the group that is wrong (how often a block's copy crosses, what
else FSDP gathers, how many blocks it holds, which roles are FSDP parameters) or only the direction
and the factor; a bf16 base's rows name no NF4 role.
"""

from dataclasses import replace

from gpumem.course.grading import Row, call, returned, run_case

from . import lab_acts, lab_draw, lab_guard
from .lab_choose import fix_first, own_differs
from .lab_text import ROW_CHARS, describe, model_line, off_by

LOSS = "what does the loss keep, a token: in which dtypes?"
LSE = "in which dtype does flash attention keep its logsumexp?"
KEYS = ("host", "pcie", "gpu")     # checked in this order: the host's bytes need no new idea


def policy_text(policy: str) -> str:
    """A checkpoint policy in words, for a row."""
    return "no checkpointing" if policy == "none" else "every layer checkpointed"


def _dropout_hint(ft, policy: str, dropout: float, got: int, parts: dict, model: dict, seq: int,
                  batch: int) -> str:
    """A row's hint for a setup with ``lora_dropout`` > 0 ('' when the difference is elsewhere)."""
    want, masks, T = parts["peak"], parts["masks"], seq * batch
    if got == want - masks:      # (fp32 adapters on a bf16 base copy their inputs anyway: no dropout at all)
        return "missing: the dropout masks (1 B an element: CUDA's native_dropout keeps a bool mask)"
    if got == parts["no_dropout"]:
        return (f"lora_dropout is {dropout} here: peft runs lora_B(lora_A(dropout(x))), so each adapter saves "
                "its own dropped copy of its input and dropout saves a mask; count those, not the input")
    if got - want in (masks, 3 * masks):
        return ("that is the CPU's dropout, which keeps a noise tensor in the input's dtype; on a GPU, "
                "native_dropout keeps a bool mask: 1 B an element")
    qkv = sum(1 for t in ("q", "k", "v") if t in ft.lora_targets)
    if policy == "none" and got - want == qkv * T * model["d_model"]:
        return ("layer 0's q, k and v read the frozen embedding's normed output, which needs no gradient: "
                "their dropout keeps no mask (A still saves the dropped copy)")
    return ""


def _acts_hint(ft, policy: str, got: int, parts: dict, model: dict, seq: int, batch: int,
               dropout: float = 0.0) -> str:
    want, gap = parts["peak"], parts["peak"] - got
    T, L, h = seq * batch, model["n_layers"], model["d_model"]
    said = _dropout_hint(ft, policy, dropout, got, parts, model, seq, batch) if ft.lora and dropout else ""
    if said:
        return said
    said = _named(policy, gap, parts, model, seq, batch)
    if said:
        return said
    if policy == "full" and -gap == 2 * T * h and want == parts["recompute_peak"]:       # review r33 #1
        return "the re-run layer's input is the checkpoint's own tensor: is it counted twice?"
    if ft.base_dtype == "nf4" and policy == "none" and got == lab_acts.peak_parts(
            lab_draw.config(model), ft, seq, batch, "full", dropout)["peak"]:        # review r15 #3
        return ("that is the checkpointed peak: peft's prepare_model_for_kbit_training would turn gradient "
                "checkpointing on, but these rungs are QLoRA without it, and the policy here is none")
    if policy == "full" and got == parts["forward_peak"] != want:
        return ("that is the end of the forward; here a later moment holds more, the last layer's re-run in "
                "backward: count what is alive then")                                  # review r28 #2
    base = parts["per_layer"] - sum(v for k, v in parts.items() if k.startswith("layer: adapter"))
    if ft.lora and gap >= 0.5 * base * (L if policy == "none" else 1) and gap % (T * model["vocab"]) not in (0, 8):
        return ("the frozen base's activations are still saved: backward runs through every layer to reach "
                "the adapters, so the norms, the attention core and SiLU save as before; only a frozen "
                "projection's own input is not saved (unless an adapter saves it)")
    if ft.lora and dropout:
        return ("with lora_dropout each adapter saves its own dropped bf16 copy of its input (2 B an element, "
                "whatever the adapter's dtype) and, where that input needs a gradient, a 1-byte mask")
    if ft.lora and ft.adapter_dtype == "fp32" and ft.base_dtype == "bf16" and got < want and _widths(
            policy, gap, parts, model, T):                                          # review r35 #3: not any gap
        return ("your adapted projections' saved inputs are short: with fp32 adapters under autocast, see what "
                "each adapted projection saves of its input (saved_in_layer's fp32 row)")  # review r28 #2
    excess = _excess(ft, policy, -gap, parts, model, T) if gap < 0 else ()        # review r33 #3
    if excess == ("inputs",) and ft.lora and ft.base_dtype == "nf4" and _copied(ft, policy, got, parts, model,
                                                                              seq, batch, dropout):
        return ("on a GPU under autocast peft's 4-bit layer does not cast the input: adapters that read one "
                "tensor share it, and o's input is attention's output, already saved")
    if not ft.lora and gap == (L if policy == "none" else 1) * 2 * T * h:      # every layer's, or the re-run's
        return "full fine-tuning saves each projection's input: q/k/v's and the MLP's, one bf16 copy each"
    if policy == "full" and got in (parts["forward_peak"], parts["recompute_peak"]):   # review r31 #4: one
        return ("checkpointed, the peak is the larger of two moments, the end of the forward and the last "   # moment
                "layer's re-run in backward: count what is alive at each")                              # is right
    return " Or ".join({"norms": "what does a fused RMSNorm save on a GPU, against the trace's plain one?",
                        "inputs": "which projections read a tensor that another operator already saves?"}[k]
                       for k in excess)


def _named(policy: str, gap: int, parts: dict, model: dict, seq: int, batch: int) -> str:
    """The hint for a gap that is one piece the chapter names: stated when one piece has those bytes,
    asked about (each piece's question) when several have them or the piece is the learner's to find
    (review r35 #2, #3: the loss's dtypes, flash attention's logsumexp; '' for any other gap)."""
    T, h, V = seq * batch, model["d_model"], model["vocab"]
    rerun = policy == "none" or parts["peak"] == parts["recompute_peak"]
    pieces = [(parts["adapter_casts"], "the adapters' bf16 casts (under autocast each fp32 A and B is cast to bf16 "
               "once a step and kept: 2 B per adapter element)", "are the fp32 adapters' bf16 casts counted?"),
              (8, "the loss's two fp32 scalars (8 B)", "are the loss's two fp32 scalars counted?"),
              (4 * seq * model["head_dim"], "RoPE's cos and sin tables (2 x 2 B x seq x head_dim, shared by the "
               "batch)", "are RoPE's cos and sin tables counted?"),
              (10 * T * V, "the loss's logits (bf16), their fp32 copy and the fp32 log-softmax", LOSS),
              (T * (2 * h + 4), "layer 0's first norm (its input comes from the frozen embedding and needs no "
               "gradient, so that norm saves nothing; every later layer's does: 2h + 4 B a token)",
               "does layer 0's first norm save anything, its input read from the frozen embedding?")]
    pieces += [(k * T * V, "", LOSS) for k in (2, 4, 6, 8)]         # part of the loss's bytes: asked, not told
    if rerun:              # the logsumexp in bf16: 2 B a head and token short in each layer saved
        pieces.append((2 * T * model["n_heads"] * (model["n_layers"] if policy == "none" else 1), "", LSE))
    hits = {ask: told for size, told, ask in pieces if gap and size == abs(gap)}
    if len(hits) == 1 and all(hits.values()):
        return f"{'missing' if gap > 0 else 'counted once too often'}: {next(iter(hits.values()))}"
    return " Or ".join(hits)


def _widths(policy: str, gap: int, parts: dict, model: dict, T: int) -> bool:
    """Whether ``gap`` is a sum of projections' bf16 inputs (2h, 2q, 2F a token: q/k/v/gate/up's, o's,
    down's) in every layer, or in the re-run layer when that is the peak."""
    h, q, F, L = model["d_model"], model["n_heads"] * model["head_dim"], model["ffn"], model["n_layers"]
    if gap <= 0 or (policy == "full" and parts["peak"] == parts["forward_peak"]):
        return False
    per, rest = divmod(gap, T * (L if policy == "none" else 1))
    return not rest and per in {2 * (a * h + b * q + c * F) for a in range(6) for b in (0, 1) for c in (0, 1)}


def _copied(ft, policy: str, got: int, parts: dict, model: dict, seq: int, batch: int, dropout: float) -> bool:
    """Whether a QLoRA count is the one on a bf16 base, where fp32 adapters each copy their input (review
    r35 #3: not an extra SiLU output, down's input width, nor any excess of the same bytes)."""
    bf16 = lab_acts.peak_parts(lab_draw.config(model), replace(ft, base_dtype="bf16"), seq, batch, policy, dropout)
    return got == bf16["peak"] != parts["peak"] and not any(
        got - parts["peak"] == 2 * n * seq * batch * model["ffn"] for n in (1, model["n_layers"]))


def _excess(ft, policy: str, over: int, parts: dict, model: dict, T: int) -> tuple[str, ...]:
    """What a count ``over`` bytes too high can be (review r33 #3), both where the bytes say both:
    "norms", RMSNorms counted as the trace's plain ones (its fp32 input, and when trained its bf16
    product: 2h or 4h a token more than a fused one) in every norm without checkpointing, the
    re-run layer's two with it or the final norm at the forward's end (not 2Th there: a frozen
    head's input, which LoRA does not save), or a fused norm's 2h + 4 counted again; "inputs", a sum
    of projections' bf16 inputs saved again (2h, 2q, 2F a token: q/k/v/gate/up's, o's, down's) in
    every layer, or in the re-run layer when that is the peak; () for any other excess."""
    h, L = model["d_model"], model["n_layers"]
    at_end = policy == "full" and parts["peak"] == parts["forward_peak"]
    norms = (2 * L - 1, 2 * L, 2 * L + 1) if policy == "none" else (1,) if at_end else (2,)
    plain = {n * T * w for n in norms for w in ((2 * h, 4 * h) if ft.lora else (4 * h,))} - {2 * T * h}
    return tuple(k for k, yes in (("norms", over in plain or over % (T * (2 * h + 4)) == 0),
                                  ("inputs", _widths(policy, over, parts, model, T))) if yes)


def grade_acts(report, fn, cases: list) -> None:
    """Rows of ``activation_peak(model, ft, seq, batch, policy, dropout)`` against
    :func:`.lab_acts.peak_parts`' peak."""
    for model, seq, batch, setups in cases:
        case = f"{model_line(model)}, seq {seq} x {batch}"
        if fn is None:
            report.rows.append(Row("activation_peak", case, "todo",
                                   "define activation_peak(model, ft, seq, batch, policy, dropout)"))
            continue

        def body(model=model, seq=seq, batch=batch, setups=setups):
            for ft, policy, dropout, parts in setups:
                got = call(lab_guard.guarded(fn), dict(model), ft, seq, batch, policy, dropout)
                where = f"{describe(ft)}{f', lora_dropout {dropout}' if dropout else ''}, {policy_text(policy)}"
                if isinstance(got, bool) or not isinstance(got, int):
                    return "wrong", f"{where}: " + returned(got, "bytes, a whole number (int)")
                if got != parts["peak"]:
                    hint = _acts_hint(ft, policy, got, parts, model, seq, batch, dropout)
                    return "wrong", f"{where}: {off_by(got, parts['peak'], hint)}"
            return "ok", ""
        run_case(report, "activation_peak", case, body, limit=ROW_CHARS)


def _offload_hint(key: str, got: int, want: dict, ft, model: dict) -> str:
    gap, L, nf4 = want[key] - got, model["n_layers"], ft.base_dtype == "nf4"
    if key == "host" and nf4 and -gap == lab_draw.prepare_cast(model):          # review r15 #3
        return ("you counted peft's prepare_model_for_kbit_training: its fp32 cast of every parameter that is "
                "not 4-bit (embedding, head, norms: 2 B more each); these rungs are QLoRA without it")
    if key == "host":      # review r31 #1: name the group that is wrong, not the rule
        stay = {want["constants"], want["dequant_buffer"], want["constants"] + want["dequant_buffer"]}
        if nf4 and gap < 0 and -gap in stay:
            return "the host holds bytes that FSDP never moves there: which roles are FSDP parameters?"
        return ""
    if key == "pcie":
        if got in (L * want["block"] + want["root"], 3 * L * want["block"] + want["root"]):   # review r33 #4:
            return "how many times does a block's copy cross in one step, and does the re-run need a third?"
        if got == want["pcie"] - want["root"]:                                             # questions only
            return "what does FSDP gather besides the blocks, and how long does it stay gathered?"
        if gap < 0 and -gap % want["root"] == 0:
            return "the root unit crosses fewer times than you counted: how long does it stay gathered?"
        per, rest = divmod(gap, 2 * L)       # one block's bytes, per crossing
        if gap > 0 and not rest and per <= want["block_grads"] + 4 * model["d_model"]:
            return "a block's copy holds more than its matrices: what else does FSDP gather with them?"
        return ""
    held = "how many blocks does FSDP hold while it prefetches"
    pieces = {want["root"]: "how long does FSDP keep the root unit gathered?",
              2 * (want["block"] + want["block_grads"]): f"{held}, and what comes with each?",
              want["block"] + want["block_grads"]: f"{held}?",
              want["block_grads"] * 2: "what does each block on the GPU hold besides its weights?",
              want["constants"]: "which of QLoRA's roles are not FSDP parameters?",
              want["dequant_buffer"]: "which of QLoRA's roles are not FSDP parameters?"}
    if gap in pieces and gap:
        return pieces[gap]
    if nf4 and gap == want["constants"] + want["dequant_buffer"]:
        return "the GPU keeps roles that FSDP never moves to the host: which roles are not FSDP parameters?"
    if got == want["activations"]:
        return "the GPU holds more than the activations while the base is on the CPU: what else must be there?"
    return ""


def grade_offload(report, fn, cases: list, acts=None) -> None:
    """Rows of ``base_on_cpu(model, ft, seq, batch, policy)``: {"gpu", "host", "pcie"} bytes. A wrong
    gpu row is blamed first on the learner's ``activation_peak`` (``acts``) only where that returns
    other than the case's activations (review r31 #2: it was blamed whenever any of its rows failed)."""
    for model, seq, batch, setups in cases:
        case = f"{model_line(model)}, seq {seq} x {batch}"
        if fn is None:
            report.rows.append(Row("base_on_cpu", case, "todo", "define base_on_cpu(model, ft, seq, batch, policy)"))
            continue

        def body(model=model, seq=seq, batch=batch, setups=setups):
            for ft, policy, want in setups:
                got = call(lab_guard.guarded(fn), dict(model), ft, seq, batch, policy)
                where = f"{describe(ft)}, base on the CPU, {policy_text(policy)}"
                if not isinstance(got, dict) or set(got) != set(KEYS):
                    return "wrong", f"{where}: " + returned(got, "a dict with the keys 'gpu', 'host' and 'pcie'")
                for key in KEYS:
                    g = got[key]
                    if isinstance(g, bool) or not isinstance(g, int):
                        return "wrong", f"{where}, {key}: bytes are a whole number (int), got {g!r}"
                    if g != want[key]:
                        hint = _offload_hint(key, g, want, ft, model)
                        first = fix_first("activation_peak") if key == "gpu" and acts is not None and own_differs(
                            acts, (dict(model), ft, seq, batch, policy, 0.0), want["activations"]) else ""
                        return "wrong", f"{where}, {key}: {first}{off_by(g, want[key], hint)}"
            return "ok", ""
        run_case(report, "base_on_cpu", case, body, limit=ROW_CHARS)
