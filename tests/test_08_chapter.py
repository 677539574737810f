"""Chapter 08's claims, quiz and at-scale figures, each redone by hand from the models' shapes and
the libraries' documented block sizes (NF4: 4-bit codes, a uint8 absmax per 64 weights, an fp32
scale per 256 absmaxes, QLoRA arXiv:2305.14314 section 3; 8-bit AdamW: one byte per moment and
an fp32 absmax per 256, bitsandbytes Optimizer2State), not from the code's own output.
The real CPU runs are tests/test_08_finetune_run.py's."""

import math
import random

import pytest

from gpumem.chapters import CHAPTERS
from gpumem.chapters.ch08_finetuning import claims, diagrams, quiz, scale
from gpumem.memory import models

NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)          # 4.126953125
SEEDS = range(25)


def ceil(a, b):
    return -(-a // b)


def quantised(h, q, kv, f, layers):
    """Weights of every block's seven projections (q_dim = h for these Llamas)."""
    return layers * (h * q + 2 * h * kv + q * h + 3 * h * f)


def lora(h, q, kv, f, layers, r, targets=("q", "k", "v", "o", "gate", "up", "down")):
    dims = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, f), "up": (h, f), "down": (f, h)}
    return layers * sum(r * (dims[t][0] + dims[t][1]) for t in targets)


# Llama-3-70B (Meta's params.json): d 8192, 80 layers, 64 heads of 128, 8 kv heads, FFN 28,672
Q70 = quantised(8192, 8192, 1024, 28672, 80)
N70 = 70_553_706_496
# LLaMA-65B (arXiv:2302.13971 Table 2): d 8192, 80 layers, 64 heads, no GQA, FFN 22,016, vocab 32,000
Q65 = quantised(8192, 8192, 8192, 22016, 80)
N65 = Q65 + 2 * 32000 * 8192 + (2 * 80 + 1) * 8192


def test_registered_with_its_quiz():
    entry = next(c for c in CHAPTERS if c.number == "08")
    assert entry.folder == "ch08_finetuning" and entry.quiz == "quiz:QUIZ"


def test_hand_shapes():
    assert Q70 == 68_451_041_280 and Q65 == 64_760_053_760 and N65 == 65_285_660_672
    assert lora(8192, 8192, 1024, 28672, 80, 16) == 207_093_760
    assert scale.LLAMA_65B.n_params() == N65


def test_nf4_and_double_quantisation_claims():
    c = {x.id: x for x in claims.CLAIMS}
    assert c["qlora-bits"].ours() == pytest.approx(NF4_BITS, abs=1e-12) and c["qlora-bits"].verdict() == "agrees"
    saving = Q65 * (32 / 64 - (NF4_BITS - 4)) / 8       # 0.373 bits per quantised weight
    assert c["qlora-dq-65b"].ours() == pytest.approx(saving, rel=1e-12)
    assert 2.9e9 < saving < 3.1e9 and c["qlora-dq-65b"].verdict() == "agrees"


def test_peft_8b_rank_16_count():
    # Llama-3-8B: d 4096, 32 layers, kv 8 x 128 = 1024, FFN 14,336
    hand = 16 * (4096 + 4096 + 2 * (4096 + 1024) + 4096 + 4096 + 2 * (4096 + 14336) + 14336 + 4096) * 32
    assert hand == 41_943_040
    assert next(x for x in claims.CLAIMS if x.id == "peft-8b-r16").ours() == pytest.approx(hand / 1e6, abs=1e-9)


def qlora_states(q, n, n_a, adapter_bytes, biggest, tensors):
    """QLoRA states by hand: packed codes, uint8 absmax per 64, fp32 per 256 absmaxes, ~1.1 KiB of
    tables per tensor (code, offset, nested map), bf16 for the rest, the adapters' bytes, and one
    dequantised bf16 matrix with fp32 absmaxes."""
    base = q / 2 + q / 64 + 4 * q / (64 * 256) + tensors * (4 + 64 + 1024) + 2 * (n - q)
    return base + adapter_bytes * n_a + 2 * biggest + 4 * biggest / 64


