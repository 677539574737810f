"""Published measurements beside chapter 08's predictions: Answer.AI's FSDP + QLoRA benchmarks.

Source: github.com/AnswerDotAI/fsdp_qlora, ``benchmarks_03_2024.md`` (last changed at commit
e877dda5026dfd964cccdb92a4532da587cbdae0, read at 05ed9f2). Runs of Feb-Mar 2024 with
``train.py``; its template command trains on dummy data, ``--dataset_samples 1024``,
``--use_gradient_checkpointing True``; ``--batch_size`` is per GPU (train.py: "Batch size per
GPU"), and train.py's defaults give LoRA rank 64 on all seven projections (``lora_rank=64``,
``lora_target_modules="all"``). A step is ``batch_size`` sequences of 2,048 tokens on each of
the two GPUs, so 1,024 samples take 1,024 / (2 x batch_size) steps.

What the measurement is and is not (stated, not adjusted): two GPUs, not one (FSDP shards the
base between them; each GPU still receives every block's weights over PCIe, from the host or
from its peer), Llama-2-70B (vocabulary 32,000), not Llama-3-70B, and 3090s power-capped at
280 W (below the clocks behind the 71 TFLOP/s peak, so a utilisation against that peak is low
for the card as run). Its "Time (s)" is the whole run; dividing by the steps charges start-up
to the steps, so the per-step seconds are an upper bound and the utilisation a lower bound.
"""

from gpumem.memory import finetune as F
from gpumem.memory.models import ModelConfig

from . import scale

SOURCE = "AnswerDotAI/fsdp_qlora benchmarks_03_2024.md @ e877dda"
PEFT_DOC = "huggingface/peft docs/source/accelerate/fsdp.md, 'Memory usage' (read at 018ca9d)"
GiB = 2**30
RIG = "2x RTX 3090 at 280 W, no NVLink, 128 GB RAM"      # the "Dual 3090 'Basement Rig'" section
SAMPLES = 1024          # the template command's --dataset_samples
SEQ = 2048              # "Context Length of 2048"
GPUS = 2

# Llama-2-70B: arXiv:2307.09288 and meta-llama/Llama-2-70b-hf config.json (80 layers, hidden
# 8,192, 64 heads, 8 key/value heads, intermediate 28,672, vocabulary 32,000, untied)
LLAMA2_70B = ModelConfig("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, published_params=70.0,
                         rope_theta=10000.0, source="arXiv:2307.09288; HF config.json")
FSDP_QLORA = F.Finetune(adapter="lora", lora_rank=64, base_dtype="nf4")

# (model, recipe, cards, CPU offload, batch per GPU, seconds for 1,024 samples): the file's tables
RUNS = {
    "70b-3090": ("Llama-2-70B", "QLoRA", "2x RTX 3090", True, 2, 11_795),   # "Llama 70B" table
    "70b-4090": ("Llama-2-70B", "QLoRA", "2x RTX 4090", True, 2, 4_399),    # dual 4090 section
    # Llama-2-7B on 2x RTX 4090, 2,048 tokens (dual 4090 section): LoRA vs QLoRA, each at the
    # largest batch that fitted (batches differ, so per-sample time is what compares)
    "7b-lora-ddp": ("Llama-2-7B", "LoRA", "2x RTX 4090", False, 4, 437),
    "7b-qlora-ddp": ("Llama-2-7B", "QLoRA", "2x RTX 4090", False, 8, 450),
    "7b-lora-fsdp": ("Llama-2-7B", "LoRA", "2x RTX 4090", False, 6, 481),
    "7b-qlora-fsdp": ("Llama-2-7B", "QLoRA", "2x RTX 4090", False, 10, 466),
}


def per_step(run: str) -> dict:
    """One run's step: ``steps`` (1,024 samples over both GPUs), ``seconds`` a step and
    ``tokens`` per GPU per step."""
    *_, batch, total = RUNS[run]
    steps = SAMPLES // (GPUS * batch)
    return {"steps": steps, "seconds": total / steps, "tokens": batch * SEQ}


