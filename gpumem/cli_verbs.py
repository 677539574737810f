"""The verbs ``estimate``, ``trace`` and ``run`` of ``python -m gpumem``.

``estimate`` uses only the torch-free formulas, so it answers in well under a second; ``trace``
imports torch when it traces; ``run`` finds experiments through the chapter registry.
"""

import argparse
import json
import re

from . import units
from .errors import UsageError
from .memory import accounting
from .memory.policies import ADAMW_IMPLS, KERNELS, NORMS, POLICIES

# a number, optionally with a decimal exponent (7.5e9) or one suffix (70B, 8.03B, 125M, 4k)
_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([KMBT]?)\s*$", re.IGNORECASE)
_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def positive(name: str):
    """An argparse type for option ``name``: positive integers only, with an error naming the option."""
    def parse(text: str) -> int:
        if not re.fullmatch(r"\+?\d+", text.strip()) or int(text) <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return int(text)
    return parse


def _count(text: str, scale: dict[str, int]) -> int | None:
    """A positive whole count written as digits, a decimal exponent or a suffix; None if it is not one."""
    match = _COUNT.match(text)
    if not match or match.group(2).upper() not in scale:
        return None
    number, unit = match.group(1).lower(), scale[match.group(2).upper()]
    mantissa, _, exp = number.partition("e")
    whole, _, frac = mantissa.partition(".")
    # exact arithmetic: 8.03B is 8,030,000,000, not a float's nearest neighbour
    value, denom = int(whole + frac) * unit * 10 ** int(exp or 0), 10 ** len(frac)
    return value // denom if value % denom == 0 and value > 0 else None


def param_count(text: str) -> int:
    """Parameter counts: 8030261248, 7.5e9, 70B, 70.55B, 405.85b, 125M (K, M, B, T are 10^3..10^12)."""
    value = _count(text, _DECIMAL)
    if value is None:
        raise argparse.ArgumentTypeError(f"--params must be a positive count such as 70B, 8.03B, 7.5e9 "
                                         f"or 8030261248, got {text!r}")
    return value


def seq_length(text: str) -> int:
    """Sequence lengths: 4096, 4k, 8K, 32k (k = 1024 tokens, as context lengths are named)."""
    value = _count(text, {"": 1, "K": 1024})
    if value is None:
        raise argparse.ArgumentTypeError(f"--seq must be a positive whole number of tokens such as 4096, "
                                         f"4k or 8K (k = 1024), got {text!r}")
    return value


def layer_count(text: str) -> int:
    """The largest module's parameter count, written as --params is (e.g. 1.05B)."""
    value = _count(text, _DECIMAL)
    if value is None:
        raise argparse.ArgumentTypeError(f"--largest-layer must be a positive count such as 1.05B or "
                                         f"1050673152, got {text!r}")
    return value


def _model_args(p, activation_opts: bool = True) -> None:
    p.add_argument("--model", help="llama-3-8b, llama-3-70b, llama-3.1-405b, tiny, mini")
    p.add_argument("--recipe", default="mixed", choices=accounting.RECIPES)
    if activation_opts:  # default None, so that --params with any of them can be refused
        p.add_argument("--seq", type=seq_length, default=None, help="sequence length: 4096, 4k, 8K (4096)")
        p.add_argument("--micro-batch", type=positive("--micro-batch"), default=None, help="(1)")
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
    p.add_argument("--params", type=param_count, help="parameter count only (model states): 70B, 7.5e9")
    p.add_argument("--largest-layer", type=layer_count, default=None,
                   help="with --params and --zero 3: the largest module's parameters, for the working set")
    p.add_argument("--gpus", type=positive("--gpus"), default=1)
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0)
    p.add_argument("--offload", choices=accounting.OFFLOADS, default="none")
    p.add_argument("--offload-device", choices=accounting.DEVICES, default="cpu")
    p.set_defaults(func=_estimate)

    p = sub.add_parser("trace", help="the same step executed on fake tensors (exact bytes)")
    _model_args(p)
    p.add_argument("--full", action="store_true", help="trace every layer (slow) instead of composing")
    p.add_argument("--adamw", choices=ADAMW_IMPLS, default="for-loop",
                   help="torch AdamW code path for pure-bf16 and fp32 (for-loop)")
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
            common = {a.dest for a in q._actions}
            if exp.options and run_options:
                resolve(chapter.target(exp.options))(q)
            q.set_defaults(func=_run, _options=sorted({a.dest for a in q._actions} - common))


