"""Trace Hugging Face ``transformers``' own model class, built from a config, for one training step.

``trace_hf`` builds ``AutoModelForCausalLM.from_config`` (transformers pinned in
env/requirements.txt) on fake tensors (``FakeTensorMode``: no weights, nothing downloaded,
nothing allocated), parameters in bf16 (fp32 for the fp32 recipe) with the course's optimizers
(``optim.make_optimizer``), and runs the step the way people train it: ``model(input_ids,
labels=input_ids)`` with transformers' own loss, ``backward``, ``optimizer.step``, under the
chapter 01 tracer (``tracer.PeakTracker``). Stated settings:

* attention implementation ``sdpa`` (the default; PyTorch's CPU flash kernel when no mask is
  passed) or ``eager``; every dropout probability set to 0, as for the course's Llama;
* one sequence per row, not packed. transformers decides this from the *values* of the position
  ids (``masking_utils.find_packed_sequence_indices``); fake tensors have no values, so it would
  assume packing, materialise an (s, s) mask and then expand k and v to all heads: 151 MB more
  per layer of Llama-3-70B at 4k that real tensors never save. The trace gives the answer real
  tensors give (a test compares fake with real tensors on a small model).

A mixture of experts (``mixtral``, ``qwen3_moe``) routes each token by its tensors' values, which
fake tensors lack. With transformers' default experts implementation (``grouped_mm``, named here)
no shape depends on them: every token's top-k rows are computed (S = T*k), only their split among
the experts follows the values. So on real CPU tensors at reduced sizes (``fake=False``, each
layer's tokens per expert read off its router) the saved bytes equal the formula's (``moe_acts``)
at the routing counted, at a forced balanced routing and at none; fake tensors give the same
bytes, at full size too (``tests/test_hf_moe.py``).

``saved_tensors`` lists what autograd saves in the forward, tensor by tensor (module, shape, dtype,
bytes, the op that saved it), for the difference tables of ``hf_compare``.
"""

import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from .. import units
from ..errors import UsageError, one_of
from . import hf_config
from .activations import activations
from .estimate import LLAMA_LIKE
from .models import ModelConfig
from .moe_acts import Routing
from .optim import MasterWeightAdamW
from .tracer import CATEGORIES, Moment, PeakTracker, Trace, build_with, validate

ATTENTION = ("sdpa", "eager")
DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
            "summary_first_dropout", "dropout")
LAYER_FIELD = {"gpt2": "n_layer"}
MOE = ("mixtral", "qwen3_moe")   # formula = trace on real tensors: tests/test_hf_moe.py


def raw_config(config: str | dict, layers: int | None = None) -> tuple[dict, ModelConfig]:
    """The config dictionary (dropouts 0, depth ``layers`` if given) and its :class:`ModelConfig`."""
    if isinstance(config, dict):
        raw, name = dict(config), "config"
    else:
        cfg = hf_config.load(config)   # UsageError for a bad path or field
        path = hf_config.CONFIG_DIR / f"{config}.json" if config in hf_config.SHIPPED else Path(config)
        raw, name = json.loads(path.read_text()), cfg.name
    raw.update(dict.fromkeys(DROPOUTS, 0.0))   # every type's names (GPT-2's default to 0.1)
    if layers is not None:
        raw[LAYER_FIELD.get(raw.get("model_type"), "num_hidden_layers")] = layers
    cfg = hf_config.from_dict(raw, name)
    return raw, (replace(cfg, n_layers=layers) if layers is not None else cfg)


@contextlib.contextmanager
def one_sequence_per_row():
    """Answer transformers' packed-sequence question as real, unpacked position ids do (None)."""
    from transformers import masking_utils
    old = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = old


def build_hf(raw: dict, attention: str = "sdpa", recipe: str = "mixed", fake: bool = True,
             adamw: str = "for-loop", seed: int = 0):
    """transformers' model for ``raw`` (train mode), its optimizer, and the tensor mode; a mixture
    of experts runs transformers' default experts implementation, ``grouped_mm``, named here."""
    import transformers
    one_of(attention, ATTENTION, "attention implementation")
    hf_cfg = transformers.AutoConfig.for_model(**raw)
    experts = {"experts_implementation": "grouped_mm"} if raw.get("num_experts_per_tok") else {}

    def make_model():
        return transformers.AutoModelForCausalLM.from_config(
            hf_cfg, attn_implementation=attention, **experts).train()
    return build_with(make_model, recipe, fake, seed, adamw)


