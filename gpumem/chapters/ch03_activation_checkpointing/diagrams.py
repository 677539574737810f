"""Chapter 03's diagrams and tables, rendered from recorded events and the library's numbers.

``event_diagram`` draws the note's X -> A -> B -> C -> D picture from a measured event trace;
``checkpointing_table`` (the registry's table for ``run checkpointing``) and ``impl_table``
print an experiment's result; ``problem_box`` is the chapter's opening numbers. The at-scale
tables live in ``scale``.
"""

import textwrap

from gpumem import units
from gpumem.course.drawing import bar, box
from gpumem.memory import accounting, gpus as gpu_table, models, recompute_cost
from gpumem.memory.recompute_plans import plan as make_plan

from .scale import PRICE_WHO, PRICES, price, working_set


def letter(part: str, n_layers: int) -> str:
    """A layer's output as the note names it: A, B, C, ... (L0, L1, ... past 26 layers)."""
    if part.startswith("L") and part[1:].isdigit():
        i = int(part[1:])
        return chr(ord("A") + i) if n_layers <= 26 else part
    return part


def layer_name(i: int) -> str:
    """A layer as the diagram names it, 0-based as the code counts: L0, L1, ... (its output is a
    tensor: A, B, ...)."""
    return f"L{i}"


def _input_of(layer: int, n_layers: int) -> str:
    return "X" if layer == 0 else letter(f"L{layer - 1}", n_layers)


def kept(plan_name: str, n_layers: int) -> str:
    """What the plan keeps for backward: tensors in the note's letters, layers as L0, L1, ..."""
    p = make_plan(plan_name, n_layers)
    if p.core:
        return "each layer's tensors except attention's scores (q, k, v kept)"
    if p.sac:
        return "each layer's input and matmul outputs"
    if not p.segments:
        return "everything each layer saves"
    inputs = ", ".join(_input_of(seg[0], n_layers) for seg in p.segments)
    plain = [layer_name(i) for i in p.kept()]
    return f"inputs {inputs}" + (f"; all that {', '.join(plain)} save" if plain else "")


def backward_tokens(events: list[dict], plan_name: str, n_layers: int) -> list[str]:
    """The backward pass as a list of steps: gradients (dL3) and re-runs, from the events."""
    p = make_plan(plan_name, n_layers)
    out: list = []
    for e in events:
        if e["phase"] == "recompute":
            i = int(e["part"][1:]) if e["part"].startswith("L") else None
            if out and isinstance(out[-1], list):
                out[-1].append(i)
            else:
                out.append([i])
        elif e["phase"] == "backward" and e["part"].startswith("L") and e["flops"]:
            tok = "d" + layer_name(int(e["part"][1:]))
            if len(out) >= 2 and isinstance(out[-1], list) and out[-2] == tok:
                out.pop(-2)                       # dL3, re-run, dL3: the re-run happened inside dL3
            if not out or out[-1] != tok:
                out.append(tok)
    words = []
    for tok in out:
        if isinstance(tok, list):
            names = " ".join(layer_name(i) for i in dict.fromkeys(tok))
            what = ("'s attention core" if p.core else "'s pointwise ops" if p.sac else "")
            words.append(f"[re-run {names}{what}]" if what else
                         f"[re-run {names} from {_input_of(min(tok), n_layers)}]")
        else:
            words.append(tok)
    return words


def _wrap(head: str, words: list[str], width: int) -> list[str]:
    lines, line = [], head
    for i, w in enumerate(words):
        piece = w if i == 0 else " → " + w
        if len(line) + len(piece) > width and line.strip():
            lines.append(line)
            line = " " * len(head) + "→ " + w
        else:
            line += piece
    return lines + [line]


def event_diagram(result: dict, plans=None, width: int = 92) -> str:
    """The note's picture for each plan: what the forward keeps, what backward re-runs, in order."""
    n = result["layers"]
    names = " → ".join(["X", *[letter(f"L{i}", n) for i in range(n)], "loss"])
    last = layer_name(n - 1)
    lines = [f"forward, every plan: {names}", "X: the embedded tokens; A, B, ...: outputs of layers "
             f"L0, L1, ...; d{last}: backward through {last}", ""]
    for name, row in result["plans"].items():
        if plans and name not in plans:
            continue
        lines.append(f"{name:12s} keeps {kept(name, n)}")
        lines += _wrap(f"{'':12s} backward: ", ["loss", *backward_tokens(row["events"], name, n)], width - 4)
    return box(f"Recorded event order, {result['model']} ({n} layers): forward, re-run, backward", lines,
               width=width)


def flop_unit(x: float) -> tuple[str, float]:
    """A FLOP unit that suits ``x``: MFLOP, GFLOP or TFLOP, and its size."""
    return next((u, s) for u, s in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)) if x >= 10 * s or s == 1e6)


