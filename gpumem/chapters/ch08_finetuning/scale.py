"""Chapter 08 at scale: per-GPU bytes of each fine-tuning recipe against four cards, the note's
RTX 3090 scenario, the QLoRA paper's 65B-on-48-GB claim, and time (dequantisation, a step).

Bytes are the engine's (:mod:`gpumem.memory.finetune`: ``finetune_states`` by role,
``finetune_activation_bytes``, ``single_gpu``); full fine-tuning with the optimizer on the CPU is
chapter 05's ``accounting.model_states`` (DeepSpeed needs ZeRO stage >= 1 for it: one GPU at
stage 1). LoRA and QLoRA with the frozen base on the CPU are priced here as FSDP's CPU offload
lays them out (:data:`OFFLOAD`, :func:`base_offloaded`: GPU and host bytes; :func:`offload_seconds`:
PCIe beside compute); full fine-tuning with 8-bit AdamW and no fp32 master is :data:`NO_MASTER`.

Hardware figures and their sources are next to each constant. Stated assumptions: one sequence
of :data:`SEQ` tokens per step; LoRA r = 16 on all seven projections; a single GPU reserves the
CUDA context and 5 % for fragmentation (``gpus.Reserve`` without NCCL: one GPU has no
communicator); attention's own FLOPs left out of the step time (a few % at these lengths).
"""

from gpumem.memory import accounting, finetune as F, finetune_fsdp, gpus, models
from gpumem.memory.models import ModelConfig
from gpumem.timing import compute, finetune_time

GB = 10**9
MiB = 2**20
SEQ, BATCH = 2048, 1            # assumption: one 2,048-token sequence per step
MODELS = ("llama-3-8b", "llama-3-70b", "llama-3.1-405b")
SINGLE = gpus.Reserve(nccl=0)   # one GPU: context + fragmentation, no NCCL buffers

# name -> (label, bytes the card reports, source)
CARDS = {
    "rtx-3090": ("RTX 3090 24GB", F.RTX3090_BYTES, "nvidia-smi memory.total (finetune.RTX3090_BYTES)"),
    "a6000": ("RTX A6000 48GB", 49_140 * MiB, "datasheet 48 GB; 49,140 MiB as nvidia-smi prints it "
                                            "(assumption)"),
    "h100-80gb": ("H100 80GB", gpus.get("h100-80gb").capacity, "gpumem.memory.gpus (81,559 MiB)"),
    "h200": ("H200 141GB", gpus.get("h200").capacity, "gpumem.memory.gpus (143,771 MiB)"),
}

RECIPES = {
    "full, mixed AdamW": F.Finetune(),
    "full, 8-bit AdamW": F.Finetune(optimizer="adamw-8bit"),
    "LoRA r16": F.Finetune(adapter="lora"),
    "QLoRA r16": F.Finetune(adapter="lora", base_dtype="nf4"),
    # as most QLoRA recipes run it: peft's prepare_model_for_kbit_training first, which casts every
    # parameter that is not 4-bit (embedding, head, norms) to fp32 (peft utils/other.py); counted in
    # the states; its fp32 norm outputs in the activations are not (section 4 traces them)
    "QLoRA r16 +prepare": F.Finetune(adapter="lora", base_dtype="nf4", prepare=True),
}
# full fine-tuning with 8-bit AdamW updating the bf16 weights themselves (no fp32 master: chapter
# 08's measured full-8bit run): accounting's pure-bf16 recipe with bitsandbytes' moments
NO_MASTER = F.Finetune(optimizer="adamw-8bit", recipe="pure-bf16")
# CPU offload with a frozen base. The adapters' optimizer states are tiny (1.7 GB at 70B); what
# must leave the GPU is the frozen base. Two frameworks move frozen parameters: PyTorch FSDP's CPU
# offload (FSDP2 ``offload_policy=CPUOffloadPolicy()``) and DeepSpeed ZeRO-3's ``offload_param``.
# Counted as FSDP runs it with one unit per decoder block (the engine's ``finetune_fsdp``: what
# stays on the GPU, what crosses PCIe, and the assumptions with their effect).
OFFLOAD = {"LoRA r16, base on CPU": F.Finetune(adapter="lora"),
           "QLoRA r16, base on CPU": F.Finetune(adapter="lora", base_dtype="nf4")}
