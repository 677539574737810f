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
             f"{'':14s} comm/step  losses"]
    for stage, row in result["stages"].items():
        m, f = row["ranks"][0]["measured"], row["ranks"][0]["formula"]
        losses = " ".join(f"{x:.4f}" for x in row["losses"])
        lines.append(f"{stage:6s} {m['params']:>10,d} {m['grads']:>10,d} {m['optimizer']:>10,d}  "
                     f"{f['params']:,}/{f['grads']:,}/{f['optimizer']:,}".ljust(70)
                     + f" {row['comm_per_step_in_psi']:.2f} psi  {losses}")
    if "deepspeed" in result:
        lines.append("DeepSpeed engines, elements held by rank 0 (params / fp32 partition / optimizer states):")
        for stage, row in result["deepspeed"].items():
            h = row["ranks"][0]["held_elements"]
            losses = " ".join(f"{x:.4f}" for x in row["losses"])
            lines.append(f"  ZeRO-{stage}: {h['params']:>9,d} / {h['fp32_partition']:>9,d} / "
                         f"{h['optimizer_states']:>9,d}   losses {losses}")
    return "\n".join(lines)


def gather_counts_table(result: dict) -> str:
    """Per training step: ZeRO-3's module fetches, all-gathers, bytes gathered and releases, as a table."""
    lines = [f"ZeRO-3 on {result['ranks']} ranks, {result['model']} ({result['n_layers']} layers); "
             f"persistent (never sharded): {len(result['persistent'])} tensors",
             f"{'step':6s} {'fwd fetch':>9s} {'bwd fetch':>9s} {'fwd gathers':>11s} {'bwd gathers':>11s} "
             f"{'params':>7s} {'gathered':>10s} {'releases':>8s}"]
    for step, c in result["counts"].items():
        lines.append(f"{step:6s} {c['forward_fetches']:>9d} {c['backward_fetches']:>9d} "
                     f"{c['forward_all_gathers']:>11d} {c['backward_all_gathers']:>11d} {c['params_gathered']:>7d} "
                     f"{units.fmt(c['bytes_gathered'], 'MB'):>10s} {c['releases']:>8d}")
    return "\n".join(lines)