def checkpointing_table(result: dict) -> str:
    """Per plan: bytes saved for backward, activation peak and where, FLOPs, vs formula."""
    unit, size = flop_unit(next(iter(result["plans"].values()))["flops"]["forward"])
    lines = [f"{result['model']}, {result['layers']} layers, seq {result['seq']} x micro-batch "
             f"{result['micro_batch']}, {result.get('tensors', '')}, activations in bf16",
             f"{'plan':11s} {'kept for bwd':>12s} {'act. peak':>10s}  {'peak at':14s} "
             f"{'fwd ' + unit:>9s} {'bwd ' + unit:>9s} {'re-run':>8s} {'+%':>6s}  formula"]
    for name, r in result["plans"].items():
        f = r["formula"]
        same = all([r["saved"] == f["saved"], r["peak"] == f["peak"],
                    all(r["flops"][k] == f["flops"][k] for k in f["flops"])])
        fl = {k: f"{v / size:,.1f}" for k, v in r["flops"].items()}
        lines.append(f"{name:11s} {r['saved']:>12,d} {r['peak']:>10,d}  {r['peak_at'][:14]:14s} "
                     f"{fl['forward']:>9s} {fl['backward']:>9s} {fl['recompute']:>8s} "
                     f"{100 * r['overhead']:>5.1f}%  " + ("equal" if same else "differs"))
    lines += textwrap.wrap(
        "bytes: what the forward keeps for backward, and the activations' peak over the step; "
        f"re-run: recompute {unit}; +%: re-run / (forward + backward), priced as the {PRICES['torch']} "
        "(PyTorch's non-reentrant checkpoint skips each segment's last W_down); the "
        f"{PRICES['scratch']} costs more, see the implementations below", 100, break_on_hyphens=False)
    if "implementations" in result:
        lines += ["", impl_table(result)]
    return "\n".join(lines)


def impl_table(result: dict) -> str:
    """The same plan run by the from-scratch Function, PyTorch's and DeepSpeed's checkpoint."""
    rows = result["implementations"]
    plan = next(iter(rows.values()))["plan"]
    unit, size = flop_unit(next(iter(rows.values()))["flops"]["forward"])
    lines = [f"plan {plan}, three implementations   {'act. peak':>10s} {'recompute ' + unit:>16s}  "
             "gradients vs no checkpointing"]
    names = {"scratch": "Checkpoint (from scratch)", "torch": "torch.utils.checkpoint",
             "deepspeed": "deepspeed.checkpointing"}
    for impl, r in rows.items():
        diff = r.get("grad_max_abs_diff")
        grads = "equal (max |diff| 0)" if diff == 0 else f"max |diff| {diff:.2g}"
        lines.append(f"{names.get(impl, impl):36s} {r['peak']:>10,d} {r['flops']['recompute'] / size:>16,.1f}  {grads}")
    return "\n".join(lines)


def price_box(model: str = "llama-3-8b", seq: int = 4096) -> str:
    """The two prices of full recomputation, by name, as a share of forward + backward FLOPs."""
    lines = [f"{model}, seq {seq:,}, every layer checkpointed: recompute FLOPs / (forward + backward)", ""]
    for impl, name in PRICES.items():
        lines.append(f"{name:21s} +{100 * price(model, seq, impl):4.1f} %   {PRICE_WHO[impl]}")
    lines += ["", "recompute_cost.step_flops(cfg, seq, 1, plan, impl='torch' | 'scratch')"]
    return box("One price per kind of re-run", lines, width=92)


def problem_box(model: str = "llama-3-70b", seq: int = 4096, gpus: int = 64, gpu: str = "h100-80gb") -> str:
    """What does not fit: ZeRO-3 shrinks model states per GPU, but every rank keeps the
    activations of its own micro-batch."""
    cfg, g = models.get(model), gpu_table.get(gpu)
    states = accounting.model_states(cfg.n_params(), "mixed", gpus, 3).total
    working, parts = working_set(model)
    room = gpu_table.usable(g)
    lines = [f"{model}, seq {seq:,} x micro-batch 1, mixed precision, ZeRO-3 over {gpus} {g.label}s",
             "(bars: share of one GPU's usable memory)", ""]
    rows = [("model states / GPU", states), ("ZeRO-3 working set", working)]
    for plan in ("none", "full"):
        a = recompute_cost.activation_bytes(cfg, seq, 1, plan)["peak"]
        rows.append((f"activations ({'no checkpointing' if plan == 'none' else 'every layer checkpointed'})", a))
    for name, v in rows:
        clipped = f"▶ {v / room:.0%}, clipped" if v > room else ""
        lines.append(f"{name:42s}{units.fmt(v):>10s}  {bar(v, room, 20)}{clipped}")
    for plan in ("none", "full"):
        need = states + working + recompute_cost.activation_bytes(cfg, seq, 1, plan)["peak"]
        verdict = "fits" if need <= room else f"{units.fmt(need - room)} too much"
        lines.append(f"{'total, ' + ('no checkpointing' if plan == 'none' else 'checkpointed'):42s}"
                     f"{units.fmt(need):>10s}  of {units.fmt(room)} usable: {verdict}")
    lines += textwrap.wrap("ZeRO-3 working set: what a rank holds beyond its shards while it computes "
                           "(chapter 02): " + " + ".join(f"{name} {units.fmt(v)}" for name, v in parts),
                           92, subsequent_indent="  ")
    lines.append(f"usable = {g.capacity // units.MiB:,} MiB reported - reserve")
    lines.append(f"reserve = {gpu_table.DEFAULT_RESERVE.describe()}")
    return box("The problem: activations do not shard", lines, width=96)