def _activation_options(args) -> dict:
    given = {k: v for k, v in [("--seq", args.seq), ("--micro-batch", args.micro_batch),
                               ("--checkpoint", args.checkpoint), ("--attention", args.attention),
                               ("--norm", args.norm)]
             if v is not None}
    return given


def _estimate(args) -> int:
    from .memory.estimate import estimate
    given = _activation_options(args)
    if args.params is not None and given:
        raise UsageError(f"--params counts model states only; drop {', '.join(given)} or use --model")
    if args.params is None and args.model is None:
        raise UsageError("give --model NAME or --params N")
    kwargs = {"largest_layer": args.largest_layer} if args.params is not None else {
        "seq": args.seq or 4096, "micro_batch": args.micro_batch or 1,
        "checkpoint": args.checkpoint or "none", "attention": args.attention or "flash",
        "norm": args.norm or "fused"}
    if args.params is None and args.largest_layer is not None:
        raise UsageError("--largest-layer goes with --params; a --model knows its largest layer")
    est = estimate(model=args.model, params=args.params, gpus=args.gpus, zero=args.zero,
                   recipe=args.recipe, offload=args.offload, offload_device=args.offload_device, **kwargs)
    if args.json:
        print(json.dumps(est.as_dict()))
        return 0
    d = est.as_dict()
    print(f"{d['model']}: {d['n_params'] / 1e9:.2f} B parameters")
    print(f"recipe {d['recipe']}, {d['gpus']} GPU(s), ZeRO-{d['zero']}"
          + (f", seq {d['seq']} x micro-batch {d['micro_batch']}, checkpoint {d['checkpoint']}, "
             f"attention {d['attention']}" if est.acts else ", model states only"))
    for key in ("params", "grads", "optimizer", "activations", "gathered", "total"):
        if key == "gathered" and d["zero"] < 3:
            continue
        print(f"  {key:12s} {units.fmt_both(d['per_gpu'][key])}"
              + ("  ZeRO-3 working set:" if key == "gathered" and "gathered_parts" in d else ""))
        for part, value in (d.get("gathered_parts", {}).items() if key == "gathered" else ()):
            print(f"    {part:44s} {units.fmt(value)}")
    for key in ("host", "nvme"):
        if key in d:
            print(f"  {key + ' (per GPU)':12s} {units.fmt_both(d[key])}")
    for note in d.get("notes", []):
        print(f"  note: {note}")
    return 0


def _trace(args) -> int:
    from .memory import tracing
    if args.model is None:
        raise UsageError("trace needs --model NAME")
    kwargs = dict(recipe=args.recipe, kernel=args.attention or "flash", policy=args.checkpoint or "none",
                  seq=args.seq or 4096, micro_batch=args.micro_batch or 1, norm=args.norm or "fused",
                  adamw=args.adamw)
    tr = tracing.trace_step(args.model, **kwargs) if args.full else tracing.trace_fast(args.model, **kwargs)
    if args.json:
        print(json.dumps(tr.as_dict()))
        return 0
    print(f"{tr.model}: one training step traced on fake tensors ({tr.method}, {tr.seconds:.1f} s)")
    for name, value in tr.peaks.items():
        print(f"  {name:12s} peak {units.fmt_both(value):26s} at {tr.peak_moments[name]}")
    print(f"  {'total':12s} peak {units.fmt_both(tr.total_peak):26s} at {tr.total_peak_moment}")
    return 0


def _run(args) -> int:
    import torch

    from . import chapters
    from .memory import models
    if args.device == "cuda" and args.ranks > torch.cuda.device_count():
        raise UsageError(f"--ranks {args.ranks} needs {args.ranks} GPUs; this machine has "
                         f"{torch.cuda.device_count()} (use --device cpu for CPU ranks)")
    if args.ranks > 8 and args.device == "cpu":
        raise UsageError(f"--ranks {args.ranks} is too many CPU ranks for a laptop; accepted: 1 to 8")
    kwargs = {"ranks": args.ranks, "device": args.device, "progress": not args.json}
    if args.model is not None:
        kwargs["model"] = models.get(args.model).name
    kwargs.update({name: getattr(args, name) for name in args._options})
    result = chapters.run_experiment(args.experiment, **kwargs)
    if args.json:
        print(json.dumps(result))
        return 0
    print(chapters.render_experiment(args.experiment, result))
    return 0
