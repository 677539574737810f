"""Chapter 02's diagrams and tables, rendered from the library's numbers and recorded runs."""

from gpumem import units
from gpumem.course.drawing import bar, box
from gpumem.memory import accounting, models

STAGE_NAMES = {0: "DDP (no sharding)", 1: "ZeRO-1: optimizer states sharded",
               2: "ZeRO-2: + gradients sharded", 3: "ZeRO-3: + parameters sharded"}


def zero_boxes(model: str = "llama-3-70b", gpus: int = 8, recipe: str = "mixed") -> str:
    """One box per stage: what one GPU holds, with the saving against DDP."""
    n = models.get(model).n_params()
    ddp = accounting.model_states(n, recipe, gpus, 0).total
    out = []
    for stage in range(4):
        s = accounting.model_states(n, recipe, gpus, stage)
        lines = [f"{name:10s}{units.fmt(v):>12s}  {bar(v, ddp, 30)}"
                 for name, v in (("params", s.params), ("grads", s.grads), ("optimizer", s.optimizer))]
        lines.append(f"{'per GPU':10s}{units.fmt(s.total):>12s}  saving vs DDP {1 - s.total / ddp:6.1%}")
        out.append(box(f"{STAGE_NAMES[stage]} — {model}, {recipe}, {gpus} GPUs", lines))
    return "\n".join(out)


def gather_sequence_box(events: list[dict], step: int = 1, phase: str = "forward", first: int = 24) -> str:
    """The recorded ZeRO-3 sequence: which module is fetched, what is all-gathered, what released."""
    lines, shown = [], 0
    current = None
    for e in events:
        if e["step"] != step:
            continue
        if e["event"] == "fetch":
            current = e["phase"]
        if current != phase or shown >= first:
            continue
        if e["event"] == "fetch":
            lines.append(f"run     {e['module']}")
        elif e["event"] == "all-gather":
            lines.append(f"  GATHER {', '.join(p.replace('.weight', '') for p in e['params'])} "
                         f"({units.fmt(e['bytes'], 'KB', 0)})")
        else:
            lines.append(f"  free   {e['params'][0].replace('.weight', '')}")
        shown += 1
    return box(f"ZeRO-3 {phase}, step {step}: the first {first} events on rank 0", lines)


def zero_results_table(result: dict) -> str:
    """Per stage: bytes one rank holds (measured vs formula), communication, losses."""
    lines = [f"{result['model']} on {result['ranks']} {result['device']} ranks, "
             f"{result['n_params']:,} parameters (fp32: 4 + 4 + 8 bytes each)",
             f"{'stage':6s} {'params':>10s} {'grads':>10s} {'optimizer':>10s}  formula (p/g/o)"
             f"{'':14s} comm/step  grad peak in backward  losses"]
    for stage, row in result["stages"].items():
        m, f = row["ranks"][0]["measured"], row["ranks"][0]["formula"]
        losses = " ".join(f"{x:.4f}" for x in row["losses"])
        lines.append(f"{stage:6s} {m['params']:>10,d} {m['grads']:>10,d} {m['optimizer']:>10,d}  "
                     f"{f['params']:,}/{f['grads']:,}/{f['optimizer']:,}".ljust(70)
                     + f" {row['comm_per_step_in_psi']:.2f} psi  "
                     f"{row['grad_peak_during_backward']['full_grads_and_shards']:>12,d} B  {losses}")
    if "deepspeed" in result:
        lines.append("DeepSpeed engines, elements held by rank 0 (params / fp32 partition / optimizer states):")
        for stage, row in result["deepspeed"].items():
            h = row["ranks"][0]["held_elements"]
            losses = " ".join(f"{x:.4f}" for x in row["losses"])
            lines.append(f"  ZeRO-{stage}: {h['params']:>9,d} / {h['fp32_partition']:>9,d} / "
                         f"{h['optimizer_states']:>9,d}   losses {losses}")
    return "\n".join(lines)


