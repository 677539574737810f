"""Chapter 03's engine: checkpointing from scratch and PyTorch's, plans, bytes, FLOPs, events.

References, independent of the code under test: the plain step's gradients (every plan and
implementation must give them back), ``Llama.forward`` (the driver must compute the same loss),
chapter 01's tracer (``tracing.trace_step`` / ``trace_fast``, which knows five policies), FLOPs
counted by hand in this file from the weight shapes (2*T*d_in*d_out a matmul forward, twice that
backward; attention's core 4*b*s^2*h forward, 10*b*s^2*h backward), and saved-tensor hooks.
"""

import torch
import pytest

from gpumem.errors import UsageError
from gpumem.memory import llama, models, recompute, recompute_cost, recompute_trace, tracing
from gpumem.memory.recompute_plans import first_layers, from_segments, plan

# fp32 on CPU re-runs bit for bit; the tolerances are torch's fp32 defaults, stated for other devices
RTOL, ATOL = 1.3e-6, 1e-5
PLANS = ("full", "every-2", "every-3", "every-other", "sqrt", "selective", "sac")
TINY6 = models.with_layers(models.get("tiny"), 6)


def _grads(net, inputs, targets, plan_name="none", impl="torch"):
    net.zero_grad(set_to_none=True)
    loss = recompute.loss_of(net, inputs, targets, "flash", plan_name, impl)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in net.parameters()]


@pytest.fixture(scope="module")
def fp32_model():
    torch.manual_seed(0)
    net = llama.Llama(TINY6)                      # default dtype: fp32
    tokens = torch.randint(0, TINY6.vocab, (2, 33), generator=torch.Generator().manual_seed(1))
    return net, tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)


def test_driver_is_the_llama(fp32_model):
    net, inputs, targets = fp32_model
    assert torch.equal(recompute.loss_of(net, inputs, targets), net(inputs, targets))


@pytest.mark.parametrize("impl", ["scratch", "torch", "deepspeed"])
@pytest.mark.parametrize("plan_name", PLANS)
def test_every_plan_gives_the_plain_gradients(fp32_model, plan_name, impl, monkeypatch):
    if plan_name == "sac" and impl != "torch":
        pytest.skip("SAC is PyTorch's")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    net, inputs, targets = fp32_model
    loss0, plain = _grads(net, inputs, targets)
    loss, grads = _grads(net, inputs, targets, plan_name, impl)
    assert torch.equal(loss, loss0)
    for got, want in zip(grads, plain):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
        assert torch.equal(got, want)             # on CPU the re-run is bit for bit


def test_checkpoint_keeps_only_its_inputs():
    """Saved-tensor hooks see what autograd keeps: a plain layer's activations, or, under the
    from-scratch Checkpoint, only the segment's inputs."""
    torch.manual_seed(0)
    net = llama.Llama(models.get("tiny"))
    block, seq = net.layers[0], 16
    x = torch.randn(2, seq, 64, requires_grad=True)
    cos, sin = llama.rope_tables(seq, 16, 500000.0, x.dtype)
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}

    def saved(fn):
        kept = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                kept[ptr] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sum(kept.values())
    plain = saved(lambda: block(x, cos, sin, "flash"))
    ckpt = saved(lambda: recompute.Checkpoint.apply(lambda h, c, s: block(h, c, s, "flash"), x, cos, sin))
    assert ckpt == 4 * x.numel() + 2 * 4 * seq * 16          # x, and the two RoPE tables (fp32)
    assert plain > 10 * ckpt


CASES = [(TINY6, 32, 2), (models.with_layers(models.get("mini"), 3), 48, 1)]   # GQA 8/2, odd depth
# PyTorch's checkpoint for every plan; the whole-segment re-run where it differs (segments)
RUNS = [(p, "torch") for p in ("none",) + PLANS] + [(p, "scratch") for p in ("full", "every-2", "every-other")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c[0].name)
def measured(request):
    """Every plan and implementation on one case, measured once (bytes and FLOPs)."""
    cfg, seq, batch = request.param
    return cfg, seq, batch, {(p, i): recompute_trace.measure(cfg, p, i, seq=seq, micro_batch=batch)
                             for p, i in RUNS}


def test_measured_bytes_equal_the_formula(measured):
    cfg, seq, batch, runs = measured
    for (plan_name, impl), m in runs.items():
        f = recompute_cost.activation_bytes(cfg, seq, batch, plan_name, impl)
        assert (m.saved, m.peak, m.layer_peak) == (f["saved"], f["peak"], f["layer_peak"]), (plan_name, impl)


