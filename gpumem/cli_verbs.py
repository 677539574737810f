"""The verbs ``estimate``, ``trace`` and ``run`` of ``python -m gpumem``.

``estimate`` uses only the torch-free formulas, so it answers in well under a second; ``trace``
imports torch when it traces; ``run`` finds experiments through the chapter registry.
"""

import argparse
import json
import re
import textwrap

from . import units
from .errors import UsageError
from .memory import accounting, finetune_options
from .memory.policies import ADAMW_IMPLS, KERNELS, NORMS, POLICIES

_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

# Upper bounds: generous for a learner, small enough that every verb answers in seconds without
# overflow. A count above its bound is a typo, refused with one line (exit 2).
MAX_PARAMS = 10**15        # 1,000T: over 2,000 x Llama 3.1 405B, the largest open dense model
MAX_SEQ = 2**24            # 16,777,216 tokens: 128 x Llama 3.1's 128k context window
MAX_TOKENS = 2**24         # seq x micro-batch: beyond it torch's fake tensors overflow int64 sizes
BOUNDS = {                 # positive(NAME)'s bound; NAME not listed: DEFAULT_BOUND
    "--gpus": 10**6,           # 1,000,000: ~10 x the largest published training cluster
    "--micro-batch": 2**16,    # 65,536 sequences on one GPU (and seq x micro-batch <= 2^24)
    "--global-batch": 2**24,   # 16,777,216 sequences: thousands of times Llama 3's 4M-16M tokens
    "--top": 10_000,           # plans shown
    "--ranks": 64,             # one machine's processes (CPU runs accept 1 to 8)
}
DEFAULT_BOUND = 10**6


def _bounded(parse, most: int):
    parse.bound = most        # read by gpumem.cli, which states the bound in each option's help
    return parse


def positive(name: str, most: int | None = None):
    """An argparse type for option ``name``: whole numbers from 1 to ``most`` (default
    ``BOUNDS[name]``), with an error naming the option and the bound."""
    most = most or BOUNDS.get(name, DEFAULT_BOUND)

    def parse(text: str) -> int:
        return _count(text.strip().lstrip("+") if re.fullmatch(r"\s*\+?[0-9]+\s*", text) else "",
                      name, {"": 1}, most, False, f"{name} must be a positive integer", shown=text)
    return _bounded(parse, most)


def _count(text: str, name: str, scale: dict, most: int, exponent: bool, forms: str, shown=None) -> int:
    shown = text if shown is None else shown
    try:
        value = units.parse_count(text, scale, most, exponent)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{name} {units.shown(shown)} is too large; accepted: "
                                         f"1 to {units.bound_text(most)}") from None
    if value is None:
        raise argparse.ArgumentTypeError(f"{forms} up to {units.bound_text(most)}, got {units.shown(shown)}")
    return value


def param_count(text: str) -> int:
    """Parameter counts: 8030261248, 7.5e9, 70B, 70.55B, 405.85b, 125M (K, M, B, T are 10^3..10^12),
    at most :data:`MAX_PARAMS`."""
    return _count(text, "--params", _DECIMAL, MAX_PARAMS, True,
                  "--params must be a positive count such as 70B, 8.03B, 7.5e9 or 8030261248")


def seq_length(text: str) -> int:
    """Sequence lengths: 4096, 4k, 8K, 32k (k = 1024 tokens, as context lengths are named), at most
    :data:`MAX_SEQ`. Exactly the forms the help names: digits with an optional k, no exponent."""
    plain = re.fullmatch(r"\s*[0-9]+\s*[kK]?\s*", text)
    return _count(text if plain else "", "--seq", {"": 1, "K": 1024}, MAX_SEQ, False,
                  "--seq must be a positive whole number of tokens such as 4096, 4k or 8K (k = 1024)",
                  shown=text)


def layer_count(text: str) -> int:
    """The largest module's parameter count, written as --params is (e.g. 1.05B)."""
    return _count(text, "--largest-layer", _DECIMAL, MAX_PARAMS, True,
                  "--largest-layer must be a positive count such as 1.05B or 1050673152")


for _parse, _most in ((param_count, MAX_PARAMS), (seq_length, MAX_SEQ), (layer_count, MAX_PARAMS)):
    _bounded(_parse, _most)


