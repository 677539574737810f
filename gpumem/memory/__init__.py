"""The memory engine: what a training step holds, by formula and by exact trace.

Formulas, torch-free (``python -m gpumem estimate`` answers without importing torch):
``models`` (the registry), ``gpus`` (capacity as reported, usable after a reserve, speeds),
``policies`` (kernel, checkpoint, norm and AdamW names), ``accounting`` (model states by recipe,
ZeRO stage and offload; ZeRO-3's working set), ``zero3_schedule`` (DeepSpeed ZeRO-3's gather
schedule replayed: the working set's gathered part), ``activations`` (tensor by tensor),
``megatron`` (Korthikanti's formula beside Llama's count), ``recompute_plans`` and
``recompute_cost`` (checkpoint plans, their bytes and FLOPs), ``attention_flops`` (attention's
FLOPs and HBM bytes), ``offload_cost`` (offload's bytes per link), ``estimate``; for fine-tuning
(chapter 08) ``finetune_setup`` (one setup and its checks), ``finetune`` (8-bit AdamW, LoRA and
QLoRA states by role), ``finetune_acts`` (what a frozen base saves) and ``finetune_options``.
The formulas count bytes and FLOPs only; the seconds they take are :mod:`gpumem.timing`'s.

Traced and measured, with torch: ``llama`` (the model), ``optim`` (mixed-precision AdamW, and
which AdamW a trace runs), ``tracing`` (MemTracker on fake tensors: ``tracer`` traces a step,
``trace_compose`` composes a full depth from three shallow ones), ``timeline`` (bytes per
category after every operator; one ZeRO-3 GPU's view and verdict), ``measure`` (real CPU and CUDA steps), ``crosscheck`` (formula
vs trace), ``ds_estimators`` (DeepSpeed's own estimators), ``bench``; for checkpointing,
``recompute`` (from scratch, PyTorch's, DeepSpeed's, selective; any plan on the Llama),
``recompute_trace`` (the forward/recompute/backward event trace), ``flops`` (FlopCounterMode),
``recompute_cuda`` (the GPU path).

Imports only ``gpumem.units`` and ``gpumem.errors`` from outside; never the course or a chapter.
"""
