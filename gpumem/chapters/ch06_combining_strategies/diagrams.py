"""Chapter 06's text renderings, all from the planner's numbers: ranked plans, one plan's memory
box and time breakdown, the three scenarios, and the proof run's measured-vs-planned table."""

import json
import textwrap

from gpumem import units
from gpumem.course import drawing

MEMORY_PARTS = ("params", "grads", "optimizer", "zero3_working_set", "buffers", "activations")
TIME_PARTS = ("compute", "attention_scores", "pipeline_bubble", "tensor_parallel", "pipeline_p2p",
              "data_parallel", "optimizer", "offload")


def plans_table(result, top: int = 8) -> str:
    """The best plan of each kind (recipe, ZeRO, tp, pp, offload), ranked by step time: each plan
    on two lines (its layout, then framework, bytes, time and what bounds it), under 100 columns."""
    q = result.question
    tokens = q["seq"] * q["global_batch"]
    head = (f"{q['model']} on {q['gpus']} x {q['gpu']}, seq {q['seq']:,}, global batch {q['global_batch']:,} "
            f"({tokens:,} tokens a step):\n{len(result.plans):,} layouts fit in {units.fmt(q['usable'])} per GPU")
    if not result.plans:
        return head + "\n" + advice_text(result)
    lines = [head, f"{'#':>2s}  layout", f"{'':>2s}  {'framework':18s} {'GB/GPU':>7s} {'step s':>8s} {'tokens/s':>9s}  bound"]
    for i, p in enumerate(result.distinct(top), 1):
        lines.append(f"{i:>2d}  {p.layout.label()}")
        lines.append(f"{'':>2s}  {p.layout.framework:18s} {p.memory['total'] / 1e9:>7.1f} {p.time['total']:>8.2f} "
                     f"{p.tokens_per_s:>9,.0f}  {p.time['bound']}")
    return "\n".join(lines)


def advice_text(result) -> str:
    """What is missing when nothing fits, and the smallest change of each kind that fits."""
    a = result.advice or {}
    lines = [textwrap.fill(f"nothing fits: the closest layout ({a.get('closest')}) misses by "
                           f"{units.fmt(a.get('missing') or 0)} per GPU", 100, subsequent_indent="  ")]
    lines += [textwrap.fill(f"fits with {c['change']}: {c['value']}  ({c['layout']})", 100, initial_indent="  ",
                            subsequent_indent="      ") for c in a.get("changes", [])]
    return "\n".join(lines)


def plan_breakdown(plan) -> str:
    """One plan's per-GPU memory and step time, part by part."""
    m, t = plan.memory, plan.time
    lines = [plan.layout.label(), f"{'memory per GPU':24s}{'':>12s}    {'time per step':24s}"]
    for i in range(max(len(MEMORY_PARTS), len(TIME_PARTS))):
        left = f"{MEMORY_PARTS[i]:24s}{units.fmt(m[MEMORY_PARTS[i]]):>12s}" if i < len(MEMORY_PARTS) else " " * 36
        right = f"{TIME_PARTS[i]:24s}{t[TIME_PARTS[i]]:>9.2f} s" if i < len(TIME_PARTS) else ""
        lines.append(f"{left}    {right}")
    lines.append(f"{'total':24s}{units.fmt(m['total']):>12s}    {'total':24s}{t['total']:>9.2f} s")
    lines.append(f"{'usable':24s}{units.fmt(m['usable']):>12s}    {'bound by':24s}{t['bound']:>11s}")
    if m["host"] or m["nvme"]:
        lines.append(f"offloaded per GPU: host {units.fmt(m['host'])}, NVMe {units.fmt(m['nvme'])}")
    return "\n".join(lines)


def memory_box(plan, width: int = 44) -> str:
    """A per-GPU memory bar: each part's share of the usable bytes, drawn to scale."""
    m = plan.memory
    parts = [(k, m[k]) for k in MEMORY_PARTS if m[k]]
    scale = width / max(m["usable"], m["total"])
    bar = "".join(k[0].upper() * max(1, round(v * scale)) for k, v in parts)
    free = max(0, width - len(bar))
    lines = [f"|{bar}{'.' * free}|  {units.fmt(m['total'])} of {units.fmt(m['usable'])} usable"]
    lines += [f"  {k[0].upper()} {k:20s} {units.fmt(v):>10s}" for k, v in parts]
    label = plan.layout.label()
    if len(label) > drawing.WIDTH - 4:        # too long for the title row: first inside the frame
        head, _, off = label.partition(" offload ")
        return drawing.box("per-GPU memory", [head] + ([f"  offload {off}"] if off else []) + lines)
    return drawing.box(label, lines)


