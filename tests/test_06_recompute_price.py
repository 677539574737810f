"""One recompute price everywhere (issue 17, section 4): the two prices of a re-run counted by hand,
the planner pricing each plan's re-run as its framework runs it, and chapters 03 and 06 grading the
note's checkpointing rows alike."""

from dataclasses import replace

import nbformat
import pytest

from conftest import ROOT
from gpumem.memory import gpus, models
from gpumem.planner import cost as planner_cost
from gpumem.planner.memory import Layout

SEQ = 4096


def hand_prices(d=4096, kv=1024, F=14336, V=128256, L=32, T=SEQ, every=1, causal=False):
    """Llama-3-8B (Meta's config: d 4096, 8 KV heads of 128, FFN 14,336, vocabulary 128,256, 32
    layers), one sequence of T tokens, as torch's FlopCounterMode counts: a matmul is 2*m*n*k forward
    and twice that backward; attention's core 4*T^2*d forward (QK^T, PV) and 10*T^2*d backward (the
    flash kernel recomputes QK^T, then four matmuls); the head 2*T*d*V forward. ``every``: one layer
    in ``every`` is checkpointed, alone. The whole-segment re-run repeats those layers' forward; the
    early-stop re-run stops before each segment's last matmul, W_down (2*T*F*d). ``causal``: the
    core as a causal flash kernel executes it, half of both (what the planner's seconds use)."""
    mm = 2 * T * (2 * d * d + 2 * d * kv + 3 * d * F)
    core = 4 * T * T * d // (2 if causal else 1)
    head = 2 * T * d * V
    fwd_bwd = L * (mm + core) + head + L * (2 * mm + 10 * T * T * d // (2 if causal else 1)) + 2 * head
    n = L // every
    whole = n * (mm + core)
    early = whole - n * 2 * T * F * d
    return 100 * whole / fwd_bwd, 100 * early / fwd_bwd


def test_the_two_prices_by_hand():
    whole, early = hand_prices()
    assert (round(whole, 1), round(early, 1)) == (30.7, 23.5)       # issue 17: +30.7 % and +23.5 %
    half_whole, half_early = hand_prices(every=2)
    assert (round(half_whole, 2), round(half_early, 1)) == (15.33, 11.8)
    cfg = models.get("llama-3-8b")
    lay = Layout("mixed", 3, "full", "flash", "none", "cpu", 1, 1, 1, 8, 8)
    assert 100 * planner_cost.recompute_share(cfg, SEQ, lay) == pytest.approx(early, rel=1e-12)
    assert 100 * planner_cost.recompute_share(cfg, SEQ, replace(lay, checkpoint="every-other")) == \
        pytest.approx(half_early, rel=1e-12)


# (layout, expected re-run): DeepSpeed's model code checkpoints with torch.utils.checkpoint(use_reentrant=
# False) (early stop); DeepSpeed's PipelineModule re-runs with deepspeed.checkpointing.checkpoint for its
# interval policies (full, every-2: whole segment) and leaves every-other to the model code (torch);
# Megatron-DeepSpeed's --recompute-granularity full re-runs whole segments.
CASES = [
    (Layout("mixed", 3, "full", "flash", "none", "cpu", 1, 1, 1, 8, 8), "torch"),
    (Layout("mixed", 3, "full", "flash", "none", "cpu", 1, 2, 1, 4, 8), "torch"),
    (Layout("mixed", 1, "full", "flash", "none", "cpu", 1, 1, 2, 4, 8), "scratch"),
    (Layout("mixed", 1, "every-2", "flash", "none", "cpu", 1, 1, 2, 4, 8), "scratch"),
    (Layout("mixed", 1, "every-other", "flash", "none", "cpu", 1, 1, 2, 4, 8), "torch"),
    (Layout("mixed", 1, "full", "flash", "none", "cpu", 1, 2, 2, 2, 8), "scratch"),
    (Layout("mixed", 1, "every-other", "flash", "none", "cpu", 1, 2, 2, 2, 8), "scratch"),
]


@pytest.mark.parametrize("lay,impl", CASES, ids=lambda v: v.label() if isinstance(v, Layout) else v)
def test_planner_prices_each_plans_rerun_as_its_framework_runs_it(lay, impl):
    from gpumem.planner import config as planner_config
    code = planner_config.model_code(lay)
    megatron = planner_config.megatron_args(models.get("llama-3-8b"), lay)
    pipe_interval = "activation_checkpoint_interval=0" not in code.get("pipeline", "activation_checkpoint_interval=0")
    if impl == "torch":                   # the plan's model code is torch.utils.checkpoint, non-reentrant
        assert lay.framework == "deepspeed" and "torch.utils.checkpoint" in code["checkpoint"]
        assert megatron is None and not pipe_interval
    elif megatron is not None:            # Megatron's recompute (its CheckpointFunction re-runs it all)
        assert megatron[megatron.index("--recompute-granularity") + 1] == "full"
    else:                                 # PipelineModule's interval: deepspeed.checkpointing.checkpoint
        assert pipe_interval
    assert planner_cost.rerun_impl(lay) == impl
    cfg, h100 = models.get("llama-3-8b"), gpus.get("h100-80gb")
    every = 2 if lay.checkpoint == "every-other" else 1
    whole, early = hand_prices(every=every, causal=True)      # the seconds count attention causally
    plain = planner_cost.step_seconds(cfg, SEQ, replace(lay, checkpoint="none"), h100)["compute"]
    ckpt = planner_cost.step_seconds(cfg, SEQ, lay, h100)["compute"]
    assert ckpt / plain == pytest.approx(1 + (whole if impl == "scratch" else early) / 100, rel=1e-12)


def test_chapters_03_and_06_grade_the_checkpointing_rows_alike():
    from gpumem.chapters.ch03_activation_checkpointing import claims as c3, scale
    from gpumem.chapters.ch06_combining_strategies import claims as c6
    assert planner_cost.RERUN == scale.PRICES                      # one name for each price
    by3, by6 = {c.id: c for c in c3.CLAIMS}, {c.id: c for c in c6.CLAIMS}
    whole, _ = hand_prices()
    half, _ = hand_prices(every=2)
    for a, b, note, ours in (("5a", "8b-ac-t", 30, whole), ("8b''", "8b-ac2-t", 15, half),
                             ("8b", "8b-ac", 70, None), ("8b'", "8b-ac2", 50, None)):
        x, y = by3[a], by6[b]
        assert (x.note, x.ours(), x.verdict()) == (y.note, y.ours(), y.verdict()) and y.note == note, (a, b)
        if ours is not None:
            assert y.ours() == pytest.approx(ours, rel=1e-12) and y.verdict() == "agrees"
            assert "whole-segment re-run" in y.what and "early-stop re-run" in y.why()


def test_chapter06_prose_names_the_price_not_a_third():
    nb = nbformat.read(ROOT / "notebooks" / "06_combining_strategies.ipynb", as_version=4)
    text = " ".join(c.source for c in nb.cells if c.cell_type == "markdown").replace("\n", " ")
    assert "a third more compute" not in text and "(+33 %)" not in text
    assert "early-stop re-run" in text


def test_config_text_within_100_columns_and_keeps_every_fsdp_field():
    """The plan's FSDP and model-code fields are plain words, wrapped within 100 columns (the
    DeepSpeed config stays JSON, as it is pasted); no field is dropped by the wrapping."""
    import json
    from gpumem.chapters.ch06_combining_strategies import diagrams, scenarios
    for name in ("70b-8gpu", "405b-1024gpu"):
        plan = scenarios.ask(name).best
        text = diagrams.config_text(plan)
        assert max(len(line) for line in text.splitlines()) <= 100
        assert json.dumps(plan.deepspeed, indent=2) in text if plan.deepspeed is not None else \
            "runs without DeepSpeed" in text and " ".join(plan.megatron[:4]) in text
        flat = " ".join(text.split())
        for key, value in (plan.fsdp or {}).items() | plan.model_code.items():
            assert f"{key}: {' '.join(str(value).split())}" in flat