OFFLOAD_BLOCKS = finetune_fsdp.FSDP_BLOCKS    # one block computing, one prefetched

# RTX 3090 (NVIDIA Ampere GA102 GPU architecture whitepaper, Table 9 / RTX 3090 datasheet):
# 71 TFLOP/s dense bf16 tensor with fp32 accumulate, 936 GB/s GDDR6X, PCIe Gen4 x16
RTX3090_BF16, RTX3090_MEM = 71e12, 936e9
PCIE4 = gpus.get("a100-80gb").pcie     # PCIe Gen4 x16 per direction (31.5 GB/s; gpumem.memory.gpus)
MFU = compute.MFU                     # 40 %: Meta's Llama 3 pre-training (arXiv:2407.21783 Table 4)
# Assumptions for the RTX 3090 (labelled, with their effect): MFU 40 % is Llama 3's on H100 clusters,
# not measured on a 3090 (compute time scales as 1/MFU: at 20 % it doubles); PCIe's 31.5 GB/s is the
# link's peak (PCIe time scales as 1/(achieved share)); with FSDP's parameter CPU offload each
# block's weights cross PCIe once in forward and once in backward (the checkpointed re-run inside
# it), and the GPU holds two blocks' (one computing, one prefetched).
FSDP_PASSES = finetune_fsdp.FSDP_PASSES

# LLaMA-65B, the QLoRA paper's largest model: LLaMA paper (arXiv:2302.13971) Table 2 and Meta's
# params.json (dim 8192, 80 layers, 64 heads, FFN 22,016, vocabulary 32,000)
LLAMA_65B = ModelConfig("llama-65b", 80, 8192, 64, 64, 22016, 32000, published_params=65.2, rope_theta=10000.0,
                        source="arXiv:2302.13971 Table 2")
# The paper's setup, from its code (github.com/artidoro/qlora at 7f4e95a): qlora.py's defaults
# optim="paged_adamw_32bit" (bitsandbytes PagedAdamW32bit: fp32 states, finetune.py) and
# gradient_checkpointing=True; after get_peft_model it casts the LoRA layers to bf16 (--bf16),
# the norms to fp32 and the embedding and head back to bf16. scripts/finetune_guanaco_65b.sh:
# --lora_r 64 --lora_modules all (every linear layer of the blocks), --source_max_len 16
# --target_max_len 512 (at most 528 tokens a sequence), --per_device_train_batch_size 1
# --gradient_accumulation_steps 16 (commit 86ac601; the script's first version, 0b46ca8, ran a
# micro-batch of 4 x 4 steps), --lora_dropout 0.05. Not counted (assumptions, with their effect):
# the norms' fp32 weights (+2 B x 1.3 M = 2.6 MB); lora_dropout: on a GPU each adapter then saves
# its own dropped bf16 copy and a 1-byte mask instead of the shared input (peft lora/bnb.py), in the
# re-run layer only: 14 h + F bytes a token more (:func:`dropout_extra`), which puts the first
# version's micro-batch of 4 over the card; the fp32 norm outputs (traced in lora_trace only).
QLORA_PAPER = F.Finetune(adapter="lora", lora_rank=64, base_dtype="nf4", adapter_dtype="bf16",
                         optimizer="paged-adamw")
QLORA_SEQ = 16 + 512            # source_max_len + target_max_len
QLORA_BATCH = 1                 # finetune_guanaco_65b.sh since 86ac601 (the first version: 4)


def usable(card: str) -> int:
    """Bytes a single GPU leaves for tensors: its capacity minus :data:`SINGLE`'s reserve. ``card``
    is a key of :data:`CARDS` or a ``gpumem.memory.gpus`` name (lab 08 uses the same function)."""
    return gpus.usable(CARDS[card][1] if card in CARDS else gpus.get(card).capacity, SINGLE)