def scenarios_table(recs: dict) -> str:
    """Each scenario's top plan with its memory and time (``scenarios.recommendations()``): the
    scenario, then its plan's layout, then framework, bytes, time and bound, under 100 columns."""
    lines = ["scenario", "    top plan", f"    {'framework':18s} {'GB/GPU':>7s} {'step s':>8s}  bound"]
    for r in recs.values():
        lines += [r["about"], f"    {r['label']}",
                  f"    {r['framework']:18s} {r['memory']['total'] / 1e9:>7.1f} {r['time']['total']:>8.2f}  "
                  f"{r['time']['bound']}"]
    return "\n".join(lines)


def plan_proof_table(result: dict) -> str:
    """The proof run: per rank, the bytes DeepSpeed holds against the plan's, part by part."""
    lines = [f"plan for {result['model']} on {result['ranks']} {result['device']} ranks, budget "
             f"{result['budget']:,} B per rank ({result['fitting']} layouts fit):", f"  {result['plan']}",
             f"{'part':12s}{'planned':>14s}" + "".join(f"{'rank ' + str(r['rank']):>14s}" for r in result["ranks_held"])
             + f"{'difference':>12s}{'tolerance':>11s}"]
    for k, planned in result["planned"].items():
        measured = [r["measured"][k] for r in result["ranks_held"]]
        diff = max(abs(v - planned) for v in measured)
        lines.append(f"{k:12s}{planned:>14,d}" + "".join(f"{v:>14,d}" for v in measured)
                     + f"{diff:>12,d}{result['tolerance'][k]:>11,d}")
    total = sum(result["planned"].values())
    lines.append(f"{'sum':12s}{total:>14,d}" + "".join(f"{sum(r['measured'].values()):>14,d}" for r in result["ranks_held"]))
    lines.append(f"bytes, read from DeepSpeed's tensors after {len(result['ranks_held'][0]['losses'])} micro-batches")
    return "\n".join(lines)


def _fields(d: dict, width: int = 100) -> str:
    """A plain-words dict as "  key: value" lines within ``width`` columns (continuations indented)."""
    return "\n".join(textwrap.fill(f"{k}: {v}", width, initial_indent="  ", subsequent_indent="      ",
                                    break_on_hyphens=False, break_long_words=False) for k, v in d.items())


def config_text(plan) -> str:
    """The plan's DeepSpeed config (JSON, as it is pasted), its FSDP equivalent and what the
    model's code must do (plain words, within 100 columns)."""
    fsdp = _fields(plan.fsdp) if plan.fsdp else "  none: FSDP has no such layout"
    head = f"framework: {plan.layout.framework}\n"
    if plan.megatron:
        args = textwrap.wrap(" ".join(plan.megatron), 90, break_on_hyphens=False, break_long_words=False)
        engine = "Megatron-Core" if plan.layout.framework == "megatron-core" else "Megatron-DeepSpeed"
        head += f"{engine} arguments:\n  " + " \\\n  ".join(args) + "\n"
    ds = json.dumps(plan.deepspeed, indent=2) if plan.deepspeed is not None else (
        "  none: Megatron-Core runs without DeepSpeed" if plan.layout.framework == "megatron-core"
        else "  none: DeepSpeed 0.19.8 removed MiCS; FSDP2 runs this layout")
    return (head + "DeepSpeed config:\n" + ds + "\nFSDP2 equivalent:\n" + fsdp
            + "\nmodel code:\n" + _fields(plan.model_code))


