"""The memory timeline (``gpumem.memory.timeline``), the AdamW implementations' workspace, and
the time formulas (``gpumem.timing.compute``).

The timeline is checked against the tracer's own peak bookkeeping and against stock MemTracker;
AdamW's workspace against hand counts (one copy of v for foreach, 12 bytes x the largest tensor
for the per-tensor master-weight AdamW); time against 6 x params x tokens worked by hand.
"""

import math

import pytest
import torch

from gpumem.errors import UsageError
from gpumem.memory import accounting, models, timeline, tracing
from gpumem.timing import compute


@pytest.fixture(scope="module")
def step():
    """One traced step of an 8B-width model, 4 layers, with its timeline, without and with checkpointing."""
    cfg = models.with_layers(models.get("llama-3-8b"), 4)
    return cfg, {p: timeline.record(cfg, "mixed", policy=p, seq=512) for p in ("none", "full")}


def test_timeline_reaches_the_traced_peaks(step):
    _, tls = step
    for tl in tls.values():
        tr = tl.trace
        assert {c: max(s) for c, s in tl.series.items()} == tr.peaks
        assert tl.total(tl.peak()) == tr.total_peak
        assert [p for p, _, _ in tl.spans()] == ["forward", "backward", "optimizer"]


def test_timeline_tracker_equals_stock_memtracker():
    from torch.distributed._tools.mem_tracker import MemTracker
    cfg = models.get("mini")
    model, opt, mode = tracing.build(cfg, "mixed", fake=True)
    with mode:
        tokens = torch.randint(0, cfg.vocab, (2, 33))
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)
        stock = MemTracker()
        stock.track_external(model, opt)
        with stock:
            tracing.training_step(model, opt, inputs, targets, "flash", "none")
    peak = next(iter(stock.get_tracker_snapshot("peak").values()))["Total"]
    tl = timeline.record(cfg, "mixed", seq=32, micro_batch=2)
    assert max(tl.total(i) for i in range(len(tl))) == peak


def test_checkpointing_does_not_move_the_unsharded_peak_but_does_under_zero3(step):
    """Unsharded, the peak is in the optimizer step, after the activations are freed; per GPU
    under ZeRO-3 the states shrink and the activations decide."""
    cfg, tls = step
    none, full = tls["none"], tls["full"]
    assert none.phases[none.peak()] == full.phases[full.peak()] == "optimizer"
    assert none.total(none.peak()) == full.total(full.peak())
    assert none.at(none.peak())["activations"] <= 8          # the loss scalar(s) only
    g = accounting.zero3_gathered(cfg, "mixed", prefetch_bucket=1_000_000)
    z_none, z_full = none.zero3_per_gpu(64, g), full.zero3_per_gpu(64, g)
    assert z_none.phases[z_none.peak()] != "optimizer" and z_none.at(z_none.peak())["activations"] > 0
    # per GPU, checkpointing lowers the peak by at least half of what it saves in activations
    saved = tls["none"].trace.peaks["activations"] - tls["full"].trace.peaks["activations"]
    assert z_none.total(z_none.peak()) - z_full.total(z_full.peak()) > saved / 2


def test_zero3_view_divides_states_not_activations(step):
    cfg, tls = step
    tl = tls["none"]
    g = accounting.zero3_gathered(cfg, "mixed", prefetch_bucket=1_000)
    z = tl.zero3_per_gpu(8, g)
    for i in range(0, len(tl), 97):
        for cat in ("params", "optimizer"):
            assert z.series[cat][i] == math.ceil(tl.series[cat][i] / 8)
        fresh = max(0, tl.series["grads"][i] - tl.series["grads"][i - 1]) if tl.phases[i] == "backward" else 0
        partition = math.ceil(2 * cfg.n_params() / 8)           # bf16 gradient shard, held all step
        assert z.series["grads"][i] == max(partition, math.ceil(tl.series["grads"][i] / 8)) + fresh
        assert z.series["activations"][i] == tl.series["activations"][i]
        expected = {"forward": g.gathered, "backward": g.gathered, "optimizer": 0}[tl.phases[i]]
        assert z.series["gathered"][i] == expected + g.reduce


def test_thinned_keeps_the_peak(step):
    _, tls = step
    tl = tls["none"]
    thin = tl.thinned(200)
    assert len(thin) <= 210 and thin.total(thin.peak()) == tl.total(tl.peak())