def need(cfg, ft: F.Finetune, checkpoint: str = "none", seq: int = SEQ, batch: int = BATCH) -> dict:
    """One GPU's bytes for a step: ``roles`` (finetune_states), ``states``, ``activations`` (peak),
    ``total``."""
    roles = F.finetune_states(cfg, ft)
    acts = F.finetune_activation_bytes(cfg, ft, seq, batch, checkpoint=checkpoint)["peak"]
    return {"roles": roles, "states": sum(roles.values()), "activations": acts,
            "total": sum(roles.values()) + acts}


def full_offloaded(cfg, checkpoint: str = "none", seq: int = SEQ) -> int:
    """Full fine-tuning (mixed) on one GPU with the optimizer on the CPU (ZeRO-1, as DeepSpeed runs
    it): the GPU keeps bf16 weights and gradients, plus the activations."""
    s = accounting.model_states(cfg.n_params(), "mixed", 1, 1, "optimizer", "cpu")
    return s.params + s.grads + need(cfg, F.Finetune(), checkpoint, seq)["activations"]


def block_weights(cfg, ft: F.Finetune) -> int:
    """One decoder block's weights as FSDP copies them up (the engine's ``finetune.block_weights``):
    the base (bf16, or NF4's packed codes with bf16 norms, fp32 with ``prepare``) and its adapters."""
    return F.block_weights(cfg, ft)


def base_offloaded(cfg, ft: F.Finetune, checkpoint: str = "full", seq: int = SEQ, batch: int = BATCH) -> dict:
    """LoRA/QLoRA on one GPU with every parameter on the CPU (FSDP's CPU offload, see
    :data:`OFFLOAD`): ``gpu`` (bytes held there; ``states``: all but the activations), ``host``
    (CPU RAM: base, adapters, their gradients and moments), ``streamed`` (weights copied up per
    pass: the blocks; the root stays) and ``passes`` (forward and backward; a checkpointed re-run
    happens inside the backward's gather)."""
    o = finetune_fsdp.fsdp_states(cfg, ft, 1, base_on_cpu=True)
    acts = need(cfg, ft, checkpoint, seq, batch)["activations"]
    return {"states": o["gpu"], "activations": acts, "gpu": o["gpu"] + acts, "host": o["host"], "root": o["root"],
            "streamed": o["streamed"], "passes": o["passes"], "copied": finetune_fsdp.copied_up(o)}


def offload_seconds(cfg, ft: F.Finetune, gpu: str = "h100-80gb", seq: int = SEQ) -> dict:
    """A step with the base on the CPU: the blocks cross PCIe (host to device, the GPU's link at
    its peak: an assumption) ``passes`` times; beside :func:`step_seconds` (checkpointed).
    ``serial``: nothing overlaps; ``overlapped``: FSDP's prefetch hides the shorter of the two."""
    o, t = base_offloaded(cfg, ft, "full", seq), step_seconds(cfg, ft, gpu, seq)
    pcie = o["copied"] / gpus.get(gpu).pcie
    return {"pcie": pcie, "compute": t["total"], "serial": pcie + t["total"], "overlapped": max(pcie, t["total"])}


