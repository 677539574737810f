"""The ``plan`` verb of ``python -m gpumem``: ranked layouts that fit, from the torch-free planner.

``python -m gpumem plan --model llama-3-70b --gpus 8 --gpu H100-80GB --seq 4096 --json`` prints
one JSON object (``gpumem.planner.Result.as_dict``); without ``--json`` a table of the
best layout of each kind, then the top plan's memory and time breakdown and its DeepSpeed
config. ``--layout tp=8,pp=16,dp=8,zero=1,...`` also evaluates that layout
(``gpumem.planner.evaluate``): fits or why not, its rank among the fitting plans, its breakdown
(``--json``: a ``layout_result`` object beside the plan's keys). GPU names are matched without
regard to case (``H100-80GB`` is ``h100-80gb``). ``--recipe`` plans mixed precision unless
pure bf16 is asked for (``pure-bf16`` or ``both``; its rounding risk is printed as a note);
``--cpu-adam-rate`` sets the parameters/s a node's CPU Adam updates (shared by its ranks). The
table's ``free`` column is the headroom, marked ``tight`` under max(5 GB, 6 % of usable).
Chapter 08's options (``--adapter lora``, ``--lora-rank``, ``--lora-targets``, ``--base-dtype nf4``,
``--optimizer adamw-8bit``/``paged-adamw``) plan fine-tuning layouts instead (``cli_plan_ft``).
"""

import argparse
import json

from . import units
from .cli_verbs import BOUNDS, positive, seq_length
from .errors import UsageError
from .memory import finetune_options
from .planner.stage_split import split_text