def test_the_driver_measures_what_chapter_01s_tracer_measures(measured):
    """The tracer runs Llama.forward with its own policies; the driver runs the same plans."""
    cfg, seq, batch, runs = measured
    for policy in ("none", "every-2", "every-other", "selective") if cfg is TINY6 else ("full",):
        traced = tracing.trace_step(cfg, "mixed", "flash", policy, seq, batch, fake=False)
        assert runs[policy, "torch"].peak == traced.peaks["activations"], policy


def test_llama_3_8b_traces_equal_the_formula():
    cfg = models.get("llama-3-8b")
    for policy in ("full", "every-2", "every-other"):      # the notebook shows all five
        traced = tracing.trace_fast(cfg, "mixed", "flash", policy, 4096, 1)
        assert traced.peaks["activations"] == recompute_cost.activation_bytes(cfg, 4096, 1, policy)["peak"]


def test_plans_the_tracer_does_not_know_at_8b_width():
    """Chen's sqrt(n), SAC and longer segments, on fake tensors with Llama-3-8B's layer widths."""
    cfg = models.with_layers(models.get("llama-3-8b"), 4)
    for plan_name in ("sqrt", "sac", "every-3"):
        m = recompute_trace.measure(cfg, plan_name, seq=512, micro_batch=1, fake=True)
        f = recompute_cost.activation_bytes(cfg, 512, 1, plan_name)
        assert (m.saved, m.peak) == (f["saved"], f["peak"]), plan_name


