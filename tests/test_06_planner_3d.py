"""Chapter 06: the planner's layout families, each re-derived by hand from the weight shapes.

Families: ZeRO-3 data parallelism alone, DeepSpeed AutoTP with ZeRO (no sequence parallelism),
DeepSpeed's pipeline engine with ZeRO-1, and Megatron-DeepSpeed's tensor x pipeline x ZeRO-1
(with sequence parallelism). The derivations below are written from the shapes and the papers'
formulas, not from the planner's code; the 405B scenario's top plan is re-derived the same way.
"""

import math

import pytest

from gpumem.memory import models
from gpumem import planner
from gpumem.planner import memory as planner_memory
from gpumem.planner.memory import Layout

CFG405 = models.get("llama-3.1-405b")
CFG70 = models.get("llama-3-70b")
S = 4096


def c(n: int, t: int) -> int:
    return -(-n // t)


def stage_params(cfg, tp: int, pp: int) -> int:
    """The last stage of a tp x pp split by hand: ceil(L/pp) layers of matrices / tp + two
    replicated norms each, the head V x d / tp and the final norm (the whole model when pp = 1)."""
    d, kv, F, V = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.ffn, cfg.vocab
    layer = c(2 * d * d + 2 * d * kv + 3 * d * F, tp) + 2 * d
    if pp == 1:
        return cfg.n_layers * layer + 2 * c(V * d, tp) + d
    return math.ceil(cfg.n_layers / pp) * layer + c(V * d, tp) + d


def sp_layer(cfg, T: int, tp: int) -> int:
    """One layer's saved bytes under Megatron sequence parallelism, flash, bf16, fused norms:
    every group / tp (Korthikanti et al. 2022, with GQA's k/v widths and the fp32 logsumexp)."""
    h, kv, F, a = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.ffn, cfg.n_heads
    groups = [2 * T * h + 4 * T, 2 * T * h, 2 * T * (h + 2 * kv), 2 * T * h, 4 * a * T,
              2 * T * h + 4 * T, 2 * T * h, 8 * T * F]
    return sum(c(g, tp) for g in groups)


def sp_outside(cfg, T: int, tp: int) -> int:
    """RoPE's cos/sin tables (whole), the final norm and the head input split along the sequence."""
    h = cfg.d_model
    return 2 * 2 * S * cfg.head_dim + c(2 * T * h + 4 * T + 2 * T * h, tp)


def layer_params(cfg, tp: int) -> int:
    d, kv, F = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.ffn
    return c(2 * d * d + 2 * d * kv + 3 * d * F, tp) + 2 * d


def test_megatron_deepspeed_layout_by_hand():
    """tp 8 x pp 16 x dp 8, mixed ZeRO-1, no checkpointing. 405B's 126 layers do not divide over
    16 stages: Llama 3 takes one layer off the first and the last stage (arXiv:2407.21783, 3.3.2),
    7 + 14 x 8 + 7. Stage 0 holds 7 layers and the embedding with 16 micro-batches in flight (1F1B),
    stage 1 8 layers with 15, the last stage 7 layers, the head and the loss with 1: stage 1 is
    the fullest. (Changed by issue 18: every stage used to be counted with ceil(126/16) = 8 layers.)"""
    lay = Layout(recipe="mixed", zero=1, checkpoint="none", attention="flash", offload="none", device="cpu",
                 micro_batch=1, tp=8, pp=16, dp=8, n_micro=128)
    assert lay.framework == "megatron-deepspeed" and lay.sequence_parallel
    d, V = CFG405.d_model, CFG405.vocab
    n_end = 7 * layer_params(CFG405, 8) + c(V * d, 8) + d          # the last stage: head + final norm
    n_mid = 8 * layer_params(CFG405, 8)
    where: dict = {}
    mem = planner_memory.per_gpu(CFG405, S, lay, where=where)

    def states(n):   # ZeRO-1: whole bf16 weights and gradients, fp32 master, m, v over dp 8, two buckets
        return 4 * n + 12 * c(n, 8) + 4 * min(50_000_000, n)
    first = 16 * 7 * sp_layer(CFG405, S, 8) + sp_outside(CFG405, S, 8)
    last = 7 * sp_layer(CFG405, S, 8) + sp_outside(CFG405, S, 8) + c(10 * S * V + 8, 8)
    middle = 15 * 8 * sp_layer(CFG405, S, 8) + sp_outside(CFG405, S, 8)
    assert states(n_mid) + middle > states(n_end) + max(first, last)
    assert where == {"stage": 1, "stage_layers": 8}
    assert mem["params"] == 2 * n_mid and mem["grads"] == 2 * n_mid
    assert mem["optimizer"] == 12 * c(n_mid, 8) and mem["buffers"] == 4 * 50_000_000
    assert mem["activations"] == middle and mem["total"] == states(n_mid) + middle


def test_autotp_without_pipeline_keeps_no_sequence_parallelism():
    lay = Layout(recipe="mixed", zero=3, checkpoint="none", attention="flash", offload="none", device="cpu",
                 micro_batch=1, tp=2, pp=1, dp=4, n_micro=16)
    assert lay.framework == "deepspeed" and not lay.sequence_parallel
    sp = Layout(**{**lay.__dict__, "pp": 2, "zero": 1, "dp": 2})
    # the same layer under SP is smaller: the norms' and projections' inputs are split too
    assert planner_memory.stage_activations(CFG70, S, sp)["per_layer"] < \
        planner_memory.stage_activations(CFG70, S, lay)["per_layer"]


def test_pipeline_zero1_and_zero3_families_by_hand():
    pp = Layout(recipe="mixed", zero=1, checkpoint="full", attention="flash", offload="none", device="cpu",
                micro_batch=1, tp=1, pp=4, dp=2, n_micro=32)
    n = stage_params(CFG70, 1, 4)
    st = planner_memory.states_part(CFG70, pp)
    assert (st["params"], st["grads"], st["optimizer"]) == (2 * n, 2 * n, 12 * c(n, 2))
    z3 = Layout(recipe="mixed", zero=3, checkpoint="full", attention="flash", offload="none", device="cpu",
                micro_batch=1, tp=1, pp=1, dp=8, n_micro=8)
    n = stage_params(CFG70, 1, 1)
    st = planner_memory.states_part(CFG70, z3)
    norms = (2 * CFG70.n_layers + 1) * CFG70.d_model                # persistent: below the threshold, whole
    assert st["params"] == 2 * c(n, 8) + 2 * norms and st["grads"] == 2 * c(n, 8)
    assert st["optimizer"] == 12 * c(n, 8)


def test_megatron_plans_refuse_zero2_3_and_offload_and_emit_arguments():
    assert not planner.allowed("mixed", 2, 4, "none", "cpu", tp=2)
    assert not planner.allowed("mixed", 1, 4, "optimizer", "cpu", tp=2)
    assert planner.allowed("mixed", 1, 4, "none", "cpu", tp=2)
    lay = Layout(recipe="mixed", zero=1, checkpoint="every-2", attention="flash", offload="none", device="cpu",
                 micro_batch=2, tp=4, pp=2, dp=1, n_micro=8)
    args = planner.megatron_args(CFG70, lay)
    flag = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert flag["--tensor-model-parallel-size"] == "4" and flag["--pipeline-model-parallel-size"] == "2"
    assert flag["--global-batch-size"] == "16" and flag["--micro-batch-size"] == "2"
    assert flag["--recompute-method"] == "uniform" and flag["--recompute-num-layers"] == "2"
    assert "--sequence-parallel" in args and flag["--zero-stage"] == "1"
    cfg = planner.deepspeed_config(CFG70, lay)
    assert cfg["zero_optimization"]["stage"] == 1 and "tensor_parallel" not in cfg


def test_405b_top_plan_is_a_3d_layout_re_derived():
    """The 405B scenario (1,024 H100s): the top plan is a Megatron-Core 3-D layout with tp 8 (its
    overlaps hide the tensor-parallel collectives; context parallelism buys more micro-batches, so a
    shorter bubble); Llama 3's own tp 8 x pp 16 (no cp, no vp) is within 10 % of it and loses on
    the bubble; that layout's bytes and compute time are re-derived from the shapes and
    6*N*tokens-style FLOPs."""
    r = planner.plan("llama-3.1-405b", 1024, "h100-80gb", seq=S, global_batch=1024, advise=False)
    top = r.best
    assert top.layout.framework == "megatron-core" and top.layout.tp == 8 and top.layout.zero <= 1
    best = next(p for p in r.plans if p.layout.pp == 16 and p.layout.cp == 1 and p.layout.vp == 1)
    lay = best.layout
    assert best.as_dict()["framework"] == "megatron-core" and lay.tp == 8 and lay.zero <= 1
    assert top.time["total"] <= best.time["total"] <= top.time["total"] * 1.10
    assert best.time["pipeline_bubble"] > top.time["pipeline_bubble"]
    assert best.as_dict()["layout"]["stage_layers"] == [7] + [8] * 14 + [7]   # Llama 3's split (issue 18)
    n = 8 * layer_params(CFG405, 8)                # the fullest stage: stage 1's 8 layers, no vocabulary
    opt = 12 * c(n, lay.dp) if lay.zero == 1 else 12 * n
    # Megatron-Core with --bf16: bf16 weights (2 B) and fp32 main gradients (4 B, forced for bf16 by
    # megatron/training/arguments.py, not sharded by the distributed optimizer), 12 B of Adam over dp
    assert best.memory["params"] + best.memory["grads"] + best.memory["optimizer"] == 2 * n + 4 * n + opt
    assert best.memory["buffers"] == 0            # no DeepSpeed buckets: Megatron reduces its buffers in place
    assert best.memory["total"] <= best.memory["usable"]
    # compute: per token 2 FLOPs per weight forward, 4 backward, plus attention's core as a causal
    # kernel runs it (half of PyTorch's s x s count: 2 s h per layer forward, 5 s h backward) and the
    # head, over tp * pp GPUs at the planner's 54 % kernel share of peak (timing.compute.KERNEL_SHARE)
    d, L, V = CFG405.d_model, CFG405.n_layers, CFG405.vocab
    matmul = CFG405.n_layers * (2 * d * d + 2 * d * CFG405.n_kv_heads * CFG405.head_dim + 3 * d * CFG405.ffn) + V * d
    per_token = 6 * matmul + 7 * S * d * L
    tokens = lay.micro_batch * lay.n_micro * S
    peak = 989e12
    assert math.isclose(best.time["compute"], per_token * tokens / (lay.tp * lay.pp) / (0.54 * peak), rel_tol=1e-9)
    # 1F1B (Narayanan et al. 2021, s. 2.2.1): (p - 1)/m of the micro-batches' own stage time, which
    # holds their compute and their exposed tensor-parallel collectives
    own = best.time["compute"] + best.time["tensor_parallel"] + best.time["attention_scores"]
    assert math.isclose(best.time["pipeline_bubble"], own * (lay.pp - 1) / lay.n_micro, rel_tol=1e-9)


def test_1f1b_timeline_idles_the_bubble_share():
    from gpumem.chapters.ch06_combining_strategies import diagrams
    for p, m in ((2, 3), (4, 6), (4, 12), (8, 8)):
        last = diagrams.one_f_one_b(p, m).splitlines()[-1]
        slots, idle = 2 * (m + p - 1), 2 * (p - 1) * p        # by hand: each stage idles 2 (p - 1) slots
        assert f"{slots} slots, {idle} of {p * slots} idle" in last


def test_quiz_bubble_and_slow_network_by_hand():
    from gpumem.chapters.ch06_combining_strategies import quiz
    for seed in range(6):
        quiz.QUIZ.seed(seed)
        b, s = quiz.QUIZ._get("bubble"), quiz.QUIZ._get("slow-network")
        n = b.numbers
        assert b.value() == math.ceil(20 * (n["pp"] - 1) - 1e-9)      # (pp - 1)/m <= 5 %
        assert n["acts_m"] == n["acts_pp"] > n["acts_1"]              # 1F1B: at most pp micro-batches held
        n = s.numbers   # one link per node at 94 % (nccl-tests #290: 47 of 50 GB/s); latency < 1 %
        moved = n["n_micro"] * 3 * 2 * n["psi"] * 15 / 16 / (0.94 * n["link_gb"] * 1e9)
        assert s.value() == pytest.approx(max(0.0, moved - n["compute_s"]), rel=5e-3)


def test_lab_reflection_fails_a_plan_that_ignores_the_slow_link():
    """A choose_plan that answers the node-network optimum whatever the link passes every case
    but the slow-link hybrid-sharding one, which names the unchanged plan."""
    from gpumem.chapters.ch06_combining_strategies import labcheck
    import functools
    ref = functools.lru_cache(maxsize=None)(labcheck.reference)
    drawn = [c for c in labcheck.cases(seed=0, ref=ref) if c[4] is None]    # before the team's limits
    answers = {}
    for _, family, case, link, _ in drawn:
        link = None if family and family.name == "hybrid sharding" else link    # stubborn there only
        best = min(ref(case, link).plans, key=lambda p: p.time["total"])
        answers[case] = {k: getattr(best.layout, k) for k in labcheck.KEYS + tuple(labcheck.OPTIONAL)}

    def stubborn(model, gpus_, gpu, seq, batch, inter_node=None, host_per_node=None, one_node=False):
        return answers[(model, gpus_, gpu, seq, batch)]
    # case by case, as check() grades them: stubborn is a table of answers, which check() refuses first
    rows = [(family, *labcheck.grade_case(stubborn, case, link, family, ref)) for _, family, case, link, _ in drawn]
    assert [status for _, status, _ in rows[:-1]] == ["ok"] * (len(drawn) - 1), rows
    family, status, detail = rows[-1]
    assert family.name == "hybrid sharding" and status == "wrong" and "did not change" in detail, rows[-1]
    refused = labcheck.check({"choose_plan": stubborn}, show=False, seed=0, ref=ref).rows
    assert refused[1].case == "a search, not a table of answers", refused