def register(sub) -> None:
    """Add the ``plan`` verb to the command line's subparsers."""
    p = sub.add_parser("plan", help="ranked training layouts that fit, with memory, time and a DeepSpeed config")
    p.add_argument("--model", default=None, help="llama-3-8b, llama-3-70b, llama-3.1-405b, tiny, mini, or a "
                                                  "shipped config's name (qwen2.5-72b, mistral-7b-v0.1, ...)")
    p.add_argument("--config", default=None, help="a Hugging Face config.json instead of --model (dense, or a "
                                                   "mixture of experts: expert parallelism ep is then searched)")
    p.add_argument("--gpus", type=positive("--gpus"), required=True, help="GPU count")
    p.add_argument("--gpu", default=None, help="a GPU of the course's table (speeds and capacity): "
                                                "a100-40gb, a100-80gb, h100-80gb, h200, l4, t4 (h100-80gb)")
    p.add_argument("--gpu-mem", default=None, help="capacity per GPU instead of the table's, e.g. 80GB, 80GiB")
    p.add_argument("--seq", type=seq_length, default=4096, help="sequence length: 4096, 4k (4096)")
    p.add_argument("--global-batch", type=positive("--global-batch"), default=None,
                   help="sequences per step (4M tokens' worth; with the fine-tuning options: 16)")
    p.add_argument("--top", type=positive("--top"), default=10, help="plans shown (10)")
    p.add_argument("--recipe", default="mixed", choices=("mixed", "pure-bf16", "both"),
                   help="precision recipes planned: mixed (fp32 master weights; the default), pure-bf16 "
                        "(no master copy: smaller, but updates under half a bf16 ULP are lost), or both")
    p.add_argument("--cpu-adam-rate", type=_rate, default=None,
                   help="parameters/s one node's CPU Adam updates, shared by its ranks, e.g. 1.2e9 "
                        "(default: the published achieved rate the assumptions line names)")
    p.add_argument("--pcie", type=_pcie, default=None,
                   help="host-to-GPU bytes/s for the fine-tuning search's base on the CPU, e.g. 55.2e9 (a "
                        "measured link; default: the --gpu's datasheet PCIe)")
    p.add_argument("--layout", default=None,
                   help="evaluate one layout too, e.g. tp=8,pp=16,dp=8,zero=1,ckpt=selective,mb=1 "
                        "(keys: tp pp dp zero ckpt mb attn recipe offload device vp cp ep; vp, cp, ep: 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    finetune_options.add_options(p)     # fine-tuning layouts instead (gpumem.planner.finetune, cli_plan_ft)
    p.epilog = ("With --adapter lora, --base-dtype nf4 or --optimizer adamw-8bit/paged-adamw, plan searches "
                "fine-tuning layouts instead: data parallelism under DeepSpeed ZeRO 0-2 or FSDP2, the frozen base "
                "on the CPU, checkpointing and micro-batch (tp = pp = 1); --gpu-mem changes the capacity only, "
                "the speeds stay the --gpu's.")
    p.set_defaults(func=_plan)


def _number(option: str, unit: str, example: str, least: float = 0.0):
    """An argparse type for ``option``: a finite number above ``least`` (one line naming ``unit``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (least < value < float("inf")):
            raise argparse.ArgumentTypeError(f"{option} must be {unit}, e.g. {example}, got {text!r}")
        return value
    return parse


_rate = _number("--cpu-adam-rate", "a positive number of parameters/s per node", "1.2e9")
_pcie = _number("--pcie", "bytes/s above 1e6", "55.2e9", 1e6)


def _gpu_name(text: str | None) -> str:
    from .memory import gpus
    if text is None:
        return "h100-80gb"
    name = text.strip().lower()
    if name not in gpus.REGISTRY:
        raise UsageError(f"unknown GPU {text!r}; accepted: {', '.join(gpus.REGISTRY)}")
    return name


def _model(args):
    """The model ``plan`` is asked about: a registry name, or a ModelConfig read from ``--config``
    or from a shipped config named by ``--model``. A mixture of experts is planned with expert
    parallelism (``ep``) as a lever and its all-to-all priced (``gpumem.planner.moe``)."""
    from .memory import hf_config, models
    if (args.model is None) == (args.config is None):
        raise UsageError("give one of --model NAME or --config PATH")
    if args.model is not None and args.model not in hf_config.SHIPPED:
        models.get(args.model)
        return args.model
    return hf_config.load(args.config or args.model)


def _plan(args) -> int:
    from . import planner
    model = _model(args)
    gpu = _gpu_name(args.gpu)
    mem = units.parse_size(args.gpu_mem, "--gpu-mem") if args.gpu_mem is not None else None
    ft = finetune_options.from_args(args, 0, "mixed" if args.recipe == "both" else args.recipe)
    if ft is not None and not ft.plain:      # LoRA, QLoRA, or full fine-tuning with 8-bit AdamW
        from . import cli_plan_ft
        return cli_plan_ft.run(args, model, gpu, mem, ft)
    if args.pcie is not None:
        raise UsageError("--pcie goes with the fine-tuning search (--adapter lora, --base-dtype nf4, --optimizer "
                         "adamw-8bit or paged-adamw); full training's links come from the --gpu")
    fields = planner.parse_layout(args.layout) if args.layout is not None else None   # bad keys before the search
    recipes = ("mixed", "pure-bf16") if args.recipe == "both" else (args.recipe,)
    result = planner.plan(model, args.gpus, gpu, gpu_mem=mem, seq=args.seq, global_batch=args.global_batch,
                          recipes=recipes, cpu_adam_rate=args.cpu_adam_rate)
    if (result.advice or {}).get("nearest"):      # suggest only batches --global-batch accepts
        result.advice["nearest"] = [b for b in result.advice["nearest"] if b <= BOUNDS["--global-batch"]]
    given = None
    if fields is not None:
        given = planner.evaluate(model, args.gpus, fields, gpu, result=result, cpu_adam_rate=args.cpu_adam_rate)
    if args.json:
        out = result.as_dict(args.top)
        if given is not None:
            out["layout_result"] = given.as_dict()
        print(json.dumps(out))
        return 0
    print(render(result, args.top))
    if given is not None:
        print("\n" + "\n".join(render_layout(given)))
    return 0


def render_layout(r) -> list[str]:
    """The given layout's lines: fits or why not, its rank, then its memory and time breakdown."""
    p = r.plan
    head = f"your layout: {p.layout.label()} ({p.layout.framework})"
    if r.fits:
        vs = f", {p.time['total'] / r.best.time['total']:.3f} x the top plan's {r.best.time['total']:.2f} s" \
            if r.best else ""
        state = f"  fits; rank {r.rank:,} of {r.fitting:,} fitting layouts; {p.time['total']:.2f} s per step{vs}"
    else:
        state = "  does not fit: " + "; ".join(r.why_not)
    return [head, state, f"  {p.tokens_per_s:,.0f} tokens/s"] + breakdown(p, "layout")[1:]


def render(result, top: int = 10) -> str:
    """The readable table: question, ranked distinct plans, the best plan's breakdowns, or advice."""
    q = result.question
    lines = [f"{q['model']} on {q['gpus']} x {q['gpu']} (usable {units.fmt(q['usable'])} of "
             f"{units.fmt(q['capacity'])} each), seq {q['seq']:,}, global batch {q['global_batch']:,}: "
             f"{len(result.plans):,} layouts fit"]
    if result.plans:
        lines.append(f"{'#':>2s}  {'layout':72s} {'framework':18s} {'GB/GPU':>7s} {'free':>11s} {'step s':>8s} "
                     f"{'tok/s':>9s}  bound")
        for i, p in enumerate(result.distinct(top), 1):
            free = f"{p.memory['headroom'] / 1e9:.1f}" + (" tight" if p.memory["tight"] else "")
            lines.append(f"{i:>2d}  {p.layout.label():72s} {p.layout.framework:18s} {p.memory['total'] / 1e9:>7.1f} "
                         f"{free:>11s} {p.time['total']:>8.1f} {p.tokens_per_s:>9,.0f}  {p.time['bound']}")
        lines.append(f"    ranked by step time; plans within {planner_tie():.1%} of the fastest remaining plan tie, and a")
        lines.append(f"    tie goes roomy first (tight: under {q['tight_below'] / 1e9:.1f} GB free), then fewer bytes "
                     "offloaded, fewer pp x cp, fewer bytes")
        uneven = {p.layout.pp: p.stages for p in result.distinct(top) if len(set(p.stages)) > 1}
        for pp, split in sorted(uneven.items()):
            lines.append(f"    pp{pp}: {sum(split)} layers split {split_text(split)} (the stages at the ends "
                         f"take the shortfall, the first stage first, as Llama 3 does)")
        lines.append("")
        lines += breakdown(result.best)
        if result.best.megatron:
            engine = "Megatron-Core" if result.best.layout.framework == "megatron-core" else "Megatron-DeepSpeed"
            lines.append(f"{engine} arguments: " + " ".join(result.best.megatron))
        ds = result.best.deepspeed
        none = ("none (Megatron-Core runs without DeepSpeed)" if result.best.layout.framework == "megatron-core"
                else "none (DeepSpeed 0.19.8 removed MiCS; run HSDP with FSDP2)")
        lines.append("DeepSpeed config: " + (json.dumps(ds) if ds is not None else none))
        fsdp = result.best.fsdp
        lines.append("FSDP equivalent: " + (json.dumps(fsdp) if fsdp else "none (FSDP has no such layout)"))
    elif (result.advice or {}).get("nearest") is not None:
        a = result.advice
        dps = ", ".join(f"{d:,}" for d in a["data_parallel"][:6]) + (", ..." if len(a["data_parallel"]) > 6 else "")
        lines.append(f"no layout runs a global batch of {a['global_batch']:,} sequences: dp x micro-batch x "
                     f"accumulation must equal it,")
        lines.append(f"  and no data-parallel degree here divides it (dp: {dps})")
        near = " or ".join(f"{b:,}" for b in a["nearest"]) or "none found"
        lines.append(f"  nearest global batches that run and fit: {near} (--global-batch)")
    else:
        a = result.advice or {}
        lines.append(f"nothing fits; the closest layout, {a.get('closest')}, misses by "
                     f"{units.fmt(a.get('missing') or 0)} per GPU")
        for c in a.get("changes", []):
            lines.append(f"  fits with {c['change']}: {c['value']} ({c['layout']})")
    lines += [f"note: {s}" for s in result.notes]
    lines += [f"assumption: {s}" for s in result.assumptions]
    return "\n".join(lines)


def planner_tie() -> float:
    """The ranking's tie band (0.5 %), read from the planner."""
    from .planner.ranking import TIE
    return TIE


def breakdown(p, name: str = "best") -> list[str]:
    """One plan's per-GPU memory and time, one part a line (``name`` heads the first line)."""
    out = [f"{name}: {p.layout.label()} ({p.layout.framework})"]
    if p.layout.pp > 1:
        out.append(f"  pipeline: {p.layout.pp} stages of {split_text(p.stages)} layers; memory counted for "
                   f"stage {p.memory['stage']} ({p.memory['stage_layers']} layers), the fullest")
    for k in ("params", "grads", "optimizer", "zero3_working_set", "buffers", "activations", "total"):
        out.append(f"  memory {k:18s} {units.fmt(p.memory[k]):>10s}")
    for k in ("host", "nvme"):
        if p.memory[k]:
            out.append(f"  {k} per GPU {'':12s} {units.fmt(p.memory[k]):>10s}")
    for k, v in p.time.items():
        if isinstance(v, float) and k not in ("data_parallel_moved_s",):
            out.append(f"  time {k:20s} {v:>10.2f} s")
    return out
