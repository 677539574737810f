"""Fine-tuning's model states by formula: 8-bit AdamW, LoRA and QLoRA (chapter 08). Torch-free.

API (``estimate``, chapter 08's traces and real runs use these):
:class:`Finetune` (one setup), :func:`validate` (bad combinations: one-line UsageError),
:func:`lora_params`, :func:`nf4_bytes_per_param`, :func:`finetune_states` (role -> bytes per
GPU) and :func:`finetune_activation_bytes` (saved activations, from ``finetune_acts``).

Sources, per figure:
* LoRA adds B (out x r) and A (r x in) beside each adapted matrix, no bias (peft ``LoraConfig``:
  ``bias="none"``, ``lora_dropout=0.0`` defaults, ``peft/tuners/lora/config.py``): r (in + out)
  trainable elements per matrix. Llama-3-8B, r = 16, all seven projections: 41,943,040 (peft's
  ``print_trainable_parameters`` as widely reproduced: "trainable params: 41,943,040 || all
  params: 8,072,204,288"; tests derive it by hand).
* peft keeps adapters in fp32 by default (``get_peft_model(..., autocast_adapter_dtype=True)``
  upcasts bf16/fp16 adapter weights, ``tuners_utils._cast_adapter_dtype``): the fp32 adapter is its
  own master copy; gradients in the same dtype; torch AdamW's moments in the parameter's dtype
  and a 4-byte ``step`` tensor per parameter tensor (as ``accounting`` counts for torch AdamW).
* NF4 (QLoRA, arXiv:2305.14314 section 3): 4-bit codes, one absmax per 64 weights; double
  quantisation stores those absmaxes in 8 bits with one fp32 scale per 256 of them:
  4 + 8/64 + 32/(64 x 256) = 4.127 bits per weight (the paper: 0.127 bits of constants, down
  from 0.5). Per tensor, bitsandbytes 0.50.2 ``functional.quantize_4bit`` also keeps an fp32
  offset (the absmaxes' mean), its 16-value fp32 NF4 code, and a copy of the 256-value fp32 map
  of the nested 8-bit quantisation (``quantize_blockwise``: ``code.to(A.device, copy=True)``).
* What is quantised: the blocks' linear layers (bitsandbytes ``Linear4bit``); transformers keeps
  the output head unquantised (``quantizers/base.py`` ``get_keys_to_not_convert``), and the
  embedding and norms are not linear layers: they stay bf16. With ``Finetune(prepare=True)``:
  peft's ``prepare_model_for_kbit_training`` has upcast those to fp32 (``utils/other.py``: every
  parameter that is not ``Params4bit``), 4 B each instead of 2 (+4.2 GB for Llama-3-70B).
* The dequantised weight: bitsandbytes' ``gemm_4bit`` (the default and CPU path, and CUDA for
  training-sized batches) dequantises the whole matrix to the compute dtype and calls
  ``F.linear``; ``MatMul4Bit.backward`` dequantises it again for the input gradient. One bf16
  matrix and its fp32 absmax vector exist at a time: the largest quantised matrix's.
* 8-bit AdamW (arXiv:2110.02861, block-wise quantisation): bitsandbytes ``Optimizer2State.
  init_state``: two uint8 states, blocks of 256 (``blocksize = 256``) with one fp32 absmax per
  block each: 2 + 8/256 B per element; tensors under ``min_8bit_size`` = 4096 elements keep two
  fp32 states; two shared 256-value fp32 maps (``fill_qmap``); the step is a Python int.
  Paged (``PagedAdamW8bit``): the same bytes, in unified memory that may be evicted to the host.
* ``paged-adamw`` (bitsandbytes ``PagedAdamW32bit``, the QLoRA repository's default
  ``optim="paged_adamw_32bit"``): ``init_state`` with ``optim_bits=32`` allocates ``state1`` and
  ``state2`` in fp32 whatever the parameter's dtype (8 B per adapter element, also for bf16
  adapters), no scales, and its step is a Python int (no step bytes).
Assumptions (labelled): with ZeRO, trainable states shard as ``accounting`` shards them (adapters
at stage 3, their gradients at 2, the optimizer at 1; an 8-bit state shards as one flat
partition); ZeRO-3 shards the packed 4-bit weights (peft's DeepSpeed guide: ZeRO-3 + QLoRA with
``bnb_4bit_quant_storage`` set to the model's dtype) but not their quantisation constants, which
are attributes, not parameters (replicated).
"""