def _model_args(p, activation_opts: bool = True) -> None:
    p.add_argument("--model", help="llama-3-8b, llama-3-70b, llama-3.1-405b, tiny, mini")
    p.add_argument("--recipe", default="mixed", choices=accounting.RECIPES)
    if activation_opts:  # default None, so that --params with any of them can be refused
        p.add_argument("--seq", type=seq_length, default=None, help="sequence length: 4096, 4k, 8K (4096)")
        p.add_argument("--micro-batch", type=positive("--micro-batch"), default=None,
                       help="sequences per micro-batch (1); seq x micro-batch: 2^24 tokens or fewer")
        p.add_argument("--checkpoint", choices=POLICIES, default=None, help="(none)")
        p.add_argument("--attention", choices=KERNELS, default=None, help="(flash)")
        p.add_argument("--norm", choices=NORMS, default=None,
                       help="RMSNorm: fused kernel, or Hugging Face's eager LlamaRMSNorm (fused)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(sub, run_options: bool = False) -> None:
    """Add the ``estimate``, ``trace`` and ``run`` verbs to the command line's subparsers
    (with each experiment's own options when ``run_options``: they import its chapter)."""
    p = sub.add_parser("estimate", help="per-GPU and host memory of a training step (formulas)")
    _model_args(p)
    p.add_argument("--config", default=None,
                   help="a Hugging Face config.json (or a shipped one: qwen2.5-72b, mixtral-8x7b, ...)")
    p.add_argument("--params", type=param_count, help="parameter count only (model states): 70B, 7.5e9")
    p.add_argument("--largest-layer", type=layer_count, default=None,
                   help="with --params and --zero 3: the largest module's parameters, for the working set")
    p.add_argument("--gpus", type=positive("--gpus"), default=1)
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0)
    p.add_argument("--offload", choices=accounting.OFFLOADS, default="none")
    p.add_argument("--offload-device", choices=accounting.DEVICES, default="cpu")
    finetune_options.add_options(p)
    p.set_defaults(func=_estimate)

    p = sub.add_parser("trace", help="the same step executed on fake tensors (exact bytes)")
    _model_args(p)
    p.add_argument("--full", action="store_true", help="trace every layer (slow) instead of composing")
    p.add_argument("--config", default=None,
                   help="trace transformers' own model for a config.json (or a shipped one: qwen3-8b, ...)")
    p.add_argument("--layers", type=positive("--layers"), default=None,
                   help="with --config: trace this many layers (the config's depth)")
    p.add_argument("--adamw", choices=ADAMW_IMPLS, default="for-loop",
                   help="torch AdamW code path for pure-bf16 and fp32 (for-loop)")
    finetune_options.add_options(p)     # with --config: peft's LoRA, bitsandbytes' NF4 (memory.lora_trace)
    p.set_defaults(func=_trace)

    from .chapters import CHAPTERS
    from .course.registry import resolve
    p = sub.add_parser("run", help="run a chapter's experiment on CPU ranks (or GPUs)")
    runs = p.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True,
                            parser_class=type(p))
    for chapter in CHAPTERS:
        for exp in chapter.experiments:
            q = runs.add_parser(exp.name, help=exp.about, description=exp.about)
            q.add_argument("--ranks", type=positive("--ranks"), default=2)
            q.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
            q.add_argument("--model", default=None, help="a registry model (default: the experiment's own)")
            q.add_argument("--json", action="store_true", help="print one JSON object")
            q.add_argument("--verbose", action="store_true", help="on a failed run, also print the rank's traceback")
            common = {a.dest for a in q._actions}
            if exp.options and run_options:
                resolve(chapter.target(exp.options))(q)
            q.set_defaults(func=_run, _options=sorted({a.dest for a in q._actions} - common))


def _activation_options(args) -> dict:
    given = {k: v for k, v in [("--seq", args.seq), ("--micro-batch", args.micro_batch),
                               ("--checkpoint", args.checkpoint), ("--attention", args.attention),
                               ("--norm", args.norm)]
             if v is not None}
    tokens = (args.seq or 4096) * (args.micro_batch or 1)
    if tokens > MAX_TOKENS:
        raise UsageError(f"--seq {args.seq or 4096:,} x --micro-batch {args.micro_batch or 1:,} is {tokens:,} "
                         f"tokens per micro-batch; accepted: at most {MAX_TOKENS:,} (2^24)")
    return given


