"""``plan`` with chapter 08's options (``--adapter lora``, ``--base-dtype nf4``, ``--optimizer
adamw-8bit``, ...): the fine-tuning layouts that fit, ranked (``gpumem.planner.finetune``), as a
table and the top plan's bytes by role, seconds by term and switches (peft, bitsandbytes, the
Trainer, with DeepSpeed's or FSDP's config inside); ``--json``: one object (``FtResult.as_dict``)."""

import json

from . import units
from .errors import UsageError
from .memory.finetune_options import ROLE_LABELS


def run(args, model, gpu: str, mem: int | None, ft) -> int:
    """Plan ``ft`` for ``plan``'s arguments; print a table or JSON."""
    from .planner import finetune as P
    if args.layout is not None:         # --layout prices full-training layouts
        raise UsageError("--layout evaluates full-training layouts; with --adapter lora or --optimizer adamw-8bit "
                         "leave it out (the fine-tuning search lists every layout it tried that fits)")
    if args.recipe == "both":
        raise UsageError("--recipe both plans full training's two recipes; with fine-tuning options give one "
                         "(--recipe mixed, or pure-bf16 with --adapter none)")
    result = P.plan(model, ft, args.gpus, gpu, gpu_mem=mem, seq=args.seq, global_batch=args.global_batch,
                    cpu_adam_rate=args.cpu_adam_rate, pcie=args.pcie)
    if args.json:
        print(json.dumps(result.as_dict(args.top)))
    else:
        print("\n".join(render(result, args.top)))
    return 0


def _what(ft: dict) -> str:
    """The setup in words: ``QLoRA r=16 on q,k,... (adamw)``."""
    if ft["adapter"] == "none":
        return f"full fine-tuning ({ft['recipe']}, {ft['optimizer']})"
    kind = "QLoRA" if ft["base_dtype"] == "nf4" else "LoRA"
    return f"{kind} r={ft['lora_rank']} on {','.join(ft['lora_targets'])} ({ft['optimizer']})"


def render(result, top: int = 10) -> list[str]:
    """The readable answer: the question, ranked layouts, the best one's breakdown and switches."""
    q = result.question
    lines = [f"{_what(q['finetune'])}: {q['model']} on {q['gpus']} x {q['gpu']} (usable "
             f"{units.fmt(q['usable'])} of {units.fmt(q['capacity'])} each), seq {q['seq']:,}, global batch "
             f"{q['global_batch']:,}: {len(result.plans):,} of {result.considered:,} layouts fit"]
    if result.plans:
        lines.append(f"{'#':>2s}  {'layout':44s} {'GB/GPU':>7s} {'free':>11s} {'host/GPU':>8s} {'step s':>8s} "
                     f"{'tok/s':>9s}  bound")
        for i, p in enumerate(result.distinct(top), 1):
            m = p.memory
            free = f"{m['headroom'] / 1e9:.1f}" + (" tight" if m["tight"] else "")
            lines.append(f"{i:>2d}  {p.layout.label():44s} {m['total'] / 1e9:>7.1f} {free:>11s} "
                         f"{m['host'] / 1e9:>8.1f} {p.time['total']:>8.2f} {p.tokens_per_s:>9,.0f}  {p.time['bound']}")
        lines += ["    mb: sequences a micro-batch; x N: micro-batches a step (gradient accumulation); ranked by step",
                  "    time; within 0.5 % of the fastest remaining: roomy first, then fewer host bytes", ""]
        lines += breakdown(result.best)
    else:
        c = result.closest
        if not result.considered:
            lines.append(f"no layout runs it: the global batch ({q['global_batch']:,}) must be a multiple of the "
                         f"GPU count ({q['gpus']:,}); set --global-batch")
        else:
            lines.append("nothing fits" + (f"; the closest layout, {c['label']}, misses by "
                                           f"{units.fmt(c['missing'])} per GPU" if c else
                                           " (every layout needs more host memory than the node has)"))
            lines.append("  try: --base-dtype nf4 with --adapter lora (QLoRA), more GPUs, a shorter --seq, or "
                         "full training's planner (without the fine-tuning options) for tensor and pipeline "
                         "parallelism")
    lines += [f"assumption: {s}" for s in result.assumptions]
    return lines


def breakdown(p) -> list[str]:
    """The best plan's bytes by role, seconds by term, and its switches, a line each."""
    m = p.memory
    out = [f"best: {p.layout.label()} ({p.layout.framework})"]
    out += [f"  memory {ROLE_LABELS[k]:40s} {units.fmt(v):>10s}" for k, v in m["roles"].items()
            if v and not (p.layout.base_on_cpu and k not in ("quant_constants", "dequant_buffer"))]
    for k, label in (("working", "FSDP: root + two blocks gathered"), ("buffers", "DeepSpeed buckets"),
                     ("activations", "activations (peak)"), ("total", "total on the GPU"),
                     ("host", "host memory (the shards)")):
        if m[k]:
            out.append(f"  memory {label:40s} {units.fmt(m[k]):>10s}")
    out += [f"  time {k:20s} {v:>10.2f} s" for k, v in p.time.items() if isinstance(v, float)
            and not k.endswith("_moved_s")]
    for k in ("peft", "bitsandbytes", "trainer"):
        if p.configs[k] is not None:
            out.append(f"{k}: {json.dumps(p.configs[k])}")
    return out
