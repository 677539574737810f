"""The activation tables chapter 01 prints, the timeline's operator numbering, and the scale table.

* ``activations.parts_table``: each row's formula, evaluated here from the config's widths, gives
  the row's bytes; ``step_table``: L layers plus what lives outside them add up to the traced
  activation peak (a fake-tensor trace, not the formula).
* ``Timeline.thinned`` and ``window`` keep the full step's operator numbers.
* ``diagrams.scale_table``: GPUs needed, worked by hand from 16 B/param and the usable bytes.
"""

import math
import re

import pytest

from gpumem.chapters.ch01_memory_anatomy import diagrams
from gpumem.memory import activations, gpus, models, timeline, tracing

GB, MB = 10**9, 10**6


def evaluate(formula: str, **sym) -> float:
    """A table formula such as ``2sb(h+2k)``, ``6as^2b`` or ``4s*head_dim``, evaluated: adjacent
    factors multiply, ``^`` is a power."""
    tokens = re.findall(r"head_dim|\d+|[A-Za-z]|[()+*^]", formula)
    assert "".join(tokens) == formula.replace(" ", ""), formula
    out = []
    for tok in tokens:
        factor = tok not in "+*^)"
        if out and factor and (out[-1] not in "+*^(" or out[-1] == ")") and out[-1] != "**":
            out.append("*")
        out.append("**" if tok == "^" else tok)
    return eval("".join(out), {}, sym)


@pytest.mark.parametrize("model, seq, batch", [("llama-3-70b", 4096, 1), ("llama-3-8b", 1024, 2), ("tiny", 64, 3)])
def test_parts_table_formulas_give_the_bytes(model, seq, batch):
    cfg = models.get(model)
    sym = dict(s=seq, b=batch, h=cfg.d_model, k=cfg.kv_dim, F=cfg.ffn, a=cfg.n_heads, V=cfg.vocab,
               head_dim=cfg.head_dim)
    for kernel in ("flash", "naive", "eager"):
        for name, (nbytes, formula) in activations.layer_terms(cfg, seq, batch, kernel, 2).items():
            assert evaluate(formula, **sym) == nbytes, (kernel, name, formula)
    text = activations.parts_table(cfg, seq, batch)
    assert "8sbF" in text and "2as^2b" in text and "6as^2b" in text and "2sb(h+2k)" in text


def test_step_table_adds_up_to_the_traced_activation_peak():
    """80 layers x 1,360 MB = 108.8 GB; the rest (logits in bf16 and fp32, log-softmax, the final
    norm, the head's input, RoPE tables) brings it to the traced 114.2 GB."""
    cfg = models.get("llama-3-70b")
    traced = tracing.trace_fast(cfg, "mixed", seq=4096).peaks["activations"]
    text = activations.step_table(cfg, 4096)
    held = re.search(r"sum: held at the loss\s+([\d,]+) MB", text).group(1)
    assert int(held.replace(",", "")) == round(traced / MB)
    rows = dict(re.findall(r"^(.+?)\s{2,}([\d,]+) MB", text, re.MULTILINE))
    assert rows["80 layers x 1,360 MB"] == "108,803"
    T, V = 4096, cfg.vocab
    assert int(rows["logits (bf16)"].replace(",", "")) == round(2 * T * V / MB)
    assert int(rows["logits, fp32 copy"].replace(",", "")) == round(4 * T * V / MB)


def test_step_table_for_the_hf_norm_counts_the_held_hidden_state():
    cfg = models.with_layers(models.get("llama-3-8b"), 4)
    traced = tracing.trace_step(cfg, "mixed", seq=128, micro_batch=2, norm="hf").peaks["activations"]
    text = activations.step_table(cfg, 128, 2, norm="hf")
    assert "last hidden state (held, not saved)" in text
    parts = sum(b for b, _ in activations.outside_terms(cfg, 128, 2, 2, "hf").values())
    parts += sum(b for b, _ in activations.loss_terms(cfg, 128, 2, 2).values())
    layer = sum(activations.layer_parts(cfg, 128, 2, "flash", 2, norm="hf").values())
    assert 4 * layer + parts + 2 * 128 * 2 * cfg.d_model == traced


def test_thinned_and_window_keep_operator_numbers():
    tl = timeline.record(models.get("mini"), "mixed", seq=32, micro_batch=2)
    thin = tl.thinned(50)
    ops = thin.operators()
    assert ops == sorted(ops) and ops[-1] <= len(tl) - 1 and len(ops) < len(tl)
    for j, i in enumerate(ops):
        assert thin.total(j) == tl.total(i)
    opt = tl.window("optimizer")
    assert set(opt.phases) == {"optimizer"}
    assert opt.operators()[0] == next(i for i, p in enumerate(tl.phases) if p == "optimizer")
    assert max(opt.total(i) for i in range(len(opt))) == tl.total(tl.peak())   # the mixed peak


def test_scale_table_gpus_needed_by_hand():
    """Fewest N with 16 B x Psi / N + one sequence's activations <= usable (79.1 GB on an H100)."""
    text = diagrams.scale_table()
    memory = text.split("\n\n")[0]
    rows = {line.split()[0]: line.split() for line in memory.splitlines() if line.startswith("llama")}
    usable = gpus.usable("h100-80gb")
    for name in ("llama-3-8b", "llama-3-70b", "llama-3.1-405b"):
        cfg = models.get(name)
        acts = activations.activations(cfg, 4096).peak
        full = activations.activations(cfg, 4096, policy="full").peak
        states = 16 * cfg.n_params()
        want = "none" if acts >= usable else f"{math.ceil(states / (usable - acts)):,d}"
        want_full = f"{math.ceil(states / (usable - full)):,d}"
        mem = rows[name]
        assert mem[6] == want and mem[9] == want_full, mem
    assert rows["llama-3-8b"][6] == "3"              # 128.5 GB / (79.1 - 27.4 GB) = 2.5
    assert rows["llama-3-70b"][6] == "none"          # 114.2 GB of activations > 79.1 GB
