"""``plan`` with chapter 08's options (issue 23): the fine-tuning search's bytes and FLOPs against hand
counts from the model's dimensions, its refusals (exit 2, one line), and what it searches."""

import json
import subprocess
import sys

import pytest

from gpumem.memory import finetune as F, models
from gpumem.planner import finetune as P
from gpumem.timing import finetune_time

# Llama-3-70B from its config.json: hidden 8192, 80 layers, 64 heads, 8 KV heads of 128, FFN 28,672, vocab 128,256
H, L, KV, FF, V = 8192, 80, 1024, 28672, 128256
MATS = H * H + 2 * H * KV + H * H + 3 * H * FF          # one block's matrices: q, k, v, o, gate, up, down
ADAPT = 16 * ((H + H) + 2 * (H + KV) + (H + H) + 2 * (H + FF) + (FF + H))   # r (in + out) each, r = 16
N = L * (MATS + 2 * H) + 2 * V * H + H                  # blocks with their two norms, embedding, head, final norm


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "gpumem", "plan", *args], capture_output=True, text=True, timeout=120)


def test_hand_counts_match_the_model():
    cfg = models.get("llama-3-70b")
    assert cfg.n_params() == N
    assert F.lora_params(cfg, 16) == L * ADAPT == 207_093_760       # peft's count for r = 16, all seven


def test_fsdp_lora_bytes_by_hand():
    """LoRA r16 on 70B, FSDP over 8 GPUs: 1/8 of the bf16 base, of the fp32 adapters, their fp32 gradients
    and two fp32 moments, torch AdamW's 4-byte step per adapter tensor (whole), plus the root (embedding,
    head, final norm) and two blocks (weights, adapters, adapter gradients) gathered whole."""
    cfg = models.get("llama-3-70b")
    lay = P.FtLayout(zero=3, checkpoint="full", micro_batch=1, dp=8, n_micro=2)
    m = P.memory(cfg, F.Finetune(adapter="lora"), lay, 2048)
    shards = 2 * N // 8 + (4 + 4 + 8) * L * ADAPT // 8 + 4 * 14 * L
    assert abs(m["states"] - shards) <= 16        # shards rounded up per role
    block = 2 * MATS + 2 * 2 * H + 4 * ADAPT
    root = 2 * (2 * V * H + H)
    assert m["working"] == root + 2 * (block + 4 * ADAPT)
    assert m["host"] == 0 and m["buffers"] == 0