def layout_grid(layout, gpus_per_node: int = 8) -> str:
    """Which GPU does what and what moves where: pipeline stages as rows, data-parallel replicas
    as columns, each cell the tensor- (and context-) parallel group of one replica of a stage, as
    GPU numbers (ranks ordered tp fastest, then cp, then dp, then pp: Megatron's order); ZeRO
    shards along a row (the dp cells of one stage, over dp x cp ranks when cp > 1)."""
    tp, pp, dp, cp = layout.tp, layout.pp, layout.dp, layout.cp
    cell = tp * cp
    shape = f"tp {tp} x " + (f"cp {cp} x " if cp > 1 else "") + f"dp {dp} x pp {pp}"
    lines = textwrap.wrap(f"{cell * pp * dp} GPUs = {shape}; nodes of {gpus_per_node}; ZeRO-{layout.zero} shards "
                          f"along each row, over its {dp} replicas" + (f" x cp {cp} = {dp * cp} ranks" if cp > 1 else ""),
                          100, subsequent_indent="  ", break_on_hyphens=False)
    show_dp = min(dp, 4)
    for s in range(min(pp, 6)):
        cells = []
        for r in range(show_dp):
            first = s * cell * dp + r * cell
            ranks = f"{first}" if cell == 1 else f"{first}-{first + cell - 1}"
            cells.append(f"[{ranks:^9s}]")
        more = f" ... {dp - show_dp} more replicas" if dp > show_dp else ""
        lines.append(f"stage {s}: " + " <-> ".join(cells) + more)
        if s < min(pp, 6) - 1:
            lines.append("   |  activations forward, their gradients back (point-to-point, once per micro-batch)")
    if pp > 6:
        lines.append(f"... {pp - 6} more stages")
    lines.append("what moves:")
    moves = []
    if tp > 1:
        moves.append(f"inside a [cell]: each tensor-parallel group of {tp} GPUs (in one node) all-reduces "
                     "activations 4 times a layer (2 forward, 2 backward) over NVLink")
    if cp > 1:
        link = "InfiniBand: its GPUs sit in different nodes" if cell > gpus_per_node else "NVLink"
        moves.append(f"inside a [cell]: {cp} GPUs, one of each tensor-parallel group, each hold 1/{cp} of every "
                     f"sequence and pass K and V chunks around their ring in every layer's attention ({link})")
    if layout.vp > 1:
        moves.append(f"each GPU holds {layout.vp} chunks of its stage's layers (interleaved 1F1B): a "
                     f"micro-batch passes every stage {layout.vp} times")
    mcore = layout.framework == "megatron-core"
    words = {0: "all-reduces the gradients once per step",
             1: ("reduce-scatters the gradients, then all-gathers the updated parameters (Megatron-Core's "
                 "distributed optimizer)" if mcore else "all-reduces the gradients, then all-gathers the updated "
                 "parameters"),
             2: "reduce-scatters the gradients every micro-batch, all-gathers the parameters once",
             3: "all-gathers each layer's parameters (forward and backward) and reduce-scatters its gradients"}
    moves.append(f"<-> along a row: ZeRO-{layout.zero} " + words[layout.zero]
                 + (" (NVLink inside a node, InfiniBand between nodes)" if cell * dp > gpus_per_node else " (NVLink)"))
    if layout.offload != "none":
        where = "host memory" if layout.device == "cpu" else "host memory <-> NVMe drive"
        moves.append(f"each GPU <-> {where} over PCIe: gradients down, updated parameters up once a step "
                     f"({layout.offload} offloaded)"
                     + ("; and every micro-batch's forward and backward fetch the parameter shard up again"
                        if layout.offload == "optimizer+params" else ""))
    lines += [textwrap.fill(m, 100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False) for m in moves]
    lines += textwrap.wrap("a [cell] is one tensor-parallel group: it holds 1/tp of every matrix of its stage"
                           if cp == 1 else f"a [cell] is {cp} tensor-parallel groups of {tp}: each GPU holds 1/tp "
                           f"of every matrix of its stage and 1/{cp} of every sequence", 100)
    return "\n".join(lines)


def one_f_one_b(stages: int, micro: int) -> str:
    """The 1F1B schedule as text: one row per stage, one column per time slot (a forward or a
    backward of one micro-batch, backward taken as one slot for the picture); ``F3`` forward of
    micro-batch 3, ``B3`` its backward, ``..`` idle (the bubble). Warm-up: stage i runs
    ``stages - i`` forwards before its first backward; then it alternates; then it drains."""
    slots: list[dict[int, str]] = [dict() for _ in range(stages)]
    for s in range(stages):
        t = s                                   # a stage starts once its input arrives
        order = []
        warm = min(stages - s, micro)
        order += [("F", m) for m in range(warm)]
        f, b = warm, 0
        while b < micro:
            order.append(("B", b))
            b += 1
            if f < micro:
                order.append(("F", f))
                f += 1
        slots[s] = {"order": order}
    # time each op: a forward needs the previous stage's forward, a backward the next stage's backward
    done: dict = {}
    for _ in range(4 * stages * micro):
        progressed = False
        for s in range(stages):
            ops, placed = slots[s]["order"], slots[s].setdefault("placed", [])
            if len(placed) == len(ops):
                continue
            kind, m = ops[len(placed)]
            dep = done.get(("F", s - 1, m)) if kind == "F" and s > 0 else \
                done.get(("B", s + 1, m)) if kind == "B" and s < stages - 1 else \
                done.get(("F", s, m)) if kind == "B" else -1
            if dep is None:
                continue
            start = max(dep + 1, (placed[-1][0] + 1) if placed else 0)
            placed.append((start, f"{kind}{m}"))
            done[(kind, s, m)] = start
            progressed = True
        if not progressed:
            break
    width = 1 + max(p[-1][0] for p in (slots[s]["placed"] for s in range(stages)))
    rows = []
    for s in range(stages):
        cells = ["..."] * width
        for t, name in slots[s]["placed"]:
            cells[t] = f"{name:>3s}"
        rows.append(f"stage {s}: " + " ".join(cells))
    idle = sum(c == "..." for r in rows for c in r.split()[2:])
    rows.append(f"{stages} stages, {micro} micro-batches: {width} slots, {idle} of {stages * width} idle "
                f"= {idle / (stages * width):.0%}; (p - 1)/(m + p - 1) = {(stages - 1) / (micro + stages - 1):.0%}")
    return "\n".join(rows)
