"""Lab 01's ``check()``: the learner's memory calculator graded against traced truth, and
``layer_source()``, the layer's code the lab prints for the learner to read.

The cases are not the ones the lab shows; the expected values come from fake-tensor traces
(``gpumem.memory.tracing``) where a trace can say it, otherwise from the library's formulas,
which tests prove against traces.
"""

from functools import lru_cache

from gpumem.course.grading import Report, grade
from gpumem.memory import accounting, tracing
from gpumem.memory.estimate import n_param_tensors
from gpumem.memory.models import ModelConfig, with_layers

LAB = "lab01_memory_calculator"

# Configurations the lab never shows (GQA ratios, odd widths, a large vocabulary so that the
# loss, not a layer, sets the forward activation peak).
_CONFIGS = [ModelConfig("lab-a", 3, 96, 6, 2, 256, 4000),
            ModelConfig("lab-b", 3, 128, 8, 8, 320, 6000)]


@lru_cache(maxsize=None)
def traced_states(cfg: ModelConfig, recipe: str) -> dict:
    """Expected one-GPU model-state bytes from a fake-tensor trace, without AdamW's step counters
    (the learner's function is given only a parameter count)."""
    tr = tracing.trace_step(cfg, recipe, seq=16)
    counters = 4 * n_param_tensors(cfg) if accounting.recipe(recipe).step_counter else 0
    return {"params": tr.peaks["params"], "grads": tr.peaks["grads"],
            "optimizer": tr.peaks["optimizer"] - counters}


@lru_cache(maxsize=None)
def traced_layer(cfg: ModelConfig, kernel: str, seq: int, batch: int) -> int:
    """One layer's saved bytes, read off two traces: depth 3 minus depth 2."""
    deep, shallow = (tracing.trace_step(with_layers(cfg, n), "mixed", kernel, seq=seq, micro_batch=batch)
                     for n in (3, 2))
    return deep.peaks["activations"] - shallow.peaks["activations"]


def _without_comments(source: str) -> str:
    """``source`` with its comments and blank lines removed (they would name what is saved)."""
    import io
    import tokenize
    drop = {(t.start[0], t.start[1]) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT}
    lines = source.splitlines()
    for row, col in drop:
        lines[row - 1] = lines[row - 1][:col].rstrip()
    return "\n".join(line for line in lines if line.strip())


def layer_source() -> str:
    """The code one layer of ``gpumem.memory.llama`` runs, as lab 01 shows it (comments removed,
    the learner works out what each operation saves): the block, its attention and attention
    core, ``repeat_kv``, RoPE, the SwiGLU MLP and the fused RMSNorm's forward."""
    import inspect
    import textwrap
    from gpumem.memory import llama
    parts = [llama.Block.forward, llama._FusedRMSNormFn.forward, llama.Attention.forward,
             llama.apply_rope, llama.core_attention, llama.repeat_kv, llama.MLP.forward]
    return "\n\n".join(f"# {f.__qualname__.replace('_FusedRMSNormFn', 'RMSNorm')}\n"
                       + _without_comments(textwrap.dedent(inspect.getsource(f))) for f in parts)


def _bytes(v) -> str:
    return f"{v:,} B" if isinstance(v, int) else repr(v)


def check(ns: dict, show: bool = True) -> Report:
    """Grade ``model_state_bytes`` and ``layer_activation_bytes`` from the lab's namespace."""
    report = Report(LAB)
    cases = []
    for cfg in _CONFIGS:
        for recipe in accounting.RECIPES:
            cases.append((f"{cfg.name}, {recipe}, 1 GPU (traced)",
                          dict(n_params=cfg.n_params(), recipe=recipe), traced_states(cfg, recipe)))
    for recipe, gpus, zero in [("mixed", 8, 1), ("mixed", 8, 2), ("pure-bf16", 8, 3), ("mixed-ds", 6, 3)]:
        n = _CONFIGS[0].n_params()
        s = accounting.model_states(n, recipe, gpus, zero)
        cases.append((f"{n:,} params, {recipe}, {gpus} GPUs, ZeRO-{zero}",
                      dict(n_params=n, recipe=recipe, gpus=gpus, zero=zero),
                      {"params": s.params, "grads": s.grads, "optimizer": s.optimizer}))
    grade(report, "model_state_bytes", ns.get("model_state_bytes"), cases)

    cases = []
    for cfg, seq, batch in [(_CONFIGS[0], 24, 2), (_CONFIGS[1], 32, 1)]:
        for kernel in ("flash", "naive", "eager"):
            cases.append((f"{cfg.name} d={cfg.d_model} heads={cfg.n_heads}/{cfg.n_kv_heads} seq={seq} "
                          f"batch={batch} {kernel} (traced)",
                          dict(d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                               ffn=cfg.ffn, seq=seq, batch=batch, kernel=kernel),
                          traced_layer(cfg, kernel, seq, batch)))
    grade(report, "layer_activation_bytes", ns.get("layer_activation_bytes"), cases, show=_bytes)
    if show:
        print(report.summary())
    return report