from collections import Counter

from . import accounting
from .finetune_setup import (ADAPTER_DTYPES, ADAPTERS, BASE_DTYPES, FT_TARGETS, OPTIMIZERS, Finetune,  # noqa: F401
                             adapter_tensors, lora_params, matrices, validate)

NF4_BLOCK, NF4_SCALE_BLOCK = 64, 256      # QLoRA section 3; bitsandbytes quantize_4bit defaults
ADAM8_BLOCK, ADAM8_MIN = 256, 4096        # bitsandbytes Optimizer2State: blocksize, min_8bit_size
QMAP_BYTES = 256 * 4                      # one create_dynamic_map(): 256 fp32 values
ROLES = ("base_weights", "quant_constants", "adapter_weights", "grads", "master",
         "optimizer_moments", "optimizer_scales", "step_counters", "dequant_buffer")


def nf4_bytes_per_param(block: int = NF4_BLOCK, scale_block: int = NF4_SCALE_BLOCK) -> float:
    """Bytes per NF4 weight with double quantisation, from the block sizes: a 4-bit code, an 8-bit
    absmax per ``block`` weights, an fp32 scale per ``scale_block`` absmaxes (QLoRA section 3:
    4 + 8/64 + 32/(64 x 256) = 4.127 bits)."""
    return (4 + 8 / block + 32 / (block * scale_block)) / 8


