"""Lab 08's words for its rows: a setup, a model, how far a count is off (no answer is printed)."""

GB = 10**9
ROW_CHARS = 700       # a row names the setup (up to ~110 characters) and then a hint: room for both (review r12)


def off_by(got: int, want: int, hint: str = "") -> str:
    """How ``got`` differs from ``want`` without saying ``want``: direction and a rounded factor, then
    ``hint`` (a known mistake's words) after " -- "; a small difference is given in bytes, with the
    generic clause only where no hint names the term (review r14 minor 5.1)."""
    tail = f" -- {hint}" if hint else ""
    if want == 0:
        return f"you counted {got:,} B where the setup keeps none{tail}"
    if got == 0:
        return f"you counted nothing where the setup keeps bytes{tail}"
    factor = got / want
    if abs(factor - 1) < 0.01:       # a ratio would print as 1x or 0.999x: give the bytes
        return (f"off by {got - want:+,} B ({100 * (factor - 1):+.3f} %)" + (tail or ": a small term (per tensor, "
                "per block, per token, a rounding up) is off"))
    return f"yours is {factor:.3g}x the right count ({'too high' if factor > 1 else 'too low'}){tail}"


def describe(ft) -> str:
    """A setup in a few words, for a row (the case the learner got wrong)."""
    if not ft.lora:
        return f"full, {ft.optimizer}"
    kind = "QLoRA" if ft.base_dtype == "nf4" else "LoRA"
    nf4 = (f", NF4 block {getattr(ft, 'nf4_block', 64)}, double quant {getattr(ft, 'double_quant', True)}"
           if ft.base_dtype == "nf4" else "")
    return f"{kind} r={ft.lora_rank} on {','.join(ft.lora_targets)}, {ft.adapter_dtype} adapters, {ft.optimizer}{nf4}"


def model_line(m: dict) -> str:
    """A drawn model's dimensions in one line: a row's case label."""
    return (f"L={m['n_layers']} h={m['d_model']:,} a={m['n_heads']} kv={m['n_kv_heads']} "
            f"hd={m['head_dim']} F={m['ffn']:,} V={m['vocab']:,} {'tied' if m['tie_embeddings'] else 'untied'}")
