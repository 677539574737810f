"""Chapter 06's text renderings, all from the planner's numbers: ranked plans, one plan's memory
box and time breakdown, the three scenarios, and the proof run's measured-vs-planned table."""

import json

from gpumem import units
from gpumem.course import drawing

MEMORY_PARTS = ("params", "grads", "optimizer", "zero3_working_set", "buffers", "activations")
TIME_PARTS = ("compute", "attention_scores", "pipeline_bubble", "tensor_parallel", "pipeline_p2p",
              "data_parallel", "optimizer", "offload")


def plans_table(result, top: int = 8) -> str:
    """The best plan of each kind (recipe, ZeRO, tp, pp, offload), ranked by step time."""
    q = result.question
    head = (f"{q['model']} on {q['gpus']} x {q['gpu']}, seq {q['seq']:,}, global batch {q['global_batch']:,}: "
            f"{len(result.plans):,} layouts fit in {units.fmt(q['usable'])} per GPU")
    if not result.plans:
        return head + "\n" + advice_text(result)
    lines = [head, f"{'#':>2s}  {'layout':74s} {'GB/GPU':>7s} {'step s':>8s} {'tokens/s':>9s}  bound"]
    for i, p in enumerate(result.distinct(top), 1):
        lines.append(f"{i:>2d}  {p.layout.label():74s} {p.memory['total'] / 1e9:>7.1f} {p.time['total']:>8.2f} "
                     f"{p.tokens_per_s:>9,.0f}  {p.time['bound']}")
    return "\n".join(lines)


def advice_text(result) -> str:
    """What is missing when nothing fits, and the smallest change of each kind that fits."""
    a = result.advice or {}
    lines = [f"nothing fits: the closest layout ({a.get('closest')}) misses by "
             f"{units.fmt(a.get('missing') or 0)} per GPU"]
    lines += [f"  fits with {c['change']}: {c['value']}  ({c['layout']})" for c in a.get("changes", [])]
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
    return drawing.box(plan.layout.label(), lines)


def scenarios_table(recs: dict) -> str:
    """Each scenario's top plan with its memory and time (``scenarios.recommendations()``)."""
    lines = [f"{'scenario':62s} {'top plan':72s} {'GB/GPU':>7s} {'step s':>8s}  bound"]
    for r in recs.values():
        lines.append(f"{r['about']:62s} {r['label']:72s} {r['memory']['total'] / 1e9:>7.1f} "
                     f"{r['time']['total']:>8.2f}  {r['time']['bound']}")
    return "\n".join(lines)


def plan_proof_table(result: dict) -> str:
    """The proof run: per rank, the bytes DeepSpeed holds against the plan's, part by part."""
    lines = [f"plan for {result['model']} on {result['ranks']} {result['device']} ranks, budget "
             f"{result['budget']:,} B per rank ({result['fitting']} layouts fit): {result['plan']}",
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


def config_text(plan) -> str:
    """The plan's DeepSpeed config, indented, and its FSDP equivalent."""
    fsdp = json.dumps(plan.fsdp, indent=2) if plan.fsdp else "none: FSDP has no such layout"
    return "DeepSpeed config:\n" + json.dumps(plan.deepspeed, indent=2) + "\nFSDP2 equivalent:\n" + fsdp


def layout_grid(layout, gpus_per_node: int = 8) -> str:
    """Which GPU does what and what moves where: pipeline stages as rows, data-parallel replicas
    as columns, each cell a tensor-parallel group of GPU numbers (ranks ordered tp fastest, then
    dp, then pp); ZeRO shards along a row (the dp cells of one stage)."""
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    lines = [f"{tp * pp * dp} GPUs = tp {tp} x dp {dp} x pp {pp}; nodes of {gpus_per_node}; ZeRO-{layout.zero} "
             f"shards along each row, over its {dp} data-parallel cells"]
    show_dp = min(dp, 4)
    for s in range(min(pp, 6)):
        cells = []
        for r in range(show_dp):
            first = s * tp * dp + r * tp
            ranks = f"{first}" if tp == 1 else f"{first}-{first + tp - 1}"
            cells.append(f"[{ranks:^9s}]")
        more = f" ... {dp - show_dp} more replicas" if dp > show_dp else ""
        lines.append(f"stage {s}: " + " <-> ".join(cells) + more)
        if s < min(pp, 6) - 1:
            lines.append("   |  activations forward, their gradients back (point-to-point, once per micro-batch)")
    if pp > 6:
        lines.append(f"... {pp - 6} more stages")
    lines.append("what moves:")
    if tp > 1:
        lines.append(f"  inside a [cell]: {tp} GPUs of one node all-reduce activations 4x per layer over NVLink")
    lines.append(f"  <-> along a row: ZeRO-{layout.zero} " + {
        0: "all-reduces the gradients once per step",
        1: "all-reduces the gradients, then all-gathers the updated parameters",
        2: "reduce-scatters the gradients every micro-batch, all-gathers the parameters once",
        3: "all-gathers each layer's parameters (forward and backward) and reduce-scatters its gradients",
    }[layout.zero] + (" (NVLink inside a node, InfiniBand between nodes)" if tp * dp > gpus_per_node else " (NVLink)"))
    if layout.offload != "none":
        lines.append(f"  each GPU <-> {'host memory' if layout.device == 'cpu' else 'host memory <-> NVMe drive'}"
                     f" over PCIe: gradients down, updated {'parameters' } up ({layout.offload} offloaded)")
    lines.append("a [cell] is one tensor-parallel group: it holds 1/tp of every matrix of its stage")
    return "\n".join(lines)
