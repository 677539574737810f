"""Chapter 01, section 9 ("Your model"): a non-Llama dense model and a mixture of experts beside
Llama-3-70B, counted with ``estimate`` from their shipped configs (``gpumem/memory/configs``)
and traced at reduced depth with transformers' own model code (``hf_trace.trace_hf``).

``counts_table`` prints what each model is (parameters, per token, vocabulary, embedding + head)
and what one GPU holds of it; ``trace_table`` builds each model's transformers class at 2 layers
on fake tensors and sets the formula's activations and model states beside the trace's.
"""

import contextlib
import logging

from gpumem.memory import hf_config, hf_trace, models
from gpumem.memory.estimate import estimate

MODELS = ("llama-3-70b", "qwen2.5-72b", "mixtral-8x7b")
TRACED = {"llama-3-70b": "meta-llama-3-70b"}     # the course's Llama as its Hugging Face config


def config(name: str) -> models.ModelConfig:
    """The registry's Llama, or a shipped config file by name."""
    return models.get(name) if name in models.REGISTRY else hf_config.load(name)


def _b(n: int) -> str:
    return f"{n / 1e9:.2f} B"


def _gb(n: int, digits: int = 1) -> str:
    return f"{n / 1e9:,.{digits}f}"


def counts_table(names=MODELS, gpus: int = 8, zero: int = 3, seq: int = 4096, recipe: str = "mixed") -> str:
    """Two blocks: the models' parameters, and one GPU's bytes by part (``estimate``), each model's
    sum set against the first's."""
    head = (f"{'model':14s} {'layers':>6s} {'width':>6s} {'mlp':>10s} {'qkv bias':>8s} {'vocab':>8s} "
            f"{'tied':>4s} {'params':>8s} "
            f"{'per token':>9s} {'emb+head':>8s} {'share':>5s}")
    rows = [head]
    for name in names:
        c = config(name)
        n = c.n_params()
        mlp = f"{c.n_experts} x {c.ffn:,}" if c.moe else f"{c.ffn:,}"
        rows.append(f"{name:14s} {c.n_layers:6d} {c.d_model:6,d} {mlp:>10s} {'yes' if c.qkv_bias else 'no':>8s} "
                    f"{c.vocab:8,d} "
                    f"{'yes' if c.tie_embeddings else 'no':>4s} {_b(n):>8s} {_b(c.n_params(active=True)):>9s} "
                    f"{_b(c.embedding_params()):>8s} {c.embedding_params() / n:5.1%}")
    rows += ["", f"{'GB per GPU':14s} {'weights':>7s} {'grads':>6s} {'optimizer':>9s} {'act/layer':>9s} "
                 f"{'at loss':>7s} {'activations':>11s} {'sum':>6s}"]
    sums = {}
    for name in names:
        e = estimate(model=config(name), gpus=gpus, zero=zero, seq=seq, recipe=recipe)
        s, a = e.states, e.acts
        sums[name] = s.params + s.grads + s.optimizer + a.peak
        rows.append(f"{name:14s} {_gb(s.params):>7s} {_gb(s.grads):>6s} {_gb(s.optimizer):>9s} "
                    f"{_gb(a.per_layer, 2):>9s} {_gb(a.loss, 2):>7s} {_gb(a.peak):>11s} "
                    f"{_gb(sums[name]):>6s}")
    first = names[0]
    if len(names) > 1:
        rows.append(f"sum against {first}: " + ", ".join(
            f"{n} {'+' if sums[n] >= sums[first] else '-'}{_gb(abs(sums[n] - sums[first]))} GB" for n in names[1:]))
    rows += [f"{recipe} recipe, {gpus} GPUs, ZeRO-{zero}, seq {seq:,}, one sequence per GPU, flash attention",
             "mlp: its width (a mixture of experts: experts x width); per token: the parameters one token",
             "  passes through (a mixture of experts: its top-k experts); share: emb+head / params",
             "at loss: the logits and their fp32 copies; sum: the four parts, ZeRO-3's working set left out"]
    return "\n".join(rows)


@contextlib.contextmanager
def _quiet():
    """transformers imports torchao, which logs its missing CUDA kernels and torch's pytree notices
    on a CPU machine: warnings about the environment, not the model, kept out of the output."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def trace_table(names=MODELS, layers: int = 2, seq: int = 4096) -> str:
    """Each model's transformers class at ``layers`` layers (sdpa, mixed recipe, fake tensors):
    traced activation peak against the formula (``impl="hf"``; a mixture of experts at balanced
    routing, which the trace equals at any routing), and traced weights against 2 B x the count."""
    rows = [f"{'model':14s} {'transformers class':22s} {'activations: trace':>18s} {'formula':>15s} "
            f"{'':5s} {'bf16 weights':>13s}"]
    with _quiet():
        for name in names:
            raw, cfg = hf_trace.raw_config(TRACED.get(name, name), layers)
            tr = hf_trace.trace_hf(raw, seq=seq, layers=layers)
            formula = hf_trace.formula_activations(cfg, seq, 1, "sdpa")
            act, w = tr.peaks["activations"], tr.peaks["params"]
            rows.append(f"{name:14s} {cls_name(raw):22s} {act:>18,d} {formula:>15,d} "
                        f"{'equal' if act == formula else 'DIFF':5s} "
                        f"{w:>13,d} {'equal' if w == 2 * cfg.n_params() else 'DIFF'}")
    rows.append(f"{layers} layers, seq {seq:,}, attention sdpa, mixed recipe; bytes; weights against "
                "2 B x the count")
    return "\n".join(rows)


def cls_name(raw: dict) -> str:
    """transformers' causal-LM class for a config's model_type (as AutoModelForCausalLM picks it)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[raw["model_type"]]
