"""A fine-tuning layout as the switches people set (``plan`` with chapter 08's options): peft's
``LoraConfig``, transformers' ``BitsAndBytesConfig`` (QLoRA), the Hugging Face Trainer's
arguments, and the DeepSpeed config or FSDP2 call that shards it. Torch-free; names as in peft
0.21.2, transformers 5.24.0, DeepSpeed 0.19.8 and PyTorch 2.13.

* peft ``LoraConfig(r, lora_alpha, target_modules, lora_dropout, bias, task_type)``; Llama's
  projections are ``q_proj k_proj v_proj o_proj gate_proj up_proj down_proj``. ``lora_alpha`` only
  scales the update (no bytes, no seconds): 2 r is a common choice, not a requirement.
* ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
  bnb_4bit_compute_dtype=torch.bfloat16)``; sharded by FSDP or ZeRO-3 it also needs
  ``bnb_4bit_quant_storage=torch.bfloat16`` (peft's "Use PEFT QLoRA and DeepSpeed with ZeRO3" and
  FSDP + QLoRA guides), so that the packed codes are a bf16 tensor the sharder can split.
* The Trainer's ``optim``: ``adamw_torch_fused`` (torch AdamW, its default with torch >= 2.8),
  ``adamw_bnb_8bit`` (bitsandbytes AdamW8bit), ``paged_adamw_32bit`` (bitsandbytes PagedAdamW32bit);
  ``activation_checkpointing=True`` is the full policy (every block re-run; ``gradient_checkpointing``
  is its deprecated alias in transformers 5.24). DeepSpeed goes in as ``deepspeed=<config dict>``;
  FSDP as ``fsdp=True`` with ``fsdp_config`` (``version``, ``cpu_offload``, ``activation_checkpointing``:
  transformers 5.24 ``training_args.py``).
"""

TARGET_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
                  "down": "down_proj"}
TRAINER_OPTIM = {"adamw": "adamw_torch_fused", "adamw-8bit": "adamw_bnb_8bit", "paged-adamw": "paged_adamw_32bit"}


def fsdp_version(ft) -> int:
    """FSDP1 for a 4-bit base (the route peft's FSDP + QLoRA guide and Answer.AI's fsdp_qlora test;
    bitsandbytes issue #1945, open: wrong outputs reported under FSDP2), FSDP2 (the Trainer's default) else."""
    return 1 if ft.base_dtype == "nf4" else 2


def configs(cfg, ft, lay) -> dict:
    """``peft``, ``bitsandbytes``, ``trainer`` (the Trainer's arguments, with ``deepspeed`` or ``fsdp`` +
    ``fsdp_config`` inside when used) for ``lay`` (None where not used)."""
    peft = None
    if ft.lora:
        peft = {"r": ft.lora_rank, "lora_alpha": 2 * ft.lora_rank,
                "target_modules": [TARGET_MODULES[t] for t in ft.lora_targets], "lora_dropout": 0.0,
                "bias": "none", "task_type": "CAUSAL_LM"}
    bnb = None
    if ft.base_dtype == "nf4":
        bnb = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
               "bnb_4bit_compute_dtype": "bfloat16"}
        if lay.zero == 3:
            bnb["bnb_4bit_quant_storage"] = "bfloat16"
    ckpt = lay.checkpoint == "full"
    trainer = {"per_device_train_batch_size": lay.micro_batch, "gradient_accumulation_steps": lay.n_micro,
               "bf16": True, "optim": TRAINER_OPTIM[ft.optimizer]}
    if lay.zero < 3:
        trainer["activation_checkpointing"] = ckpt
        if lay.dp > 1:
            zero = {"stage": lay.zero} | ({"reduce_bucket_size": 50_000_000, "allgather_bucket_size": 50_000_000}
                                         if lay.zero in (1, 2) else {})
            trainer["deepspeed"] = {"train_micro_batch_size_per_gpu": lay.micro_batch,
                                    "gradient_accumulation_steps": lay.n_micro, "bf16": {"enabled": True},
                                    "zero_optimization": zero}
    else:        # FSDP checkpoints inside its wrapper (the Trainer's argument would add an all-gather)
        trainer["fsdp"] = True
        trainer["fsdp_config"] = {"version": fsdp_version(ft), "reshard_after_forward": True,
                                  "cpu_offload": lay.base_on_cpu, "activation_checkpointing": ckpt,
                                  "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    return {"peft": peft, "bitsandbytes": bnb, "trainer": trainer}