def test_rtx3090_scenario_by_hand():
    r = scale.rtx3090("llama-3-70b")
    n_a = lora(8192, 8192, 1024, 28672, 80, 16)
    # fp32 adapter, gradient, m, v: 16 B each, + torch AdamW's 4 B step per adapter tensor
    hand = qlora_states(Q70, N70, n_a, 16, 8192 * 28672, 7 * 80) + 4 * 14 * 80
    assert r["states"] == pytest.approx(hand, rel=1e-6)
    assert r["capacity"] == 24_576 * 2**20
    usable = 24_576 * 2**20 - 2**30 - int(0.05 * 24_576 * 2**20)   # context + 5 %, no NCCL on one GPU
    assert r["usable"] == usable
    assert r["short_by"] == r["states"] + r["activations"] - usable > 0
    assert r["pageable"] == 8 * n_a                                 # the adapters' two fp32 moments
    assert r["pcie_s"] == pytest.approx(3 * (r["short_by"] - 8 * n_a) / 31.5e9)
    # compute: forward + inputs' gradients + re-run, 6 N T, + 6 n_a T, at 40 % of 71 TFLOP/s
    assert r["compute_s"] == pytest.approx((6 * N70 + 6 * n_a) * 512 / (0.4 * 71e12))
    r8 = scale.rtx3090("llama-3-8b")
    assert r8["short_by"] == 0 and r8["total"] < usable
    # the dequantisation on the 3090 (936 GB/s, RTX 3090 datasheet): forward, re-run, backward
    assert r["dequant_s"] == pytest.approx(3 * Q70 * (NF4_BITS / 8 + 2) / 936e9, rel=1e-3)
    assert 0.54 < r["dequant_s"] < 0.56
    # FSDP's CPU offload copies each block up twice (forward, backward): its packed codes, bf16 norms
    # and fp32 adapters; the root (embedding, head, final norm), the NF4 constants, the dequantised
    # matrix, two blocks with their adapters' gradients and the activations stay on the GPU
    blocks = Q70 / 2 + 80 * 2 * 2 * 8192 + 4 * n_a
    assert r["fsdp_streamed"] == blocks
    root = 2 * (2 * 128256 * 8192 + 8192)       # embedding, head, final norm in bf16: copied up once a step
    assert r["fsdp_pcie_s"] == pytest.approx((2 * blocks + root) / 31.5e9, rel=1e-9)
    root = 2 * 2 * 128256 * 8192 + 2 * 8192
    constants = Q70 / 64 + 4 * Q70 / (64 * 256) + 7 * 80 * (4 + 64 + 1024)
    buffer = 2 * 8192 * 28672 + 4 * 8192 * 28672 / 64
    resident = root + constants + buffer + 2 * (blocks / 80 + 4 * n_a / 80) + r["activations"]
    assert r["fsdp_resident"] == pytest.approx(resident, rel=1e-9) and r["fsdp_resident"] < usable
    # on the CPU: the base, the adapters, their gradients, moments and step tensors
    assert r["fsdp_host"] == Q70 / 2 + 2 * (N70 - Q70) + 16 * n_a + 4 * 14 * 80
    # the note: "INT4 + offload: barely runs". 70B: INT4 alone short, runs with offload (agrees);
    # 8B: the note names no model, and it needs no offload (not stated)
    c = {x.id: x for x in claims.CLAIMS}
    assert c["3-rtx3090-70b"].verdict() == "agrees" and c["3-rtx3090-8b"].verdict() == "not stated"
    assert "accelerate refuses" in c["3-rtx3090-70b"].why() and "over-cautious" in c["3-rtx3090-8b"].why()
    assert c["qlora-65b"].verdict() == "agrees"            # the paper: it fits; checkpointed, it does
    table = claims.ledger_table(claims.CLAIMS)
    assert max(map(len, table.splitlines())) <= 100 and " - " not in table


