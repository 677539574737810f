"""LoRA and QLoRA steps traced: peft's model (bitsandbytes' NF4 base for QLoRA) under the tracer.

``trace_ft`` runs one training step of transformers' model for a config, set up by
``finetune_build.build_ft`` (peft LoRA, rank r on the chosen projections, adapters fp32; the
base frozen in bf16 or NF4), under ``tracer.PeakTracker``, with the step under
``torch.autocast(bfloat16)`` when the setup says so (HF Trainer's ``bf16=True``). LoRA runs on
fake tensors (any size: nothing is allocated); QLoRA on real tensors, because bitsandbytes'
``Params4bit`` cannot wrap a fake tensor: a reduced config (``--layers``, a small width).

``saved_by_role`` lists what autograd saves in the forward, by the module that saved it:

* ``base``: the frozen projection (``<proj>.base_layer``): a linear whose weight needs no
  gradient still needs the weight (a parameter, not counted) for its input's gradient, and not
  its input;
* ``lora_A``: the input of A (its weight's gradient needs it): under autocast a bf16 copy made
  by autocast's cast, one per adapted projection even when q, k and v read the same tensor;
* ``lora_B``: A's output (r values per token), B's input;
* ``dropout``: the mask of ``lora_dropout`` when it is above 0;
* ``lora``: the LoRA wrapper's own code (casts, the scaling, the sum with the base output);
* ``rest``: everything else (attention, norms, MLP activation, loss), as without adapters.

``prepare=True`` first runs peft's ``prepare_model_for_kbit_training`` (QLoRA recipes call it): the
embedding, norms and head become fp32, and so do the hidden states after each norm's weight
multiply: QLoRA then saves more than LoRA, the surprise the chapter explains (a test measures it).

``_BnbOps`` records bitsandbytes' operators in forward and backward: where the NF4 weight is
turned back into bf16, and whether that happens again in backward (recomputed) or the bf16
weight is kept from forward (saved).
"""

import contextlib
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import units
from ..errors import UsageError
from .finetune_build import build_ft, make_ft_optimizer
from .hf_trace import one_sequence_per_row, raw_config
from .tracer import CATEGORIES, Moment, PeakTracker, Trace

ROLES = ("base", "lora_A", "lora_B", "dropout", "lora", "rest")
REAL_LIMIT = 5 * 10**7    # parameters a real-tensor (QLoRA) trace accepts: about a minute on a CPU


def role_of(module: str, wrappers: set[str] = frozenset()) -> str:
    """The saving role of a module named as peft names it (``...q_proj.lora_A.default``);
    ``wrappers``: the names of peft's LoRA layers (the adapted projections)."""
    for part, role in ((".base_layer.", "base"), (".lora_A.", "lora_A"), (".lora_B.", "lora_B"),
                       (".lora_dropout.", "dropout")):
        if part in module + ".":
            return role
    return "lora" if module in wrappers else "rest"


def on_fake(ft) -> bool:
    """Fake tensors unless bitsandbytes holds a tensor (an NF4 base, 8-bit AdamW's states)."""
    return ft.base_dtype != "nf4" and ft.optimizer == "adamw"


def _prepare(config, ft, layers, fake):
    raw, cfg = raw_config(config, layers)
    if not fake and cfg.n_params() > REAL_LIMIT:
        raise UsageError(f"{cfg.name} at {cfg.n_layers} layers holds {cfg.n_params():,} parameters; a "
                         f"real-tensor trace takes at most {REAL_LIMIT:,}: trace fewer --layers or a smaller model")
    return raw, cfg


class _NoHook:
    def remove(self):
        pass


def frozen_tracker(model) -> PeakTracker:
    """A :class:`PeakTracker` that installs no gradient hooks on frozen parameters (torch's
    MemTracker registers one on every parameter, which a tensor without grad refuses)."""
    tracker = PeakTracker()
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    return tracker


def _amp(ft):
    return torch.autocast("cpu", dtype=torch.bfloat16) if ft.autocast else contextlib.nullcontext()


def trace_ft(config: str | dict, ft, seq: int = 4096, micro_batch: int = 1, attention: str = "sdpa",
             layers: int | None = None, seed: int = 0, prepare: bool = False) -> Trace:
    """One training step of ``ft`` on transformers' model for ``config`` under :class:`PeakTracker`
    (fake tensors for a bf16 base, real ones for NF4)."""
    fake = on_fake(ft)
    raw, cfg = _prepare(config, ft, layers, fake)
    start = time.perf_counter()
    model, mode = build_ft(raw, ft, fake, seed, attention, prepare=prepare)
    with mode, one_sequence_per_row() if fake else contextlib.nullcontext():
        opt = make_ft_optimizer(model, ft)
        for p in model.parameters():          # one step on zero gradients creates the states
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        gen = None if fake else torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab, (micro_batch, seq), generator=gen)
        tracker = frozen_tracker(model)
        tracker.track_external(model, opt)
        with tracker:
            with _amp(ft):
                loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    out = Trace(cfg.name, ft.recipe, "flash" if attention == "sdpa" else "eager", "none", seq, micro_batch,
                "hf", "for-loop", method="hf-" + ("qlora" if ft.base_dtype == "nf4" else ft.adapter))
    for name in CATEGORIES:
        out.peaks[name], out.peak_moments[name] = tracker.cat_peaks.get(name, (0, Moment("", "")))
    out.total_peak, out.total_peak_moment, out.at_total_peak = tracker.total
    out.seconds = time.perf_counter() - start
    return out