def _estimate(args) -> int:
    from .memory.estimate import estimate
    given = _activation_options(args)
    if args.params is not None and given:
        raise UsageError(f"--params counts model states only; drop {', '.join(given)} or use --model")
    from .memory import hf_config
    if args.config is not None and (args.model is not None or args.params is not None):
        raise UsageError("give one of --model NAME, --config PATH or --params N")
    if args.model is not None and args.model in hf_config.SHIPPED:
        args.config, args.model = args.model, None
    if args.params is None and args.model is None and args.config is None:
        raise UsageError("give --model NAME, --config PATH or --params N")
    kwargs = {"largest_layer": args.largest_layer} if args.params is not None else {
        "seq": args.seq or 4096, "micro_batch": args.micro_batch or 1,
        "checkpoint": args.checkpoint or "none", "attention": args.attention or "flash",
        "norm": args.norm or "fused"}
    if args.params is None and args.largest_layer is not None:
        raise UsageError("--largest-layer goes with --params; a --model knows its largest layer")
    ft = finetune_options.from_args(args, args.zero, args.recipe)     # checked before the model loads
    model = hf_config.load(args.config) if args.config is not None else args.model
    est = estimate(model=model, params=args.params, gpus=args.gpus, zero=args.zero, recipe=args.recipe,
                   offload=args.offload, offload_device=args.offload_device, finetune=ft, **kwargs)
    if args.json:
        print(json.dumps(est.as_dict()))
        return 0
    d = est.as_dict()
    print(f"{d['model']}: {d['n_params'] / 1e9:.2f} B parameters"
          + (f" ({model.model_type}, from {args.config})" if args.config else ""))
    print(f"recipe {d['recipe']}, {d['gpus']} GPU(s), ZeRO-{d['zero']}"
          + (f", seq {d['seq']} x micro-batch {d['micro_batch']}, checkpoint {d['checkpoint']}, "
             f"attention {d['attention']}" if est.acts else ", model states only"))
    for key in ("params", "grads", "optimizer", "activations") + ("gathered",) * (d["zero"] == 3) + ("total",):
        if key == "activations" and not est.acts:
            print(f"  {key:12s} not counted" + (" (model states only)" if args.params is not None else ""))
            continue
        print(f"  {key:12s} {units.fmt_both(d['per_gpu'][key])}"
              + ("  ZeRO-3 working set:" if key == "gathered" and "gathered_parts" in d else ""))
        for part, value in (d.get("gathered_parts", {}).items() if key == "gathered" else ()):
            print(f"    {part:44s} {units.fmt(value)}")
    for key in (k for k in ("host", "nvme") if k in d):
        print(f"  {key + ' (per GPU)':12s} {units.fmt_both(d[key])}")
    for line in finetune_options.render(d, units.fmt_both):
        print(line)
    for note in d.get("notes", []):
        print(textwrap.fill(note, 100, initial_indent="  note: ", subsequent_indent="        "))
    return 0


def _trace(args) -> int:
    from .memory import hf_config, models
    if args.model is not None and args.model in hf_config.SHIPPED and args.config is None:
        args.config, args.model = args.model, None
    if args.config is not None:
        return _trace_config(args)
    if args.model is None:
        raise UsageError("trace needs --model NAME or --config PATH")
    if args.layers is not None:
        raise UsageError("--layers goes with --config (a registry --model is traced at its depth)")
    finetune_options.registry_trace(args)        # mistakes are answered before torch loads (seconds)
    _activation_options(args)
    if args.recipe in ("mixed", "mixed-ds") and args.adamw != "for-loop":   # gpumem.memory.optim's rule
        raise UsageError(f"AdamW implementation {args.adamw!r} applies to the pure-bf16 and fp32 recipes "
                         "(torch.optim.AdamW); mixed and mixed-ds accept: for-loop")
    from .memory import tracing
    kwargs = dict(recipe=args.recipe, kernel=args.attention or "flash", policy=args.checkpoint or "none",
                  seq=args.seq or 4096, micro_batch=args.micro_batch or 1, norm=args.norm or "fused", adamw=args.adamw)
    tr = tracing.trace_step(args.model, **kwargs) if args.full else tracing.trace_fast(args.model, **kwargs)
    if args.json:
        print(json.dumps(tr.as_dict()))
        return 0
    print(f"{tr.model}: one training step traced on fake tensors ({tr.method}, {tr.seconds:.1f} s)")
    for name, value in tr.peaks.items():
        print(f"  {name:12s} peak {units.fmt_both(value):26s} at {tr.peak_moments[name]}")
    print(f"  {'total':12s} peak {units.fmt_both(tr.total_peak):26s} at {tr.total_peak_moment}")
    return 0