def test_qlora_65b_fits_48gb_only_checkpointed():
    # the QLoRA repo's scripts/finetune_guanaco_65b.sh: 1 x (16 + 512) tokens, checkpointed
    q = scale.qlora_65b()
    assert (q["seq"], q["batch"]) == (528, 1)
    n_a = lora(8192, 8192, 8192, 22016, 80, 64)
    assert n_a == 799_539_200
    # bf16 adapter and gradient at 2 B each; PagedAdamW32bit: two fp32 states (8 B), a Python-int step
    hand = qlora_states(Q65, N65, n_a, 2 + 2 + 8, 8192 * 22016, 7 * 80)
    assert q["states"] == pytest.approx(hand, rel=1e-6) and q["pageable"] == 8 * n_a
    usable = 49_140 * 2**20 - 2**30 - int(0.05 * 49_140 * 2**20)     # context + 5 %, no NCCL
    assert q["usable"] == usable and q["total_ckpt"] < usable < q["total_none"]
    # the script's first version (4 x 528): on the edge; the GPU-resident part (all but the paged
    # optimizer states) fits with room
    q4 = scale.qlora_65b(batch=4)
    assert abs(q4["total_ckpt"] - usable) < 0.1e9 and q4["total_ckpt"] - q4["pageable"] < usable - 6e9


def test_paged_adamw_states_and_bad_combinations():
    from gpumem.errors import UsageError
    from gpumem.memory import finetune as F
    cfg = models.get("llama-3-8b")
    n_a = lora(4096, 4096, 1024, 14336, 32, 16)
    for dtype, e in (("fp32", 4), ("bf16", 2)):       # fp32 states whatever the adapters' dtype
        r = F.finetune_states(cfg, F.Finetune(adapter="lora", optimizer="paged-adamw", adapter_dtype=dtype))
        assert (r["adapter_weights"], r["grads"], r["optimizer_moments"]) == (e * n_a, e * n_a, 8 * n_a)
        assert r["step_counters"] == r["optimizer_scales"] == 0
    with pytest.raises(UsageError, match="paged-adamw"):
        F.validate(F.Finetune(optimizer="paged-adamw"))
    with pytest.raises(UsageError, match="QLoRA"):
        F.validate(F.Finetune(adapter="lora", prepare=True))


def test_dequantisation_and_step_time_by_hand():
    cfg = models.get("llama-3-70b")
    h100_hbm, h100_flops = 3.35e12, 989e12                           # H100 SXM datasheet
    t = scale.step_seconds(cfg, scale.RECIPES["QLoRA r16"], "h100-80gb", 2048, True)
    assert t["dequant"] == pytest.approx(3 * Q70 * (NF4_BITS / 8 + 2) / h100_hbm)
    n_a = lora(8192, 8192, 1024, 28672, 80, 16)
    assert t["compute"] == pytest.approx((6 * N70 + 6 * n_a) * 2048 / (0.4 * h100_flops))
    full = scale.step_seconds(cfg, scale.RECIPES["full, mixed AdamW"], "h100-80gb", 2048, False)
    assert full["compute"] == pytest.approx(6 * N70 * 2048 / (0.4 * h100_flops)) and full["dequant"] == 0


def test_scale_rows_fit_marks():
    rows = {(r["model"], r["recipe"]): r for r in scale.rows()}
    q70 = rows[("llama-3-70b", "QLoRA r16")]
    h100 = 81_559 * 2**20
    assert q70["fits"]["h100-80gb"] == (q70["none"] <= h100 - 2**30 - int(0.05 * h100),
                                        q70["full"] <= h100 - 2**30 - int(0.05 * h100))
    assert q70["states"] < q70["full"] < q70["none"]
    # full mixed: 16 B per parameter (the course's fp32-master AdamW keeps its step as a Python int)
    assert rows[("llama-3-70b", "full, mixed AdamW")]["states"] == 16 * N70
    # optimizer on the CPU: bf16 weights and gradients stay on the GPU
    off = rows[("llama-3-70b", "full, optimizer on CPU")]
    assert off["states"] == 4 * N70
    assert all(not any(r["fits"][c]) for (m, lab), r in rows.items() if m == "llama-3.1-405b"
               and "base on CPU" not in lab for c in scale.CARDS)


