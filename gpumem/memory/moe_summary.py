"""``trace --config`` for a mixture of experts (``mixtral``, ``qwen3_moe``): transformers' own model
traced on fake tensors at full size, the formula beside it, and the routing stated.

A mixture of experts routes each token by its tensors' values, which fake tensors lack. With
transformers' default experts implementation, ``grouped_mm``, no shape depends on them: every
token's top-k (token, expert) rows are computed, S = T*k, and only their split among the experts
follows the values; nothing is dropped or padded (capacity factor 1.0). So the saved bytes do not
depend on the routing: ``tests/test_hf_moe.py`` shows formula = trace on real CPU tensors at
reduced sizes (the real routing, counted off the routers, and a forced balanced one) and on fake
tensors at full size. A dispatcher with another capacity factor: ``moe_acts``.
"""

import json
from dataclasses import replace
from pathlib import Path

from .. import units
from ..errors import UsageError
from . import hf_config
from .activation_parts import elem_bytes
from .models import ModelConfig
from .moe_acts import Routing, dispatched_rows, moe_terms


def raw_of(config: str) -> dict:
    """The config dictionary of a shipped name or a path (already checked by ``hf_config.load``)."""
    path = hf_config.CONFIG_DIR / f"{config}.json" if config in hf_config.SHIPPED else Path(config)
    return json.loads(path.read_text())


def routing_of(raw: dict) -> Routing:
    """Balanced routing at capacity factor 1.0; top-k weights renormalised as the config says
    (Mixtral always; Qwen3-MoE by ``norm_topk_prob``, false by default in transformers)."""
    return Routing(norm_topk=raw.get("model_type") == "mixtral" or bool(raw.get("norm_topk_prob", False)))


def moe_lines(cfg: ModelConfig, routing: Routing, seq: int, micro_batch: int, recipe: str) -> list[str]:
    """The routing stated, and one layer's mixture-of-experts part by tensor group (formula)."""
    T = seq * micro_batch
    out = [f"  experts grouped_mm (transformers' default): {cfg.n_experts} experts, top {cfg.top_k}; "
           f"S = T*k = {dispatched_rows(cfg, T, routing):,} rows",
           "  whatever the routing (nothing dropped or padded: capacity factor 1.0), so fake tensors",
           "  save what real ones save (tests/test_hf_moe.py: real routing counted, and balanced)",
           f"  {'one layer, experts part (formula)':44s}{'bytes':>11s}  formula (S = sbk)"]
    out += [f"  {n:44s}{units.fmt(b, 'MB', 1):>11s}  {f}"
            for n, (b, f) in moe_terms(cfg, T, elem_bytes(recipe), routing).items()]
    return out


def cli(args, cfg: ModelConfig, finetune) -> int:
    """``trace --config`` for a mixture of experts: the trace, the formula, the routing."""
    if finetune is not None:
        raise UsageError(f"trace --config: fine-tuning options are not traced for {cfg.model_type} "
                         "(a mixture of experts)")
    if args.attention == "eager":
        raise UsageError(f"trace --config: {cfg.model_type} is counted with sdpa attention only")
    from . import hf_trace
    seq, mb, routing = args.seq or 4096, args.micro_batch or 1, routing_of(raw_of(args.config))
    tr = hf_trace.trace_hf(args.config, seq, mb, "sdpa", args.recipe, args.layers, adamw=args.adamw)
    cfg = replace(cfg, n_layers=args.layers or cfg.n_layers)
    formula = hf_trace.formula_activations(cfg, seq, mb, "sdpa", args.recipe, routing)
    if args.json:
        print(json.dumps(tr.as_dict() | {"attention_impl": "sdpa", "layers": cfg.n_layers,
                                         "experts_impl": "grouped_mm", "capacity_factor": 1.0,
                                         "formula_activations": formula}))
        return 0
    print("\n".join(hf_trace.summary(tr, cfg, "sdpa", formula) + moe_lines(cfg, routing, seq, mb, args.recipe)))
    return 0
