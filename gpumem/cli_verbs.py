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
from .memory.policies import KERNELS, POLICIES

_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def positive(name: str):
    """An argparse type for option ``name``: positive integers only, with an error naming the option."""
    def parse(text: str) -> int:
        if not re.fullmatch(r"\+?\d+", text.strip()) or int(text) <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return int(text)
    return parse


def param_count(text: str) -> int:
    """'70e9'-free counts: 8030261248, 70B, 70.55B, 405.85b, 125M."""
    match = _COUNT.match(text)
    value = int(round(float(match.group(1)) * _SCALE[match.group(2).upper()])) if match else 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--params must be a positive count such as 70B, 8.03B or "
                                         f"8030261248, got {text!r}")
    return value


def _model_args(p, activation_opts: bool = True) -> None:
    p.add_argument("--model", help="llama-3-8b, llama-3-70b, llama-3.1-405b, tiny, mini")
    p.add_argument("--recipe", default="mixed", choices=accounting.RECIPES)
    if activation_opts:  # default None, so that --params with any of them can be refused
        p.add_argument("--seq", type=positive("--seq"), default=None, help="sequence length (4096)")
        p.add_argument("--micro-batch", type=positive("--micro-batch"), default=None, help="(1)")
        p.add_argument("--checkpoint", choices=POLICIES, default=None, help="(none)")
        p.add_argument("--attention", choices=KERNELS, default=None, help="(flash)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(sub) -> None:
    """Add the ``estimate``, ``trace`` and ``run`` verbs to the command line's subparsers."""
    p = sub.add_parser("estimate", help="per-GPU and host memory of a training step (formulas)")
    _model_args(p)
    p.add_argument("--params", type=param_count, help="parameter count only (model states)")
    p.add_argument("--gpus", type=positive("--gpus"), default=1)
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0)
    p.add_argument("--offload", choices=accounting.OFFLOADS, default="none")
    p.add_argument("--offload-device", choices=accounting.DEVICES, default="cpu")
    p.set_defaults(func=_estimate)

    p = sub.add_parser("trace", help="the same step executed on fake tensors (exact bytes)")
    _model_args(p)
    p.add_argument("--full", action="store_true", help="trace every layer (slow) instead of composing")
    p.set_defaults(func=_trace)

    from .chapters import experiments
    p = sub.add_parser("run", help="run a chapter's experiment on CPU ranks (or GPUs)")
    p.add_argument("experiment", choices=list(experiments()))
    p.add_argument("--ranks", type=positive("--ranks"), default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--model", default=None, help="a registry model (default: the experiment's own)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run)


def _activation_options(args) -> dict:
    given = {k: v for k, v in [("--seq", args.seq), ("--micro-batch", args.micro_batch),
                               ("--checkpoint", args.checkpoint), ("--attention", args.attention)]
             if v is not None}
    return given


def _estimate(args) -> int:
    from .memory.estimate import estimate
    given = _activation_options(args)
    if args.params is not None and given:
        raise UsageError(f"--params counts model states only; drop {', '.join(given)} or use --model")
    if args.params is None and args.model is None:
        raise UsageError("give --model NAME or --params N")
    kwargs = {} if args.params is not None else {
        "seq": args.seq or 4096, "micro_batch": args.micro_batch or 1,
        "checkpoint": args.checkpoint or "none", "attention": args.attention or "flash"}
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
    for key in ("params", "grads", "optimizer", "activations", "total"):
        print(f"  {key:12s} {units.fmt_both(d['per_gpu'][key])}")
    for key in ("host", "nvme"):
        if key in d:
            print(f"  {key + ' (per GPU)':12s} {units.fmt_both(d[key])}")
    return 0


def _trace(args) -> int:
    from .memory import tracing
    if args.model is None:
        raise UsageError("trace needs --model NAME")
    kwargs = dict(recipe=args.recipe, kernel=args.attention or "flash", policy=args.checkpoint or "none",
                  seq=args.seq or 4096, micro_batch=args.micro_batch or 1)
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
    result = chapters.run_experiment(args.experiment, **kwargs)
    if args.json:
        print(json.dumps(result))
        return 0
    print(chapters.render_experiment(args.experiment, result))
    return 0