def test_base_on_cpu_keeps_only_the_working_set():
    """With the base on the CPU the GPU keeps the gathered units, QLoRA's constants and dequantised
    matrix; the host holds every shard; each pass copies up the GPU's shard of the blocks."""
    cfg = models.get("llama-3-70b")
    ft = F.Finetune(adapter="lora", base_dtype="nf4")
    lay = P.FtLayout(zero=3, checkpoint="full", micro_batch=1, dp=1, n_micro=16, base_on_cpu=True)
    m = P.memory(cfg, ft, lay, 512)
    roles = F.finetune_states(cfg, ft)
    assert m["states"] == roles["quant_constants"] + roles["dequant_buffer"]
    assert m["host"] == sum(roles.values()) - m["states"]
    packed = sum(-(-n // 2) for n in F.quantised_tensors(cfg))   # 4-bit codes: half a byte each
    assert packed == L * MATS // 2


def test_frozen_backward_skips_the_weight_gradients():
    """A frozen matrix's backward computes only its input's gradient: full fine-tuning's backward
    minus LoRA's (without the adapters' own) is the weight gradients, 2 x tokens x elements for every
    block matrix and the head."""
    cfg = models.get("llama-3-70b")
    seq, mb = 2048, 2
    full = finetune_time.step_flops(cfg, F.Finetune(), seq, mb)
    lora = finetune_time.step_flops(cfg, F.Finetune(adapter="lora"), seq, mb)
    T = seq * mb
    assert full["backward"] - (lora["backward"] - 4 * ADAPT * L * T) == 2 * T * (L * MATS + V * H)
    assert lora["forward"] - full["forward"] == 2 * ADAPT * L * T


def test_dequantisation_bytes_by_hand():
    """Each pass reads 4.127 bits a weight (codes, 8-bit absmax per 64, fp32 scale per 256 absmaxes)
    and writes 2 bytes, for every block matrix."""
    cfg = models.get("llama-3-70b")
    per = (4 + 8 / 64 + 32 / (64 * 256)) / 8 + 2
    assert finetune_time.dequant_bytes(cfg) == pytest.approx(L * MATS * per, rel=1e-12)
    assert finetune_time.dequant_seconds(cfg, 3.35e12, 3) == pytest.approx(3 * L * MATS * per / 3.35e12)


def test_one_gpu_searches_no_sharding():
    r = P.plan("llama-3-8b", F.Finetune(adapter="lora", base_dtype="nf4"), 1, "l4", seq=1024)
    assert r.plans and {(p.layout.zero, p.layout.base_on_cpu) for p in r.plans} <= {(0, False), (3, True)}
    assert r.question["reserve"] == 2**30 + int(0.05 * r.question["capacity"])      # no NCCL on one GPU


def test_a_24_gib_card_needs_the_base_on_the_cpu():
    """The note's scenario (70B QLoRA on a 24 GB card): the 4-bit base alone is 35 GB, so every plan
    that fits keeps it on the CPU."""
    r = P.plan("llama-3-70b", F.Finetune(adapter="lora", base_dtype="nf4"), 1, "h100-80gb", gpu_mem=24 * 2**30,
               seq=512)
    assert r.plans and all(p.layout.base_on_cpu for p in r.plans)
    assert L * MATS // 2 > 24 * 2**30


def test_ranking_is_by_time_then_room():
    r = P.plan("llama-3-70b", F.Finetune(adapter="lora"), 8, "h100-80gb", seq=2048)
    times = [p.time["total"] for p in r.plans]
    assert len(times) > 2
    for i, a in enumerate(times):            # out of order only inside the tie band
        assert all(b * (1 + 0.005) >= a for b in times[i + 1:])


def test_cli_table_json_and_refusals():
    ok = _cli("--model", "llama-3-70b", "--gpus", "8", "--adapter", "lora", "--base-dtype", "nf4", "--seq", "2048",
              "--json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    best = d["plans"][0]
    assert d["question"]["finetune"]["base_dtype"] == "nf4" and best["peft"]["r"] == 16
    assert best["bitsandbytes"]["bnb_4bit_quant_type"] == "nf4"
    table = _cli("--model", "llama-3-8b", "--gpus", "2", "--adapter", "lora", "--optimizer", "adamw-8bit")
    assert table.returncode == 0 and "best: " in table.stdout and "trainer: " in table.stdout
    for args, said in [(("--base-dtype", "nf4"), "needs --adapter lora"),
                       (("--adapter", "lora", "--lora-rank", "0"), "--lora-rank"),
                       (("--adapter", "lora", "--lora-targets", "q,x"), "unknown LoRA target"),
                       (("--adapter", "lora", "--layout", "tp=1"), "--layout"),
                       (("--adapter", "lora", "--recipe", "both"), "--recipe both")]:
        r = _cli("--gpus", "2", *args) if args[0] == "--model" else _cli("--model", "llama-3-8b", "--gpus", "2", *args)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    for args, said in [(("--model", "mixtral-8x7b", "--adapter", "lora"), "dense models"),
                       (("--model", "gpt2", "--adapter", "lora"), "dense models")]:
        r = _cli("--gpus", "2", *args) if args[0] == "--model" else _cli("--model", "llama-3-8b", "--gpus", "2", *args)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_pcie_copies_hide_under_compute_only_while_shorter():
    """Base on the CPU, one GPU: the copies (16 micro-batches x (2 passes x the 4-bit blocks + the root)) take
    bytes / link seconds; FSDP2's prefetch hides them under the compute, so what shows is what exceeds it."""
    cfg = models.get("llama-3-70b")
    ft = F.Finetune(adapter="lora", base_dtype="nf4")
    fast = P.plan(cfg, ft, 1, "h100-80gb", seq=2048)
    lay = next(p for p in fast.plans if p.layout.base_on_cpu and p.layout.n_micro == 16 and p.layout.checkpoint == "none")
    streamed = L * MATS // 2 + 2 * 2 * H * L + 4 * ADAPT * L     # codes, bf16 norms, fp32 adapters: every block
    root = 2 * (2 * V * H + H)                                    # and the root, once a micro-batch
    assert lay.time["offload_moved_s"] == pytest.approx(16 * (2 * streamed + root) / 63e9, rel=1e-9)
    slow = P.plan(cfg, ft, 1, "h100-80gb", seq=2048, pcie=31.5e9)
    same = next(p for p in slow.plans if p.layout == lay.layout)
    assert same.time["offload_moved_s"] == pytest.approx(2 * lay.time["offload_moved_s"])
    assert same.time["offload"] == pytest.approx(same.time["offload_moved_s"] - same.time["compute"])


def test_a_batch_no_gpu_count_divides_is_named():
    r = _cli("--model", "llama-3-8b", "--gpus", "2", "--adapter", "lora", "--global-batch", "3")
    assert r.returncode == 0 and "must be a multiple of the GPU count (2)" in r.stdout


def test_bitsandbytes_optimizers_are_not_planned_under_fsdp():
    """bitsandbytes' 8-bit and paged optimizers fail on FSDP's DTensor shards (review r12, bitsandbytes
    #1403, #1633): no stage-3 layout is offered with them; 70B full fine-tuning with 8-bit AdamW then
    fits nowhere on 8 x 80 GB (10 B a parameter over 8 GPUs is 88 GB before activations)."""
    r = P.plan("llama-3-8b", F.Finetune(adapter="lora", optimizer="adamw-8bit"), 8, "h100-80gb", seq=2048)
    assert r.plans and all(p.layout.zero < 3 for p in r.plans)
    assert any("#1403" in a for a in r.assumptions)
    full = P.plan("llama-3-70b", F.Finetune(optimizer="adamw-8bit"), 8, "h100-80gb", seq=2048)
    assert not full.plans and 10 * N / 8 > 80e9


def test_sharded_layouts_run_the_adapters_in_bf16():
    """DeepSpeed's bf16 engine and FSDP's mixed precision cast the adapters to bf16 for compute, so
    peft keeps no per-adapter bf16 copy of its input: the activations are the bf16-adapter count,
    which saves (at 70B, 2,048 tokens, no checkpointing) about what full fine-tuning saves; one GPU under
    autocast keeps peft's fp32 adapters and their copies."""
    cfg = models.get("llama-3-70b")
    ft = F.Finetune(adapter="lora")
    sharded = P.memory(cfg, ft, P.FtLayout(3, "none", 1, 8, 2), 2048)["activations"]
    alone = P.memory(cfg, ft, P.FtLayout(0, "none", 1, 1, 16), 2048)["activations"]
    full = F.finetune_activation_bytes(cfg, F.Finetune(), 2048, 1)["peak"]
    assert sharded == pytest.approx(full, rel=1e-3)
    assert alone - sharded > 4 * 2 * 2048 * H * L     # at least four more h-wide bf16 copies a layer (q/k/v, gate/up, o)


def test_an_adapted_down_projection_is_re_run():
    """Checkpointed, PyTorch's early stop skips W_down's matmul in the re-run (nothing saves its output);
    an adapter on down_proj runs after the base matmul, so the whole layer re-runs: 2 x tokens x h x F
    more a layer than without it."""
    cfg = models.get("llama-3-70b")
    T = 2048
    with_down = finetune_time.step_flops(cfg, F.Finetune(adapter="lora"), T, 1, "full")
    no_down = finetune_time.step_flops(cfg, F.Finetune(adapter="lora", lora_targets=("q", "k", "v", "o", "gate", "up")),
                                       T, 1, "full")
    adapt_down = 2 * 16 * (FF + H) * L * T            # the down adapter's own re-run forward
    assert with_down["recompute"] - no_down["recompute"] == 2 * T * H * FF * L + adapt_down


def test_cli_pcie_rate():
    """``--pcie`` prices the base-on-CPU copies at a given link (e.g. one measured); refused without
    the fine-tuning options and for anything but bytes/s."""
    slow = json.loads(_cli("--model", "llama-3-70b", "--gpus", "1", "--adapter", "lora", "--base-dtype", "nf4",
                           "--seq", "2048", "--pcie", "31.5e9", "--json").stdout)
    copies = {p["label"]: p["time"]["offload_moved_s"] for p in slow["plans"] if p["layout"]["base_on_cpu"]}
    fast = P.plan("llama-3-70b", F.Finetune(adapter="lora", base_dtype="nf4"), 1, "h100-80gb", seq=2048)
    same = [(copies[p.layout.label()], p.time["offload_moved_s"]) for p in fast.plans if p.layout.label() in copies]
    assert same and all(a == pytest.approx(2 * b) for a, b in same)        # 31.5 GB/s is half the H100's 63
    for args, said in [(("--pcie", "55e9"), "--pcie goes with"), (("--adapter", "lora", "--pcie", "fast"), "--pcie")]:
        r = _cli("--model", "llama-3-8b", "--gpus", "2", *args)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