_COUNT_COLUMNS = (   # (header, second header line, width, value of a step's counts)
    ("fetches", "fwd", 7, lambda c: f"{c['forward_fetches']:,d}"),
    ("fetches", "bwd", 7, lambda c: f"{c['backward_fetches']:,d}"),
    ("calls", "in fwd", 7, lambda c: f"{c['forward_all_gathers']:,d}"),
    ("calls", "in bwd", 7, lambda c: f"{c['backward_all_gathers']:,d}"),
    ("calls", "for fwd", 7, lambda c: f"{c['all_gathers_for']['forward']:,d}"),
    ("calls", "for bwd", 7, lambda c: f"{c['all_gathers_for']['backward']:,d}"),
    ("tensors", "gathered", 8, lambda c: f"{c['params_gathered']:,d}"),
    ("bytes", "gathered", 8, lambda c: units.fmt(c["bytes_gathered"], "MB")),
    ("after step", "tensors", 10, lambda c: f"{c['after_step_params']:,d}"),
    ("tensors", "released", 8, lambda c: f"{c['releases']:,d}"),
)


def gather_counts_table(result: dict) -> str:
    """Per training step: ZeRO-3's module fetches, all-gather calls (by the pass that issues them
    and the pass whose use they serve), tensors and bytes gathered, the persistent parameters'
    gather after the optimizer step, and releases; one header per column, then what each means."""
    lines = [f"ZeRO-3 on {result['ranks']} ranks, {result['model']} ({result['n_layers']} layers); "
             f"persistent (kept whole): {len(result['persistent'])} tensors",
             f"{'':5s}" + "".join(f" {top:>{w}s}" for top, _, w, _ in _COUNT_COLUMNS),
             f"{'step':5s}" + "".join(f" {bottom:>{w}s}" for _, bottom, w, _ in _COUNT_COLUMNS)]
    for step, c in result["counts"].items():
        lines.append(f"{step:5s}" + "".join(f" {value(c):>{w}s}" for _, _, w, value in _COUNT_COLUMNS))
    lines += ["fetches: modules whose weights are gathered for use, per pass; calls: coalesced all-gather",
              "  calls, by the pass that issues them (in) and by the pass whose use they serve (for);",
              "  tensors and bytes: what those calls gather; after step: the persistent norms' one",
              "  all-gather after the optimizer step; released: tensors freed to a shard"]
    return "\n".join(lines)


def _vec(xs, cut: int | None = None) -> str:
    cells = [f"{x:g}".rjust(3) for x in xs]
    if cut:
        cells = [" ".join(cells[i:i + cut]) for i in range(0, len(cells), cut)]
        return "[" + " |".join(cells) + "]"
    return "[" + " ".join(cells) + "]"


def collectives_diagram(results: list[dict]) -> str:
    """The tensors a 2-rank run of the collectives returned, drawn: reduce-scatter then all-gather
    rebuilds what all-reduce gives, and each moves (N-1)/N of the tensor per rank."""
    world = len(results)
    width = len(results[0]["reduce_scatter"])
    lines = [f"{'':7s} {'input':{width * world * 4 + world}s}  reduce-scatter      all-gather of the shards"]
    for r in results:
        lines.append(f"rank {r['rank']}  {_vec(r['input'], width)}  ─► {_vec(r['reduce_scatter'])} "
                     f"(shard {r['rank']}) ─► {_vec(r['all_gather'], width)}")
    same = all(r["all_reduce"] == r["all_gather"] for r in results)
    lines += ["", "all-reduce of the same inputs, in one collective:"]
    lines += [f"rank {r['rank']}  {_vec(r['all_reduce'], width)}" for r in results]
    lines += [("equal to all-gather(reduce-scatter(x)) on every rank" if same else "DIFFERENT from all-gather"),
              "",
              "per rank, for a tensor of n elements on N ranks (ring algorithms):",
              "  reduce-scatter sends (N-1)/N x n, all-gather sends (N-1)/N x n,",
              "  all-reduce = both = 2 (N-1)/N x n;  the ZeRO paper counts these as n, n and 2n"]
    return box(f"all-reduce = reduce-scatter + all-gather ({world} ranks, gloo, measured)", lines)