def trace_hf(config: str | dict, seq: int = 4096, micro_batch: int = 1, attention: str = "sdpa",
             recipe: str = "mixed", layers: int | None = None, fake: bool = True,
             adamw: str = "for-loop", seed: int = 0, routing_counts: list | None = None) -> Trace:
    """One training step of transformers' model for ``config`` (a shipped name, a path or a
    dictionary) under :class:`PeakTracker`; ``layers`` overrides the depth. For a mixture of
    experts on real tensors, each layer's tokens per expert, read off its router, are appended
    to ``routing_counts`` if given."""
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise UsageError(f"--layers must be a positive integer, got {layers!r}")
    raw, cfg = raw_config(config, layers)
    if cfg.moe and fake and routing_counts is not None:
        raise UsageError("tokens per expert are read off real tensors only (fake=False)")
    if cfg.model_type == "gemma2" and attention != "eager":   # transformers: sdpa cannot soft-cap
        raise UsageError("gemma2: transformers runs it with eager attention only; use --attention eager")
    seq, micro_batch = validate(recipe, "flash", "none", seq, micro_batch, "hf", adamw)
    if cfg.positions and seq > cfg.positions:   # fake tensors would not notice the bad index
        raise UsageError(f"--seq {seq} is longer than {cfg.name}'s {cfg.positions} learned positions")
    start = time.perf_counter()
    model, opt, mode = build_hf(raw, attention, recipe, fake, adamw, seed)
    if cfg.moe and routing_counts is not None:   # the router returns (logits, weights, indices)
        for name, mod in model.named_modules():
            if name.endswith("mlp.gate"):
                mod.register_forward_hook(lambda m, a, o: routing_counts.append(tuple(
                    torch.bincount(o[2].flatten(), minlength=cfg.n_experts).tolist())))
    # real tensors answer the packing question from their values: no patch there
    with mode, one_sequence_per_row() if fake else contextlib.nullcontext():
        gen = None if fake else torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab, (micro_batch, seq), generator=gen)  # data, untracked
        tracker = PeakTracker()
        tracker.track_external(model, opt)
        if isinstance(opt, MasterWeightAdamW):
            opt.on_fp32_grad = lambda t: tracker.retag(t, "grads")
        with tracker:
            loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    kernel = "flash" if attention == "sdpa" else "eager"
    out = Trace(cfg.name, recipe, kernel, "none", seq, micro_batch, "hf", adamw, method="hf")
    for name in CATEGORIES:
        out.peaks[name], out.peak_moments[name] = tracker.cat_peaks.get(name, (0, Moment("", "")))
        if tracker.first and out.peaks[name] == tracker.first[name]:
            out.peak_moments[name] = Moment("whole step", "")
    out.total_peak, out.total_peak_moment, out.at_total_peak = tracker.total
    out.at_moments = tracker.at_moments
    out.seconds = time.perf_counter() - start
    return out


def saved_tensors(config: str | dict, seq: int = 4096, micro_batch: int = 1,
                  attention: str = "sdpa", layers: int | None = 1) -> list[tuple]:
    """What autograd saves in one forward with the loss: (module, shape, dtype, bytes, op) per
    storage, first saver only (a tensor saved twice counts once); parameters left out."""
    raw, cfg = raw_config(config, layers)
    model, _, mode = build_hf(raw, attention)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    stack, rows, seen = ["loss"], [], set()
    for name, mod in model.named_modules():
        mod.register_forward_pre_hook(lambda m, a, n=name: stack.append(n or "loss"))
        mod.register_forward_hook(lambda m, a, o: stack.pop() and None)

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in params and key not in seen:
            seen.add(key)
            node = torch._C._current_autograd_node()
            rows.append((stack[-1], tuple(t.shape), str(t.dtype).removeprefix("torch."),
                         t.untyped_storage().nbytes(), type(node).__name__ if node else ""))
        return t

    with mode, one_sequence_per_row():
        tokens = torch.randint(0, cfg.vocab, (micro_batch, seq))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=tokens, labels=tokens, use_cache=False)
    return rows


def formula_activations(cfg: ModelConfig, seq: int, micro_batch: int, attention: str,
                        recipe: str = "mixed", routing: Routing | None = None) -> int | None:
    """The formula's activation peak for transformers' code (``impl="hf"``), or None where the
    formula does not cover the type or the attention implementation yet (eager: Llama and Qwen2,
    whose eager attention is the course's ``eager`` kernel; a mixture of experts: sdpa, at
    ``routing``, balanced by default)."""
    if cfg.model_type == "gemma2" and attention == "eager":
        return activations(cfg, seq, micro_batch, "eager", "none", recipe, "hf", "hf").peak
    if cfg.model_type in MOE and attention == "sdpa":   # ``routing``: balanced unless given
        return activations(cfg, seq, micro_batch, "flash", "none", recipe, "hf", "hf", routing).peak
    if cfg.model_type not in LLAMA_LIKE or cfg.model_type in MOE or cfg.model_type == "gemma2" \
            or (attention == "eager" and cfg.model_type not in ("llama", "qwen2")):
        return None
    kernel = "flash" if attention == "sdpa" else "eager"
    return activations(cfg, seq, micro_batch, kernel, "none", recipe, "hf", impl="hf").peak


def summary(tr: Trace, cfg: ModelConfig, attention: str, formula: int | None) -> list[str]:
    """What ``trace --config`` prints: the settings, each category's peak, the formula beside it."""
    lines = [f"{tr.model} ({cfg.model_type}, {cfg.n_layers} layers): transformers' own model, one training step",
             f"  on fake tensors ({tr.seconds:.1f} s), attention {attention}, dropout 0, one sequence per "
             "row (not packed),",
             f"  seq {tr.seq} x micro-batch {tr.micro_batch}, recipe {tr.recipe}"]
    for name, value in tr.peaks.items():
        lines.append(f"  {name:12s} peak {units.fmt_both(value):26s} at {tr.peak_moments[name]}")
    lines.append(f"  {'total':12s} peak {units.fmt_both(tr.total_peak):26s} at {tr.total_peak_moment}")
    if formula:
        lines.append(f"  formula, activations (impl hf): {units.fmt_both(formula)}; trace / formula "
                     f"{tr.peaks['activations'] / formula:.4f}")
    else:
        lines.append(f"  formula: not yet for {cfg.model_type} with {attention} attention")
    return lines