def _trace_config(args) -> int:
    """``trace --config``: transformers' own model (``memory.hf_trace``), beside the formula."""
    from dataclasses import replace
    from .memory import hf_config
    if args.model is not None:
        raise UsageError("give one of --model NAME or --config PATH")
    cfg = hf_config.load(args.config)            # every mistake below is answered before torch loads
    _activation_options(args)
    if (args.checkpoint or "none") != "none" or (args.norm or "hf") != "hf" or args.attention == "naive":
        raise UsageError("trace --config runs transformers' code as it is: accepted --checkpoint none, "
                         "--norm hf, --attention flash (sdpa) or eager")
    if args.recipe in ("mixed", "mixed-ds") and args.adamw != "for-loop":
        raise UsageError(f"AdamW implementation {args.adamw!r} applies to the pure-bf16 and fp32 recipes")
    if cfg.positions and (args.seq or 4096) > cfg.positions:
        raise UsageError(f"--seq {args.seq or 4096} is longer than {cfg.name}'s {cfg.positions} learned positions")
    ft = finetune_options.from_args(args, 0, args.recipe)     # chapter 08's options, checked before torch loads
    if cfg.moe:   # experts: the trace, the formula and the routing stated
        from .memory import moe_summary
        return moe_summary.cli(args, cfg, ft)
    from .memory import hf_trace, lora_trace
    if ft is not None:
        return lora_trace.cli(args, cfg, ft)
    attention, seq, mb = "eager" if args.attention == "eager" else "sdpa", args.seq or 4096, args.micro_batch or 1
    tr = hf_trace.trace_hf(args.config, seq, mb, attention, args.recipe, args.layers, adamw=args.adamw)
    cfg = replace(cfg, n_layers=args.layers or cfg.n_layers)
    formula = hf_trace.formula_activations(cfg, seq, mb, attention, args.recipe)
    if args.json:
        print(json.dumps(tr.as_dict() | {"attention_impl": attention, "layers": cfg.n_layers, "formula_activations": formula}))
        return 0
    print("\n".join(hf_trace.summary(tr, cfg, attention, formula)))
    return 0


def _run(args) -> int:
    from . import chapters
    from .memory import models
    least = chapters.experiments()[args.experiment][1].min_ranks            # a sharding proof needs 2
    if args.ranks < least or (args.ranks > 8 and args.device == "cpu"):
        raise UsageError(f"--ranks {args.ranks} is too {'few' if args.ranks < least else 'many'} for "
                         f"{args.experiment} on {args.device.upper()} ranks; accepted: {least} to 8")
    kwargs = {"ranks": args.ranks, "device": args.device, "progress": not args.json}
    if args.model is not None:
        cfg = models.get(args.model)
        if args.device == "cpu" and not cfg.teaching:   # a billion-parameter model on CPU ranks swaps for hours
            raise UsageError(f"--model {cfg.name} is too large for CPU ranks; accepted with --device cpu: "
                             f"{', '.join(m.name for m in models.REGISTRY.values() if m.teaching)}")
        kwargs["model"] = cfg.name
    if getattr(args, "_check_options", None):     # an experiment's checks across its options (torch-free)
        args._check_options(args)
    kwargs.update({name: getattr(args, name) for name in args._options})
    import torch
    if args.device == "cuda" and torch.cuda.device_count() == 0:
        raise UsageError("--device cuda needs a CUDA GPU; this machine has none (accepted here: --device cpu)")
    if args.device == "cuda" and args.ranks > torch.cuda.device_count():
        raise UsageError(f"--ranks {args.ranks} needs {args.ranks} GPUs; this machine has "
                         f"{torch.cuda.device_count()} (use --device cpu for CPU ranks)")
    result = chapters.run_experiment(args.experiment, **kwargs)
    if args.json:
        print(json.dumps(result))
        return 0
    print(chapters.render_experiment(args.experiment, result))
    return 0