def rows(seq: int = SEQ) -> list[dict]:
    """Every model x recipe (and full mixed with CPU offload), without and with checkpointing:
    bytes and which cards they fit (``fits``: card -> (no checkpointing, checkpointing)).
    ``states`` is what the GPU holds besides activations; ``host`` the CPU RAM a row needs."""
    out = []
    for name in MODELS:
        cfg = models.get(name)
        for label, ft in RECIPES.items():
            plain, ck = need(cfg, ft, "none", seq), need(cfg, ft, "full", seq)
            out.append({"model": name, "recipe": label, "states": plain["states"], "none": plain["total"],
                        "full": ck["total"], "roles": plain["roles"]})
            if label == "full, 8-bit AdamW":
                plain, ck = need(cfg, NO_MASTER, "none", seq), need(cfg, NO_MASTER, "full", seq)
                out.append({"model": name, "recipe": "full, 8-bit, no master", "states": plain["states"],
                            "none": plain["total"], "full": ck["total"], "roles": plain["roles"]})
        for label, ft in OFFLOAD.items():
            plain, ck = base_offloaded(cfg, ft, "none", seq), base_offloaded(cfg, ft, "full", seq)
            out.append({"model": name, "recipe": label, "states": ck["states"], "none": plain["gpu"],
                        "full": ck["gpu"], "roles": None, "host": ck["host"]})
        out.append({"model": name, "recipe": "full, optimizer on CPU", "states": full_offloaded(cfg, "full", seq)
                    - need(cfg, F.Finetune(), "full", seq)["activations"],
                    "none": full_offloaded(cfg, "none", seq), "full": full_offloaded(cfg, "full", seq), "roles": None,
                    "host": accounting.model_states(cfg.n_params(), "mixed", 1, 1, "optimizer", "cpu").host})
    for r in out:
        r.setdefault("host", 0)    # CPU RAM the recipe needs (0: everything on the GPU)
        r["fits"] = {c: (r["none"] <= usable(c), r["full"] <= usable(c)) for c in CARDS}
    return out


def rtx3090(model: str = "llama-3-70b") -> dict:
    """The note's scenario (LoRA on one RTX 3090 with INT4 and CPU offload), the engine's
    ``single_gpu`` (QLoRA r16, 512 tokens, every layer checkpointed) against the card's usable
    bytes (``short_by``; ``capacity`` is what it reports), with what paging the optimizer would
    free, the seconds the rest costs over PCIe, and the step's compute at :data:`MFU`."""
    cfg = models.get(model)
    ft = F.Finetune(adapter="lora", base_dtype="nf4")
    s = F.single_gpu(cfg, ft, capacity=usable("rtx-3090")) | {"capacity": CARDS["rtx-3090"][1],
                                                               "usable": usable("rtx-3090")}
    roles = F.finetune_states(cfg, ft)
    pageable = roles["optimizer_moments"] + roles["optimizer_scales"]
    # what still does not fit must be frozen base weights streamed up at each use: forward,
    # the checkpointed re-run, backward (3 passes)
    rest = max(0, s["short_by"] - pageable)
    flops = lora_flops(cfg, ft, 512, recompute=True)
    # the route a library offers (FSDP CPU offload of every parameter, bnb_4bit_quant_storage=bf16,
    # as Answer.AI's fsdp_qlora runs 70B on two 24 GB cards): the whole 4-bit base crosses PCIe each
    # pass; the GPU keeps the activations, the dequantised matrix and two blocks' 4-bit weights
    o = base_offloaded(cfg, ft, "full", 512)
    t = {"compute_s": flops / (RTX3090_BF16 * MFU), "dequant_s": dequant_seconds(cfg, RTX3090_MEM, True),
         "fsdp_pcie_s": o["copied"] / PCIE4}
    # as offload_seconds: serial adds the copy, overlapped (FSDP's prefetch) hides the shorter part
    busy = t["compute_s"] + t["dequant_s"]
    return s | t | {"model": model, "pageable": pageable, "streamed": rest, "pcie_s": 3 * rest / PCIE4,
                    "fsdp_streamed": o["streamed"], "fsdp_root": o["root"], "fsdp_resident": o["gpu"],
                    "fsdp_host": o["host"],
                    "step_serial": t["fsdp_pcie_s"] + busy, "step_overlapped": max(t["fsdp_pcie_s"], busy)}


def lora_flops(cfg, ft: F.Finetune, tokens: int, recompute: bool = False) -> int:
    """FLOPs of a LoRA/QLoRA step (the engine's ``finetune_time.lora_flops``): forward 2 N T,
    backward only the inputs' gradients for the frozen base (2 N T), the adapters 6 n_a T, a re-run
    forward 2 N T with full checkpointing. Full fine-tuning: ``compute.train_flops`` (6 N T)."""
    return finetune_time.lora_flops(cfg, ft, tokens, recompute)


