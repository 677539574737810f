"""The chapter map, as data, so the README table and notebook 00 come from one place."""

CHAPTERS = [
    ("00", "setup", "—", "environment report, how the course works, a sample quiz"),
    ("01", "memory_anatomy", "scenario + 660 GB table", "recipes, activations, exact fake-tensor trace of Llama-3-70B"),
    ("02", "zero", "§1", "ZeRO 0-3 per-rank math, from scratch and real DeepSpeed on CPU ranks"),
    ("03", "activation_checkpointing", "§2", "saved tensors, recompute traces, policies, FLOP overhead"),
    ("04", "flash_attention", "§2 box", "naive vs SDPA memory, tiled online softmax from scratch"),
    ("05", "offload", "§3", "bandwidth ladder, real ZeRO-Offload and NVMe runs"),
    ("06", "combining_strategies", "§4 + summary", "the planner: 7B / 70B / 405B recipes"),
    ("07", "must_understand", "checklist", "graded quiz over the six must-understand items"),
    ("08", "finetuning", "§3 single-GPU rule", "8-bit AdamW, LoRA, QLoRA by role; real peft/bitsandbytes CPU runs"),
]


def chapter_map(width: int = 100) -> str:
    """A fixed-width table of the chapters, no line over ``width`` characters (what runs wraps)."""
    import textwrap
    lines = [f"{'#':3s} {'notebook':28s} {'note':24s} what runs"]
    indent = " " * 58
    for num, stem, note, what in CHAPTERS:
        head = f"{num:3s} {num + '_' + stem:28s} {note:24s} "
        wrapped = textwrap.wrap(what, width - len(indent))
        lines.append(head + wrapped[0])
        lines += [indent + rest for rest in wrapped[1:]]
    return "\n".join(lines)