def hand_flops(cfg, seq, batch):
    """FLOPs from the weight shapes, written out here."""
    T, h, kv, F, V = batch * seq, cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.ffn, cfg.vocab
    weights = [(h, h), (h, kv), (h, kv), (h, h), (h, F), (h, F), (F, h)]    # q k v o gate up down
    layer_mm = sum(2 * T * a * b for a, b in weights)
    core = 2 * (2 * batch * cfg.n_heads * seq * seq * cfg.head_dim)          # QK^T and PV
    head = 2 * T * h * V
    return {"layer": layer_mm + core, "core": core, "down": 2 * T * F * h, "head": head,
            "forward": cfg.n_layers * (layer_mm + core) + head,
            "backward": cfg.n_layers * (2 * layer_mm + 5 * core // 2) + 2 * head}


def test_flop_counts_by_hand(measured):
    cfg, seq, batch, runs = measured
    hand = hand_flops(cfg, seq, batch)
    L = cfg.n_layers
    want = {("full", "scratch"): L * hand["layer"],                         # one more forward of the layers
            ("full", "torch"): L * (hand["layer"] - hand["down"]),          # early stop: no last W_down
            ("every-2", "scratch"): L * hand["layer"],                      # spacing: same FLOPs
            ("every-2", "torch"): L * hand["layer"] - -(-L // 2) * hand["down"],
            ("every-other", "scratch"): -(-L // 2) * hand["layer"],
            ("selective", "torch"): L * hand["core"],
            ("sac", "torch"): 0,                                            # matmuls kept
            ("none", "torch"): 0}
    for (plan_name, impl), recompute_flops in want.items():
        m = runs[plan_name, impl]
        assert m.flops == {"forward": hand["forward"], "recompute": recompute_flops,
                           "backward": hand["backward"]}, (plan_name, impl)
        f = recompute_cost.step_flops(cfg, seq, batch, plan_name, impl)
        assert (f["forward"], f["backward"], f["recompute"]) == (hand["forward"], hand["backward"], recompute_flops)


def test_full_recompute_at_llama_3_8b_is_one_forward_of_the_layers():
    """FlopCounterMode on 8B-wide layers at s = 4096; the whole model by hand: 30.7 %, not 33 %."""
    cfg = models.get("llama-3-8b")
    probe = models.with_layers(cfg, 2)
    m = recompute_trace.measure(probe, "full", "scratch", seq=4096, micro_batch=1, fake=True)
    hand = hand_flops(probe, 4096, 1)
    assert m.flops == {"forward": hand["forward"], "recompute": 2 * hand["layer"], "backward": hand["backward"]}
    full = hand_flops(cfg, 4096, 1)
    share = 32 * full["layer"] / (full["forward"] + full["backward"])
    assert share == pytest.approx(recompute_cost.step_flops(cfg, 4096, 1, "full", "scratch")["overhead"])
    assert 0.30 < share < 1 / 3                  # below 2N/6N: the head is not re-run


def test_events_are_in_the_order_backward_needs_them():
    cfg = models.with_layers(models.get("mini"), 4)
    m = recompute_trace.measure(cfg, "every-2", seq=16, micro_batch=1)
    order = [(e["phase"], e["part"]) for e in m.events if e["flops"] and e["part"].startswith("L")]
    assert order == [("forward", "L0"), ("forward", "L1"), ("forward", "L2"), ("forward", "L3"),
                     ("recompute", "L2"), ("recompute", "L3"), ("backward", "L3"), ("backward", "L2"),
                     ("recompute", "L0"), ("recompute", "L1"), ("backward", "L1"), ("backward", "L0")]


def test_plans_and_bad_input():
    assert plan("full", 4).segments == ((0,), (1,), (2,), (3,))
    assert plan("every-other", 5).segments == ((0,), (2,), (4,)) and plan("every-other", 5).kept() == [1, 3]
    assert plan("sqrt", 16).segments[0] == (0, 1, 2, 3)
    assert first_layers(2, 5).segments == ((0,), (1,))
    assert from_segments([[2, 3], [0]], 4).segments == ((0,), (2, 3))
    for bad in ("every-1", "every", "sometimes", 3):
        with pytest.raises(UsageError, match="accepted"):
            plan(bad, 4)
    for bad in ([[0, 2]], [[0], [0, 1]], [[5]], [[]]):
        with pytest.raises(UsageError, match="segment"):
            from_segments(bad, 4)
    with pytest.raises(UsageError, match="accepted: torch"):
        recompute.run_checkpointed(lambda x: x, torch.ones(1), impl="scratch", sac=True)


def test_best_segment_length_is_not_sqrt_n():
    """Minimising checkpoints + one segment's re-run, by hand: ceil(n/k)*2 + k*layer (in s*b*h)."""
    for name, want in (("llama-3-8b", 1), ("llama-3-70b", 2), ("llama-3.1-405b", 3)):
        cfg = models.get(name)
        layer = recompute_cost.activation_bytes(cfg, 4096, 1, "none")["per_layer"] / (4096 * cfg.d_model)
        by_hand = min(range(1, 20), key=lambda k: -(-cfg.n_layers // k) * 2 + k * layer)
        assert recompute_cost.best_segment_length(cfg, 4096) == by_hand == want


def test_best_segment_length_with_the_logits_is_longer():
    """With the loss's logits (10*V bytes a token: bf16, fp32 copy, log-softmax) setting the
    step's peak, by hand in s*b*h: max(ceil(n/k)*2 + 10V/h + 4, ceil(n/k)*2 + k*layer)."""
    for name, seq, want in (("llama-3-8b", 4096, 7), ("llama-3-70b", 4096, 4), ("llama-3.1-405b", 8192, 3)):
        cfg = models.get(name)
        layer = recompute_cost.activation_bytes(cfg, seq, 1, "none")["per_layer"] / (seq * cfg.d_model)
        loss = 10 * cfg.vocab / cfg.d_model + 4          # logits + final norm and head input
        by_hand = min(range(1, 20), key=lambda k: max(-(-cfg.n_layers // k) * 2 + loss,
                                                       -(-cfg.n_layers // k) * 2 + k * layer))
        assert recompute_cost.best_segment_length(cfg, seq, with_loss=True) == by_hand == want


def test_private_apis_this_chapter_relies_on():
    from torch.utils.flop_counter import FlopCounterMode
    assert callable(FlopCounterMode._count_flops)
    assert torch._C._current_graph_task_id() == -1
    assert hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")


def test_gqa_attention_counts_query_heads_on_any_torch():
    """Grouped-query K/V (2 heads for Q's 4): the count is Q's heads of work, 2 x 2*b*h_q*s*s*d
    forward, by hand; widened to shapes, so a formula that asserts equal heads (PyTorch 2.11's,
    as the first H200 run met on CUDA, 2026-12-04) accepts it; equal heads pass unchanged."""
    from torch.utils.flop_counter import sdpa_flop

    from gpumem.memory import flops
    aten = torch.ops.aten
    q, kv = torch.empty(2, 4, 64, 16), torch.empty(2, 2, 64, 16)
    fwd = flops.gqa_as_heads(aten._scaled_dot_product_flash_attention, (q, kv, kv, 0.0, True))
    assert fwd[1] == fwd[2] == torch.Size([2, 4, 64, 16]) and fwd[0] is q and fwd[3:] == (0.0, True)
    assert sdpa_flop(*fwd, out_val=None) == 2 * (2 * 2 * 4 * 64 * 64 * 16)
    g = torch.empty(2, 4, 64, 16)
    bwd = flops.gqa_as_heads(aten._scaled_dot_product_efficient_attention_backward, (g, q, kv, kv, g))
    assert bwd[2] == bwd[3] == torch.Size([2, 4, 64, 16]) and bwd[4] is g
    same = (q, q, q)
    assert flops.gqa_as_heads(aten._scaled_dot_product_flash_attention, same) is same
    assert flops.gqa_as_heads(aten.mm, (q, kv)) == (q, kv)