def dequant_seconds(cfg, hbm: float, checkpoint: bool) -> float:
    """Seconds a step spends turning the NF4 base into bf16, memory-bound at ``hbm`` bytes/s
    (``finetune_time.dequant_seconds``): passes forward, backward (bitsandbytes dequantises again)
    and the re-run forward with checkpointing. Assumption: the kernel reaches the datasheet bandwidth."""
    return finetune_time.dequant_seconds(cfg, hbm, 2 + checkpoint)


def step_seconds(cfg, ft: F.Finetune, gpu: str = "h100-80gb", seq: int = SEQ, checkpoint: bool = True,
                 mfu: float = MFU) -> dict:
    """A step on one ``gpu``: compute at ``mfu`` of the dense bf16 peak, plus (QLoRA) the
    dequantisation, which no FLOP count holds. The FLOPs include the checkpointed re-run, so
    ``mfu`` acts here as a hardware-FLOPs utilisation (HFU; an assumption, see :data:`MFU`)."""
    g = gpus.get(gpu)
    c = lora_flops(cfg, ft, seq * BATCH, checkpoint) / (g.bf16_flops * mfu)
    d = dequant_seconds(cfg, g.hbm, checkpoint) if ft.base_dtype == "nf4" else 0.0
    return {"compute": c, "dequant": d, "total": c + d}


def qlora_65b(seq: int = QLORA_SEQ, batch: int = QLORA_BATCH) -> dict:
    """The QLoRA paper's claim (arXiv:2305.14314 abstract: "finetune a 65B parameter model on a
    single 48GB GPU"), counted with its code's settings: states, activations with and without
    checkpointing, the card, and ``pageable``: the paged optimizer's fp32 states, which CUDA
    unified memory can move to the host when the GPU runs short (``total_ckpt - pageable`` is
    what must stay on the GPU)."""
    ck = need(LLAMA_65B, QLORA_PAPER, "full", seq, batch)
    plain = need(LLAMA_65B, QLORA_PAPER, "none", seq, batch)
    return {"states": ck["states"], "roles": ck["roles"], "acts_ckpt": ck["activations"],
            "acts_none": plain["activations"], "total_ckpt": ck["total"], "total_none": plain["total"],
            "pageable": ck["roles"]["optimizer_moments"], "seq": seq, "batch": batch,
            "usable": usable("a6000"), "capacity": CARDS["a6000"][1],
            "dropout_extra": dropout_extra(LLAMA_65B, seq, batch)}


def dropout_extra(cfg, seq: int, batch: int) -> int:
    """Bytes ``lora_dropout`` adds to the re-run layer on a GPU (bf16 adapters, all seven targets):
    each adapter saves its own dropped bf16 copy (2 B) and a 1-byte mask (3 B an element) instead of
    its input: q, k, v, gate, up (h wide) and o (h) and down (F) give 18 h + 3 F a token, and what
    no longer needs saving is the shared normed input of q/k/v and of gate/up (2 x 2 h) and down's
    input (2 F); o's input stays, as flash attention saves its output anyway: 14 h + F a token."""
    return (14 * cfg.d_model + cfg.ffn) * seq * batch


def double_quant_saving(cfg=LLAMA_65B) -> float:
    """Bytes double quantisation saves over fp32 block absmaxes (32 bits per 64 weights) on a
    model's quantised weights (the paper: 0.373 bits per parameter, about 3 GB for 65B)."""
    q = sum(F.quantised_tensors(cfg))
    return q * (32 / F.NF4_BLOCK - (8 / F.NF4_BLOCK + 32 / (F.NF4_BLOCK * F.NF4_SCALE_BLOCK))) / 8


def measured_h2d() -> tuple[str, float] | None:
    """(the GPU and date, pinned host-to-device bytes/s) of the newest committed GPU run that measured
    it (chapter 05's ``ch05.h2d_pinned_bytes_per_s``, ``results/gpu/``), or None."""
    from gpumem.course import gpu_results
    for run, got in gpu_results.values("05"):
        if "ch05.h2d_pinned_bytes_per_s" in got:
            return f"{run['gpu']}, {run['date']}", got["ch05.h2d_pinned_bytes_per_s"]
    return None