def implied_utilisation(run: str = "70b-3090", peak: float = scale.RTX3090_BF16) -> dict:
    """The share of ``peak`` a measured step implies if all of it were compute: the chapter's
    FLOP count (:func:`scale.lora_flops`, frozen base, checkpointed re-run included, so a
    hardware-FLOPs utilisation) for one GPU's tokens, over seconds x peak. ``predicted`` is the
    chapter's compute time at its assumed :data:`scale.MFU` for the same tokens."""
    s = per_step(run)
    flops = scale.lora_flops(LLAMA2_70B, FSDP_QLORA, s["tokens"], recompute=True)
    return s | {"flops": flops, "utilisation": flops / (s["seconds"] * peak),
                "predicted_compute": flops / (peak * scale.MFU)}


def predicted(run: str = "70b-3090") -> dict:
    """The chapter's step for the measured setup (Llama-2-70B, QLoRA r64, every block's NF4
    weights over PCIe Gen4 twice and the root once, one GPU's tokens) at its assumed
    :data:`scale.MFU`: ``serial`` and ``overlapped`` as :func:`scale.offload_seconds` gives them,
    beside ``measured``."""
    s = implied_utilisation(run)
    o = scale.base_offloaded(LLAMA2_70B, FSDP_QLORA, "full", s["tokens"])
    pcie = o["copied"] / scale.PCIE4
    busy = s["predicted_compute"] + scale.dequant_seconds(LLAMA2_70B, scale.RTX3090_MEM, True)
    return {"pcie": pcie, "busy": busy, "serial": pcie + busy, "overlapped": max(pcie, busy),
            "measured": s["seconds"], "utilisation": s["utilisation"]}


def scenario_at_measured(model: str = "llama-3-70b") -> dict:
    """Section 1's RTX 3090 scenario (512 tokens) with the compute at the utilisation the
    measurement implies instead of the assumed 40 %: ``serial`` and ``overlapped`` seconds."""
    r, u = scale.rtx3090(model), implied_utilisation()["utilisation"]
    busy = r["compute_s"] * scale.MFU / u + r["dequant_s"]
    return {"utilisation": u, "serial": r["fsdp_pcie_s"] + busy, "overlapped": max(r["fsdp_pcie_s"], busy)}


# Measured memory beside the count. Answer.AI's "Peak Memory (GiB)" is PyTorch's reserved peak
# (their note under the 7B LoRA table: "the reported peak reserved memory ... the peak allocated
# memory is 8.28 GiB vs 9.16 GiB"); the PEFT guide's run: Llama-2-70B, QLoRA r = 8 on all linear
# layers, nested quantisation, bf16 quant storage, 2 x 2,048 tokens a GPU, checkpointing, FSDP
# with CPU offload on 2 GPUs; "memory consumed per GPU is 19.6 GB while CPU RAM usage is around
# 107 GB"; how it was read (nvidia-smi or the allocator) is not said.
PEFT_R8 = F.Finetune(adapter="lora", lora_rank=8, base_dtype="nf4")
MEASURED_MEMORY = (
    # (what, source, recipe, batch per GPU, measured GPU bytes, measured host bytes or None)
    ("Answer.AI, 2x RTX 3090", SOURCE, FSDP_QLORA, 2, int(14.92 * GiB), None),
    ("PEFT guide, 2x 24 GB", PEFT_DOC, PEFT_R8, 2, int(19.6e9), int(107e9)),
)


def memory_rows() -> list[dict]:
    """Each measurement of :data:`MEASURED_MEMORY` beside the chapter's count for the same run on
    one GPU (:func:`scale.base_offloaded`: Llama-2-70B, base on the CPU, checkpointed, 2,048
    tokens x the batch): ``gpu``/``host`` measured, ``count_gpu``/``count_host`` counted. The
    counts are tensors; the measurements are a process's reserved or used memory, on two GPUs
    (the host figure is the machine's, two ranks' worth), so the gap is not adjusted away."""
    out = []
    for what, source, ft, batch, gpu, host in MEASURED_MEMORY:
        o = scale.base_offloaded(LLAMA2_70B, ft, "full", SEQ, batch)
        out.append({"what": what, "source": source, "rank": ft.lora_rank, "batch": batch, "gpu": gpu,
                    "host": host, "count_gpu": o["gpu"], "count_host": o["host"]})
    return out