def test_eight_bit_without_master_row_by_hand():
    """8-bit AdamW on the bf16 weights themselves: 2 (weight) + 2 (gradient) + 2 (two 1-byte
    moments) + 2 x 4/256 (their fp32 absmax per 256) B a parameter; every Llama-3-70B tensor has at
    least 4,096 elements and a multiple of 256 (norms 8,192), + the two 256-value fp32 maps."""
    rows = {(r["model"], r["recipe"]): r for r in scale.rows()}
    r = rows[("llama-3-70b", "full, 8-bit, no master")]
    assert r["states"] == 6 * N70 + 8 * N70 // 256 + 2 * 256 * 4
    assert r["roles"]["master"] == 0 and 425e9 < r["states"] < 426e9


def test_base_on_cpu_rows_by_hand():
    """LoRA r16 on Llama-3-70B with every parameter on the CPU (FSDP CPU offload, one unit per
    block): by hand, the GPU keeps the root (bf16 embedding, head, final norm), two blocks (bf16
    matrices and norms, fp32 adapters and their fp32 gradients) and the activations; the activations
    are the LoRA row's (its total less its states: the same step, only the weights moved)."""
    rows = {(r["model"], r["recipe"]): r for r in scale.rows()}
    n_a = lora(8192, 8192, 1024, 28672, 80, 16)
    root = 2 * 2 * 128256 * 8192 + 2 * 8192
    block = 2 * Q70 // 80 + 2 * 2 * 8192 + 4 * n_a // 80
    states = root + 2 * (block + 4 * n_a // 80)
    lora_row, off = rows[("llama-3-70b", "LoRA r16")], rows[("llama-3-70b", "LoRA r16, base on CPU")]
    assert off["states"] == states
    for ck in ("none", "full"):
        ck_states = states if ck == "full" else scale.base_offloaded(models.get("llama-3-70b"),
                                                                   scale.OFFLOAD["LoRA r16, base on CPU"], "none")["states"]
        assert off[ck] == ck_states + lora_row[ck] - lora_row["states"]
    assert off["fits"]["rtx-3090"] == (False, True) and off["fits"]["h100-80gb"] == (True, True)
    # the step on an H100: 80 blocks cross PCIe Gen5 (63 GB/s) twice and the root once, beside 2.2 s of compute
    t = scale.offload_seconds(models.get("llama-3-70b"), scale.OFFLOAD["LoRA r16, base on CPU"], "h100-80gb")
    assert t["pcie"] == pytest.approx((2 * 80 * block + root) / 63e9, rel=1e-9) and 4.4 < t["pcie"] < 4.5
    assert t["overlapped"] == t["pcie"] and t["serial"] == pytest.approx(t["pcie"] + t["compute"])


def test_tables_fit_100_columns():
    cfg = models.get("llama-3.1-405b")
    for text in (diagrams.idea(cfg, 64), diagrams.scale_table(scale.rows()), diagrams.cards_table(),
                 diagrams.frameworks_table()):
        assert max(map(len, text.splitlines())) <= 100


# -- the quiz: every answer by hand, every trap rejected ------------------------------------------

def _draws(qid):
    q = quiz.QUIZ._get(qid)
    for seed in SEEDS:
        q.redraw(random.Random(seed))
        yield q, q.numbers


def _traps_rejected(q):
    want = q.value()
    for wrong, _ in q.traps:
        v = float(wrong({**q.numbers, "expected": want, "unit": q.unit_now()}))
        if v > 0 and not q.close(v, want):
            assert not q.grade(v)
    assert q.grade(want)


def _hand_dims(n):
    cfg = models.get(n["model_name"])
    return cfg.d_model, cfg.q_dim, n["kv_dim"], n["ffn"], n["layers"]


def test_quiz_lora_trainable():
    seen = set()
    for q, n in _draws("lora-trainable"):
        h, qd, kv, f, L = _hand_dims(n)
        assert q.value() == lora(h, qd, kv, f, L, n["rank"], n["targets"])
        no_gqa = lora(h, qd, h, f, L, n["rank"], n["targets"])
        if no_gqa != q.value():
            assert not q.grade(no_gqa) and "grouped-query" in q.hint_for(no_gqa)
        _traps_rejected(q)
        seen.add(n["targets"])
    assert len(seen) >= 3


def test_quiz_qlora_saving():
    """LoRA -> QLoRA: only the quantised weights change, 2 B -> NF4_BITS / 8 each."""
    models_seen = set()
    for q, n in _draws("qlora-saving"):
        h, qd, kv, f, L = _hand_dims(n)
        qn = quantised(h, qd, kv, f, L)
        assert n["quantised"] == qn and f"{qn:,}" in q.prompt_text()   # the prompt gives what it needs
        hand = qn * (2 - NF4_BITS / 8) / 1e9
        assert q.value() == pytest.approx(hand, rel=1e-3)
        four_bits = 1.5 * qn / 1e9
        assert not q.grade(four_bits) and "absmax" in q.hint_for(four_bits)
        assert not q.grade(1.5 * n["n_params"] / 1e9)
        _traps_rejected(q)
        models_seen.add(n["model_name"])
    assert len(models_seen) >= 2


def test_quiz_8bit_saving():
    for q, n in _draws("8bit-saving"):
        # the moments alone: 8 B -> two 1-byte moments with an fp32 absmax per 256
        hand = n["n_params"] * (8 - 2 * (1 + 4 / 256)) / 1e9
        assert q.value() == pytest.approx(hand, rel=1e-3)
        assert not q.grade(12 * n["n_params"] / 1e9) and "master" in q.hint_for(12 * n["n_params"] / 1e9)
        _traps_rejected(q)


def test_quiz_dequant_time():
    seen = set()
    for q, n in _draws("dequant-time"):
        h, qd, kv, f, L = _hand_dims(n)
        passes = 3 if n["ckpt"] else 2
        hand = 1e3 * passes * quantised(h, qd, kv, f, L) * (NF4_BITS / 8 + 2) / (n["hbm_tb"] * 1e12)
        assert q.value() == pytest.approx(hand, rel=1e-9)
        one = hand / passes
        assert not q.grade(one) and "backward" in q.hint_for(one)
        _traps_rejected(q)
        seen.add(n["ckpt"])
        assert ("re-run once more" in q.explanation_text()) == n["ckpt"]
    assert seen == {True, False}


def test_quiz_offload_copies():
    """Base on the CPU: every block twice a micro-batch (forward, backward), the root once, times the
    micro-batches; the prompt's own GB figures give it (a trap for each thing left out)."""
    seen = set()
    for q, n in _draws("offload-copies"):
        hand = n["n_micro"] * (2 * n["blocks_gb"] + n["root_gb"])
        assert q.value() == pytest.approx(hand, rel=1e-9)
        assert f"{n['blocks_gb']:.2f} GB" in q.prompt_text() and f"{n['n_micro']} micro-batches" in q.prompt_text()
        one = 2 * n["blocks_gb"] + n["root_gb"]
        assert not q.grade(one) and "micro-batch" in q.hint_for(one)
        _traps_rejected(q)
        seen.add((n["recipe"][:5], n["n_micro"]))
    assert len(seen) >= 3


def test_quiz_shape():
    assert len(quiz.QUIZ.questions) >= 4
    for q in quiz.QUIZ.questions:
        assert q.hint and q.traps and not math.isnan(q.value())


def test_prepare_row_adds_two_bytes_per_unquantised_parameter():
    """prepare_model_for_kbit_training: embedding, head and norms bf16 -> fp32, +2 B each."""
    rows = {(r["model"], r["recipe"]): r for r in scale.rows()}
    # Llama-3-8B (params.json): d 4096, 32 layers, kv 1024, FFN 14,336, vocabulary 128,256, untied
    q8 = quantised(4096, 4096, 1024, 14336, 32)
    n8 = q8 + 2 * 128_256 * 4096 + (2 * 32 + 1) * 4096
    for model, n, q in (("llama-3-8b", n8, q8), ("llama-3-70b", N70, Q70)):
        plain, prep = rows[model, "QLoRA r16"], rows[model, "QLoRA r16 +prepare"]
        assert prep["states"] - plain["states"] == 2 * (n - q)
        assert prep["full"] - plain["full"] == 2 * (n - q)       # activations counted as without it
    assert 2 * (N70 - Q70) == 4_205_330_432 and 2 * (n8 - q8) == 2_101_878_784


def test_chapter07_finetune_question_by_hand_bounds():
    """Chapter 07's item-6 question from chapter 08: only QLoRA r16 checkpointed fits one H100 80GB
    for Llama-3-70B at 2,048 tokens. Each option bounded by hand (T = 2,048, h 8,192, F 28,672)."""
    from gpumem.chapters.ch07_must_understand import finetune_items as fi
    usable = 81_559 * 2**20 - 2**30 - int(0.05 * 81_559 * 2**20)        # context + 5 %, no NCCL
    assert fi.usable() == usable
    got = list(fi.totals().values())
    T, h, F, kv = 2048, 8192, 28672, 1024
    n_a = lora(8192, 8192, 1024, 28672, 80, 16)
    qstates = qlora_states(Q70, N70, n_a, 16, 8192 * 28672, 7 * 80) + 4 * 14 * 80
    assert got[0] >= 10 * N70 > usable                   # bf16 weights + grads, fp32 master, 8-bit moments
    assert got[1] >= 2 * N70 > usable                    # the frozen bf16 base alone
    # not checkpointed, each layer keeps at least q, k, v and the attention output (flash), the gate,
    # the SiLU output and up (bf16), and both norms' inputs
    per_layer = 2 * T * (h + 2 * kv + h) + 3 * 2 * T * F + 2 * 2 * T * h
    assert got[2] >= qstates + 80 * per_layer > usable
    # checkpointed: states + 80 layer inputs + one re-run layer + the fp32 logits twice, generously
    assert got[3] <= qstates + 80 * 2 * T * h + 2 * per_layer + 2 * 4 * T * 128_256 < usable
    assert fi.QUESTION._authored[1] == 3


def test_host_ram_column_by_hand():
    """The table's host column: LoRA with its base on the CPU keeps every state there; by hand for
    Llama-3-70B: bf16 base 2 N, fp32 adapters 4 + grads 4 + AdamW moments 8 per adapter element,
    and torch AdamW's 4-byte step per adapter tensor (2 per projection x 7 x 80 layers)."""
    h, kv, f, L = 8192, 1024, 28672, 80
    n_a = 16 * ((h + h) * 2 + (h + kv) * 2 + (h + f) * 3) * L
    n = models.get("llama-3-70b").n_params()
    rows = {(r["model"], r["recipe"]): r for r in scale.rows()}
    assert rows[("llama-3-70b", "LoRA r16, base on CPU")]["host"] == 2 * n + 16 * n_a + 4 * 2 * 7 * L
    assert rows[("llama-3-70b", "full, optimizer on CPU")]["host"] == 16 * n    # chapter 05's count
    assert rows[("llama-3-70b", "QLoRA r16")]["host"] == 0
    assert "RAM GB" in diagrams.scale_table(scale.rows())


def test_dropout_extra_by_hand():
    """lora_dropout on the 65B QLoRA run (review r10 #6: the chapter's typed sums were 45.34 and
    48.10 GB, the count gives 45.37 and 48.19), counted tensor by tensor: each of the seven adapters
    saves a dropped bf16 copy (2 B) and a 1-byte mask of its input; without dropout q/k/v share one
    saved normed input, gate/up another, and down's input is saved once; o's input is flash
    attention's output, saved with or without dropout."""
    from gpumem.chapters.ch08_finetuning import scale
    h, F, tokens = 8192, 22016, 16 + 512
    widths = {"q": h, "k": h, "v": h, "o": h, "gate": h, "up": h, "down": F}
    with_dropout = sum(3 * w for w in widths.values())
    without = 2 * h + 2 * h + 2 * F
    for batch, total in ((1, 45.368), (4, 48.194)):
        q = scale.qlora_65b(batch=batch)
        assert q["dropout_extra"] == (with_dropout - without) * tokens * batch
        assert round((q["total_ckpt"] + q["dropout_extra"]) / 1e9, 3) == total
    assert q["total_ckpt"] + q["dropout_extra"] > q["usable"]       # batch 4: over the card