class _BnbOps(TorchDispatchMode):
    """Records bitsandbytes' operators: (phase, name, output shape, output dtype)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if name.startswith("bitsandbytes."):
            phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
            self.ops.append((phase, name.split(".")[1], tuple(out.shape), str(out.dtype).removeprefix("torch.")))
        return out


def saved_by_role(config: str | dict, ft, seq: int = 256, micro_batch: int = 1, attention: str = "sdpa",
                  layers: int | None = 1, seed: int = 0, dropout: float = 0.0,
                  prepare: bool = False) -> tuple[list[tuple], list[tuple]]:
    """What autograd saves in one forward with the loss, (module, role, shape, dtype, bytes, op)
    per storage (first saver only, parameters left out), and bitsandbytes' operators of the
    forward and backward (:class:`_BnbOps`; empty for a bf16 base)."""
    fake = on_fake(ft)
    raw, cfg = _prepare(config, ft, layers, fake)
    model, mode = build_ft(raw, ft, fake, seed, attention, dropout, prepare)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    wrappers = {name for name, mod in model.named_modules() if hasattr(mod, "lora_A")}
    stack, rows, seen = ["loss"], [], set()
    for name, mod in model.named_modules():
        mod.register_forward_pre_hook(lambda m, a, n=name: stack.append(n or "loss"))
        mod.register_forward_hook(lambda m, a, o: stack.pop() and None)

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in params and key not in seen:
            seen.add(key)
            node = torch._C._current_autograd_node()
            rows.append((stack[-1], role_of(stack[-1], wrappers), tuple(t.shape), str(t.dtype).removeprefix("torch."),
                         t.untyped_storage().nbytes(), type(node).__name__ if node else ""))
        return t

    ops = _BnbOps()
    with mode, one_sequence_per_row() if fake else contextlib.nullcontext():
        gen = None if fake else torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab, (micro_batch, seq), generator=gen)
        with ops if not fake else contextlib.nullcontext():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _amp(ft):
                loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
            if not fake:
                loss.backward()
    return rows, ops.ops


def by_role(rows: list[tuple]) -> dict[str, int]:
    """Saved bytes per role (every role of :data:`ROLES`)."""
    out = dict.fromkeys(ROLES, 0)
    for row in rows:
        out[row[1]] += row[4]
    return out


def cli(args, cfg, ft, out=print) -> int:
    """``trace --config X --adapter lora ...``: the traced step, what is saved by role, the formula
    beside it, and bitsandbytes' dequantisation by phase; ``out`` prints a line."""
    from .finetune_acts import finetune_activations
    attention = "eager" if args.attention == "eager" else "sdpa"
    seq, mb, kernel = args.seq or 4096, args.micro_batch or 1, "eager" if attention == "eager" else "flash"
    tr = trace_ft(args.config, ft, seq, mb, attention, args.layers)
    rows, ops = saved_by_role(args.config, ft, seq, mb, attention, args.layers)
    depth = raw_config(args.config, args.layers)[1]
    formula = finetune_activations(depth, ft, seq, mb, kernel, "none", "hf", "hf")["peak"]
    dequant = {ph: sum(1 for o in ops if o[0] == ph and o[1] in ("gemm_4bit", "dequantize_4bit"))
               for ph in ("forward", "backward")}
    if args.json:
        import json
        out(json.dumps(tr.as_dict() | {"finetune": ft.__dict__, "layers": depth.n_layers, "formula_activations":
                                       formula, "saved_by_role": by_role(rows), "nf4_ops_by_phase": dequant}))
        return 0
    what = "full fine-tuning" if ft.adapter == "none" else \
        f"{'QLoRA' if ft.base_dtype == 'nf4' else 'LoRA'} r={ft.lora_rank} on {','.join(ft.lora_targets)}"
    out(f"{cfg.name} ({depth.n_layers} layers), {what}: peft / bitsandbytes on {'fake' if on_fake(ft) else 'real'} "
        f"tensors ({tr.seconds:.1f} s)")
    out(f"  attention {attention}, seq {seq} x micro-batch {mb}, {ft.optimizer}, autocast bf16: {ft.autocast}")
    for name, value in tr.peaks.items():
        out(f"  {name:12s} peak {units.fmt_both(value):26s} at "
            + str(tr.peak_moments[name]).replace("base_model.model.model.", "").replace("base_model.model", "loss"))
    out(f"  formula, activations: {units.fmt_both(formula)}; trace / formula {tr.peaks['activations'] / formula:.4f}")
    out("  saved in the forward, by role (frozen base layer, LoRA's A and B, dropout, wrapper, rest):")
    out("    " + ", ".join(f"{k} {units.fmt(v, 'MB')}" for k, v in by_role(rows).items()))
    if ft.base_dtype == "nf4":
        out(f"  NF4 weight turned into bf16: {dequant['forward']} matmuls in forward, {dequant['backward']} "
            "times again in backward (recomputed, not saved)")
        out("  on a CPU peft's 4-bit layer copies each adapter's input (its autocast test asks about CUDA "
            "only);")
        out("  the formula counts a GPU, where the input is shared")
    return 0