_FLOW = {   # stage -> phase -> (what moves, what a rank holds with {own} = its shard, {all} = every shard)
    0: {"forward": ("", "P {all}  O {all}"), "backward": ("", "P {all}  G {all} (all built)"),
        "step": ("all-reduce G", "update P {all} with G {all}, O {all}")},
    1: {"forward": ("", "P {all}  O {own}"), "backward": ("", "P {all}  G {all} (all built)"),
        "step": ("reduce-scatter G, all-gather P", "G -> {own}; update P {own}, O {own}; P -> {all}")},
    2: {"forward": ("", "P {all}  O {own}"),
        "backward": ("reduce-scatter each G", "P {all}  G: each {all} -> {own} as it is ready"),
        "step": ("all-gather P", "update P {own}, O {own}; P -> {all}")},
    3: {"forward": ("all-gather each module", "P {own} (+ the running module's {all})  O {own}"),
        "backward": ("all-gather again, reduce-scatter G", "P {own} (+ module's {all})  G each -> {own}"),
        "step": ("", "update P {own}, O {own}")},
}


def stage_flow(ranks: int = 2) -> str:
    """Who holds which shard when: per stage and phase, what each rank holds (a, b, ... = the
    shard owned by rank 0, 1, ...) and which collective moves it."""
    letters = "abcdefgh"[:ranks]
    out = []
    for stage, phases in _FLOW.items():
        lines = []
        for phase, (moves, holds) in phases.items():
            lines.append(f"{phase:9s}{'moves: ' + moves if moves else 'moves: nothing'}")
            for r in range(ranks):
                lines.append(f"  rank {r}  " + holds.format(own=letters[r], all=letters))
        legend = (f"P params, G grads, O optimizer states; {', '.join(letters)} = the shard rank "
                  f"{', '.join(map(str, range(ranks)))} owns")
        out.append(box(STAGE_NAMES[stage], [legend, ""] + lines))
    return "\n".join(out)


def rank_major_box(sizes=(5, 3), world: int = 2) -> str:
    """The send buffer of one coalesced reduce-scatter (``gpumem.runs.zero.reduce_scatter_coalesced``):
    each gradient of ``sizes`` elements cut in ``world`` pieces of ceil(n / world), the last padded
    with zeros, and the pieces laid out rank-major, so rank r receives piece r of every gradient."""
    import math
    pieces = []
    for r in range(world):
        row = []
        for k, n in enumerate(sizes, 1):
            c = math.ceil(n / world)
            lo, hi = min(r * c, n), min((r + 1) * c, n)
            pad = c - (hi - lo)
            row.append(f"g{k}[{lo}:{hi}]" + (f" + {pad} zero{'s' if pad > 1 else ''}" if pad else ""))
        pieces.append(row)
    named = ", ".join(f"g{k} ({n} elements)" for k, n in enumerate(sizes, 1))
    flat = "| " + " | ".join(piece for row in pieces for piece in row) + " |"
    lines = [f"gradients {named}; {world} ranks", "", "flat buffer, in order:", "  " + flat, ""]
    lines += [f"  rank {r} receives the mean of: " + ", ".join(row) for r, row in enumerate(pieces)]
    return box("one coalesced reduce-scatter: the send buffer, rank-major", lines)


def loss_table(result: dict, reference: dict, rtol: float = 1e-4, atol: float = 1e-5) -> str:
    """The losses of every from-scratch and DeepSpeed run against one-process AdamW: each run's
    losses rounded to 2 decimals (a measured float differs between machines in its last digits)
    and whether all of them equal AdamW's within the tolerance a test also uses."""
    import math
    ref = reference["losses"]
    runs = [(f"ZeRO-{s} from scratch", r["losses"]) for s, r in result["stages"].items()]
    runs += [(f"DeepSpeed ZeRO-{s}", r["losses"]) for s, r in result.get("deepspeed", {}).items()]
    steps = "".join(f"{'step ' + str(i + 1):>8s}" for i in range(len(ref)))
    lines = [f"losses (mean over {result['ranks']} ranks), 2 decimals; 'equal': within rtol {rtol:g}, atol "
             f"{atol:g} of AdamW", f"{'run':24s}{steps}  vs one-process AdamW"]
    for name, losses in runs:
        same = all(math.isclose(x, y, rel_tol=rtol, abs_tol=atol) for x, y in zip(losses, ref))
        lines.append(f"{name:24s}" + "".join(f"{x:>8.2f}" for x in losses) + f"  {'equal' if same else 'DIFFERENT'}")
    lines.append(f"{'one process, AdamW':24s}" + "".join(f"{x:>8.2f}" for x in ref))
    return "\n".join(lines)
