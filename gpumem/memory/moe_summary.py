"""``trace --config`` for a mixture of experts at full size: the formula, saying why and where it
was checked (no torch on this path).

A mixture of experts routes each token by the values of its tensors. Fake tensors have no values,
and real ones at full size do not fit a laptop (one Mixtral-8x7B layer's experts: 1.41 billion
parameters, 22.5 GB at the mixed recipe's 16 bytes a parameter with gradients and AdamW). So the formula (``moe_acts``) is checked against transformers'
own code on real CPU tensors at reduced sizes (``tests/test_hf_moe.py``, with the tokens per
expert read off the routers) and used at full size.
"""

import json
from pathlib import Path

from .. import units
from ..errors import UsageError
from . import hf_config
from .activation_parts import elem_bytes
from .activations import activations, layer_terms
from .models import ModelConfig
from .moe_acts import Routing, dispatched_rows


def raw_of(config: str) -> dict:
    """The config dictionary of a shipped name or a path (already checked by ``hf_config.load``)."""
    path = hf_config.CONFIG_DIR / f"{config}.json" if config in hf_config.SHIPPED else Path(config)
    return json.loads(path.read_text())


def routing_of(raw: dict) -> Routing:
    """Balanced routing at capacity factor 1.0; top-k weights renormalised as the config says
    (Mixtral always; Qwen3-MoE by ``norm_topk_prob``, false by default in transformers)."""
    return Routing(norm_topk=raw.get("model_type") == "mixtral" or bool(raw.get("norm_topk_prob", False)))


def lines(cfg: ModelConfig, routing: Routing, seq: int, micro_batch: int, recipe: str) -> list[str]:
    """What ``trace --config`` prints for a mixture of experts."""
    e, T = elem_bytes(recipe), seq * micro_batch
    acts = activations(cfg, seq, micro_batch, "flash", "none", recipe, "hf", "hf", routing)
    terms = layer_terms(cfg, seq, micro_batch, "flash", e, norm="hf", impl="hf", routing=routing)
    out = [f"{cfg.name} ({cfg.model_type}, {cfg.n_layers} layers, {cfg.n_experts} experts, top "
           f"{cfg.top_k}): activations by formula, not traced",
           "  A mixture of experts routes by its tensors' values: fake tensors have none, and real",
           "  ones at full size do not fit here. transformers' own code (experts grouped_mm, attention",
           "  sdpa) traced on real CPU tensors at reduced size equals this formula to the byte",
           "  (tests/test_hf_moe.py). Routing balanced (each expert T*k/E rows), capacity factor 1.0:",
           f"  transformers drops and pads nothing, so S = T*k = {dispatched_rows(cfg, T, routing):,} "
           "rows whatever the routing.",
           f"  seq {seq} x micro-batch {micro_batch}, recipe {recipe}, dropout 0, one sequence per row",
           f"  {'one layer, by tensor group':48s}{'bytes':>10s}  formula (S = sbk)"]
    out += [f"  {n:48s}{units.fmt(b, 'MB', 1):>10s}  {f}" for n, (b, f) in terms.items()]
    out += [f"  {'one layer':48s}{units.fmt(acts.per_layer, 'MB', 1):>10s}",
            f"  {'activation peak (formula, impl hf)':48s}{units.fmt_both(acts.peak)}",
            f"  model states (all {cfg.n_experts} experts' weights, grads, optimizer): "
            f"estimate --config {cfg.name}"]
    return out


def cli(args, cfg: ModelConfig, finetune) -> int:
    """``trace --config`` for ``mixtral`` and ``qwen3_moe``: the formula at full size."""
    if finetune is not None:
        raise UsageError(f"trace --config: fine-tuning options are not traced for {cfg.model_type} "
                         "(a mixture of experts)")
    if args.attention == "eager":
        raise UsageError(f"trace --config: {cfg.model_type} is counted with sdpa attention only")
    from dataclasses import replace
    cfg = replace(cfg, n_layers=args.layers or cfg.n_layers)
    seq, mb, routing = args.seq or 4096, args.micro_batch or 1, routing_of(raw_of(args.config))
    if args.json:
        acts = activations(cfg, seq, mb, "flash", "none", args.recipe, "hf", "hf", routing)
        print(json.dumps({"model": cfg.name, "method": "formula", "layers": cfg.n_layers, "seq": seq,
                          "micro_batch": mb, "recipe": args.recipe, "attention_impl": "sdpa",
                          "experts_impl": "grouped_mm", "routing": "balanced, capacity factor 1.0",
                          "formula_activations": acts.peak, "per_layer": acts.per_layer}))
        return 0
    print("\n".join(lines(cfg, routing, seq, mb, args.recipe)))
    return 0