def nf4_tensor_bytes(n: int) -> tuple[int, int]:
    """(packed codes, constants) in bytes of one n-element weight in bitsandbytes 0.50.2: codes
    ceil(n/2) bytes; constants: ceil(n/64) uint8 absmaxes, ceil(that/256) fp32 scales, the fp32
    offset, the 16-value fp32 NF4 code and the nested quantisation's 256-value fp32 map."""
    blocks = -(-n // NF4_BLOCK)
    return -(-n // 2), blocks + 4 * -(-blocks // NF4_SCALE_BLOCK) + 4 + 16 * 4 + QMAP_BYTES


def quantised_tensors(cfg) -> list[int]:
    """Element counts of the weights Linear4bit replaces: each block's linear matrices."""
    return [i * o for i, o in matrices(cfg).values()] * cfg.n_layers


def adam8_bytes(sizes: list[int]) -> tuple[int, int]:
    """(moments, scales) in bytes of bitsandbytes' 8-bit AdamW over tensors of ``sizes``
    elements: 2n + fp32 absmax per 256, or two fp32 states under 4096 elements, + the two maps."""
    alike = Counter(sizes).items()          # a model's layers repeat their tensors: each size once
    moments = sum(c * (2 * n if n >= ADAM8_MIN else 8 * n) for n, c in alike)
    scales = sum(c * 8 * -(-n // ADAM8_BLOCK) for n, c in alike if n >= ADAM8_MIN)
    return moments, scales + (2 * QMAP_BYTES if any(n >= ADAM8_MIN for n in sizes) else 0)


def param_tensors(cfg) -> list[int]:
    """Element counts of the model's parameter tensors as transformers builds them (as many as
    ``estimate.n_param_tensors``; a mixture of experts' fused expert tensors count one each),
    for per-tensor optimizer counting."""
    h, q, kv, F = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.ffn
    layer = [h * (q + 2 * kv)] if cfg.fused_qkv else [h * q, h * kv, h * kv]
    layer += [q * h] + [q + 2 * kv] * cfg.qkv_bias * (1 if cfg.fused_qkv else 0)
    layer += [q, kv, kv] * (cfg.qkv_bias and not cfg.fused_qkv) + [h] * cfg.o_bias
    norm = [h] * (2 if cfg.norm_kind == "layer" else 1)            # LayerNorm: a weight and a bias
    layer += [cfg.head_dim] * (2 * cfg.qk_norm) + norm * cfg.norms_per_layer
    if cfg.moe:
        E = cfg.n_experts
        layer += [E * 2 * F * h, E * F * h, E * h] + [h * cfg.shared_expert_ffn] * (3 * bool(cfg.shared_expert_ffn))
    else:
        mats = 2 if cfg.mlp == "gelu" else 3
        layer += [h * F] * mats + ([F] * (mats - 1) + [h]) * cfg.mlp_bias
    outside = [cfg.vocab * h] * (2 - cfg.tie_embeddings) + [cfg.positions * h] * (cfg.positions > 0)
    return layer * cfg.n_layers + outside + norm


def finetune_states(cfg, ft: Finetune, *, gpus: int = 1, zero: int = 0) -> dict[str, int]:
    """Role -> bytes per GPU (every role of :data:`ROLES`, 0 where unused):

    ``base_weights`` (full fine-tuning: the trained weights; LoRA: the frozen bf16 base; QLoRA:
    packed 4-bit codes + the bf16 embedding, head and norms, fp32 with ``prepare``), ``quant_constants`` (NF4 absmaxes,
    scales, offsets, codes), ``adapter_weights``, ``grads``, ``master`` (fp32 copy), the
    optimizer's ``optimizer_moments``, ``optimizer_scales`` (8-bit block absmaxes and maps) and
    ``step_counters``, and ``dequant_buffer`` (QLoRA: the bf16 dequantised largest matrix and its
    fp32 absmaxes, alive during its matmul in forward and backward). Full fine-tuning with
    ``adamw`` is ``accounting.model_states`` with torch AdamW's step counters, split by role."""
    validate(ft, zero)
    roles = dict.fromkeys(ROLES, 0)
    n = cfg.n_params()
    sh = accounting.shard
    if not ft.lora:
        n_tensors = len(param_tensors(cfg))        # = estimate.n_param_tensors(cfg) (a test checks)
        s = accounting.model_states(n, ft.recipe, gpus, zero, n_tensors=n_tensors)
        r = accounting.recipe(ft.recipe)
        o_elems = sh(n, gpus) if zero >= 1 else n
        master = 4 * o_elems if any(lab.startswith("master") for lab, _ in r.optimizer) else 0
        counters = 4 * n_tensors if r.step_counter else 0
        roles.update(base_weights=s.params, grads=s.grads, master=master)
        if ft.optimizer == "adamw":
            roles.update(optimizer_moments=s.optimizer - master - counters, step_counters=counters)
        else:
            sizes = [sh(n, gpus)] if zero >= 1 else param_tensors(cfg)
            roles["optimizer_moments"], roles["optimizer_scales"] = adam8_bytes(sizes)
        return roles
    a_sizes = adapter_tensors(cfg, ft.lora_rank, ft.lora_targets)
    n_a, e_a = sum(a_sizes), 4 if ft.adapter_dtype == "fp32" else 2
    if ft.base_dtype == "bf16":
        roles["base_weights"] = 2 * (sh(n, gpus) if zero == 3 else n)
    else:
        q_sizes = quantised_tensors(cfg)
        alike = Counter(q_sizes).items()   # each layer's matrices again: each size once
        packed = sum(c * nf4_tensor_bytes(m)[0] for m, c in alike)
        rest = n - sum(q_sizes)
        e_rest = 4 if ft.prepare else 2          # prepare_model_for_kbit_training: fp32 embedding, head, norms
        roles["base_weights"] = sh(packed, gpus) + e_rest * sh(rest, gpus) if zero == 3 else packed + e_rest * rest
        roles["quant_constants"] = sum(c * nf4_tensor_bytes(m)[1] for m, c in alike)
        big = max(q_sizes)
        roles["dequant_buffer"] = 2 * big + 4 * -(-big // NF4_BLOCK)
    roles["adapter_weights"] = e_a * (sh(n_a, gpus) if zero == 3 else n_a)
    roles["grads"] = e_a * (sh(n_a, gpus) if zero >= 2 else n_a)
    if ft.optimizer == "adamw":
        roles["optimizer_moments"] = 2 * e_a * (sh(n_a, gpus) if zero >= 1 else n_a)
        roles["step_counters"] = 4 * len(a_sizes)
    elif ft.optimizer == "paged-adamw":
        roles["optimizer_moments"] = 8 * (sh(n_a, gpus) if zero >= 1 else n_a)
    else:
        sizes = [sh(n_a, gpus)] if zero >= 1 else a_sizes
        roles["optimizer_moments"], roles["optimizer_scales"] = adam8_bytes(sizes)
    return roles


def block_weights(cfg, ft: Finetune) -> int:
    """One decoder block's weights as FSDP gathers or copies them up (one unit per block): the base
    (bf16, or NF4's packed codes, stored in bf16 as ``bnb_4bit_quant_storage`` lets FSDP shard them),
    its norms (bf16, fp32 with ``prepare``) and, with LoRA, the block's adapters."""
    per = sum(quantised_tensors(cfg)) // cfg.n_layers
    if ft.base_dtype == "nf4":
        base = sum(c * nf4_tensor_bytes(m)[0] for m, c in Counter(quantised_tensors(cfg)).items()) // cfg.n_layers
    else:
        base = 2 * per
    norms = cfg.d_model * cfg.norms_per_layer
    if not ft.lora:
        return base + 2 * norms
    e_a = 4 if ft.adapter_dtype == "fp32" else 2
    adapters = e_a * lora_params(cfg, ft.lora_rank, ft.lora_targets) // cfg.n_layers
    return base + (4 if ft.prepare else 2) * norms + adapters


def root_weights(cfg, ft: Finetune) -> int:
    """The weights outside the blocks (embedding, head, final norm; bf16, fp32 with ``prepare``):
    FSDP2's root unit, kept gathered from forward to backward (``reshard_after_forward`` is False
    for the root)."""
    outside = cfg.n_params() - sum(quantised_tensors(cfg)) - cfg.n_layers * cfg.d_model * cfg.norms_per_layer
    return (4 if ft.prepare else 2) * outside


def block_grads(cfg, ft: Finetune) -> int:
    """One block's gradients before FSDP reduce-scatters them: its adapters' (in their dtype), or
    with full fine-tuning its bf16 weights'."""
    if not ft.lora:
        return 2 * (sum(quantised_tensors(cfg)) // cfg.n_layers + cfg.d_model * cfg.norms_per_layer)
    e_a = 4 if ft.adapter_dtype == "fp32" else 2
    return e_a * lora_params(cfg, ft.lora_rank, ft.lora_targets) // cfg.n_layers


def grouped(roles: dict[str, int]) -> dict[str, int]:
    """Roles summed into ``estimate``'s categories: params (base, constants, adapters), grads,
    optimizer (master, moments, scales, counters) and buffers (the dequantised weight)."""
    return {"params": roles["base_weights"] + roles["quant_constants"] + roles["adapter_weights"],
            "grads": roles["grads"],
            "optimizer": roles["master"] + roles["optimizer_moments"] + roles["optimizer_scales"]
            + roles["step_counters"],
            "buffers": roles["dequant_buffer"]}


def finetune_activation_bytes(cfg, ft: Finetune, seq: int, batch: int, *, attention: str = "flash",
                              checkpoint: str = "none", norm: str = "fused", impl: str = "course",
                              device: str = "cuda") -> dict[str, int]:
    """Activation bytes of one step by part, with ``peak`` (see ``finetune_acts``): full
    fine-tuning is ``activations.activations``; LoRA and QLoRA count what a frozen base saves.
    ``norm="hf", impl="hf"``: transformers' own Llama (as ``activations`` counts it);
    ``device="cpu"``: where peft's QLoRA layer behaves differently under CPU autocast."""
    from .finetune_acts import finetune_activations
    return finetune_activations(cfg, ft, seq, batch, attention, checkpoint, norm, impl, device)


RTX3090_BYTES = 24_576 * 2**20   # an RTX 3090's memory.total in nvidia-smi: 24,576 MiB (24 GB GDDR6X)


def single_gpu(cfg, ft: Finetune | None = None, capacity: int = RTX3090_BYTES, seq: int = 512,
               batch: int = 1, checkpoint: str = "full", attention: str = "flash") -> dict[str, int]:
    """One fine-tuning step on one GPU, against its capacity: the study note's "70B, INT4 LoRA, one
    24 GB RTX 3090" scenario with the defaults (QLoRA r = 16 on all seven projections, seq 512,
    every layer checkpointed: assumptions, the note gives none). Returns the model states
    (``states``, roles summed, with the dequantised buffer), ``activations`` (peak),
    ``total``, ``capacity`` and ``short_by`` (bytes that must leave the GPU: offload)."""
    ft = ft or Finetune(adapter="lora", base_dtype="nf4")
    states = sum(finetune_states(cfg, ft).values())
    acts = finetune_activation_bytes(cfg, ft, seq, batch, attention=attention, checkpoint=checkpoint)["peak"]
    return {"states": states, "activations": acts, "total": states + acts, "capacity": capacity,
            "short_by": max(0, states + acts - capacity)}