def test_adamw_workspace_by_implementation():
    cfg = models.get("llama-3-8b")
    n, largest = cfg.n_params(), cfg.largest_layer_params()
    temps = {impl: tracing.trace_fast(cfg, "pure-bf16", seq=256, adamw=impl) for impl in ("for-loop", "foreach", "fused")}
    assert temps["foreach"].peaks["temporaries"] == 2 * n          # _foreach_sqrt: a bf16 copy of all of v
    loop = temps["for-loop"].peaks["temporaries"]
    assert 4 * largest <= loop <= 4 * largest + 2 * cfg.d_model    # sqrt(v) and its quotient, largest tensor
    assert temps["fused"].peak_moments["temporaries"].phase == "backward"   # none in the step
    fp32 = tracing.trace_fast(cfg, "fp32", seq=256, adamw="foreach")
    assert fp32.peaks["temporaries"] == 4 * n
    mixed = tracing.trace_fast(cfg, "mixed", seq=256)
    assert mixed.peaks["temporaries"] == 12 * largest              # fp32 grad, sqrt(v), quotient
    with pytest.raises(UsageError, match="for-loop"):
        tracing.trace_step("tiny", "mixed", adamw="fused")


def test_train_flops_and_seconds_by_hand():
    n = models.get("llama-3-70b").n_params()
    assert compute.train_flops(n, 4096) == 6 * 70_553_706_496 * 4096
    assert compute.train_flops(n, 4096, recompute=True) == 8 * 70_553_706_496 * 4096
    # H100 SXM: 989 TFLOP/s dense bf16, at 40 % MFU
    assert compute.seconds(6 * n * 4096, "h100-80gb", 0.4) == pytest.approx(6 * n * 4096 / (0.4 * 989e12))
    cfg = models.get("llama-3-70b")
    assert compute.attention_flops(cfg, 4096) == 12 * 80 * 8192 * 4096 * 4096
    with pytest.raises(UsageError):
        compute.seconds(1.0, "t4")                                     # no bf16 tensor cores
    with pytest.raises(UsageError):
        compute.seconds(1.0, "h100-80gb", mfu=1.5)


def test_optimizer_traffic_by_hand():
    # mixed: read bf16 grad 2 + master 4 + m 4 + v 4; write master, m, v and the bf16 weight
    assert compute.optimizer_bytes_per_param("mixed") == (2 + 4 + 4 + 4) + (4 + 4 + 4 + 2)
    # pure bf16: read grad, weight, m, v; write weight, m, v
    assert compute.optimizer_bytes_per_param("pure-bf16") == 4 * 2 + 3 * 2
    n = 8_000_000
    assert compute.optimizer_seconds(n, "mixed", "h100-80gb", gpus=8, zero=1) == pytest.approx(28 * n / 8 / 3.35e12)


def test_six_psi_t_against_pytorchs_flop_counter():
    """FlopCounterMode counts every matmul of a real step: 6 FLOPs per token per weight of the
    linear layers (the embedding is a lookup, norms are pointwise) plus the naive kernel's
    attention matmuls, QK^T and PV forward and their gradients: 12*L*h*s per token."""
    from torch.utils.flop_counter import FlopCounterMode
    from gpumem.memory.llama import Llama
    cfg, s, b = models.get("mini"), 64, 2
    torch.manual_seed(0)
    model = Llama(cfg)
    tokens = torch.randint(0, cfg.vocab, (b, s + 1))
    counter = FlopCounterMode(display=False)
    with counter:
        model(tokens[:, :-1], tokens[:, 1:].reshape(-1), kernel="naive").backward()
    linear = cfg.n_params() - cfg.vocab * cfg.d_model - (2 * cfg.n_layers + 1) * cfg.d_model
    assert counter.get_total_flops() == compute.train_flops(linear, s * b) + compute.attention_flops(cfg, s, b)


def test_working_set_on_the_timeline_counts_the_embedding_gradient_once(step):
    """At the end of backward the embedding's gradient is still being made (a traced temporary,
    2 x vocab x h bytes); the working set then holds the embedding gathered and the reduce bucket,
    and adds no second copy of that gradient (issue 17: 2.1 GB counted twice before)."""
    cfg, tls = step
    tl = tls["full"]
    g = accounting.zero3_gathered(cfg, "mixed")
    z = tl.zero3_per_gpu(8, g, cfg)
    emb = 2 * cfg.vocab * cfg.d_model
    i = next(i for i in range(len(tl)) if tl.phases[i] == "backward" and tl.modules[i] == "embed"
             and tl.series["temporaries"][i] >= emb)
    assert z.series["gathered"][i] == emb + g.reduce          # only the embedding is whole then
    assert z.series["temporaries"][i] == tl.series["temporaries"][i]
    assert z.total(i) - z.total(i - 1) == tl.total(i) - tl.total(i - 1) <= emb   # made once
    assert max(z.series["gathered"]) == g.params + g.reduce   # the replay's fullest moment
    assert all(z.series["gathered"][k] == g.reduce for k in range(len(z)) if z.phases[k] == "optimizer")
