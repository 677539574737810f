"""The distributed engine: running code on N ranks, and sharding it.

``launch`` (one function on N CPU ranks over gloo, or one rank per GPU over NCCL; also under
torchrun and the deepspeed launcher), ``training`` (the same model, data and hyper-parameters on
every rank), ``zero`` (ZeRO stages 0-3 from scratch), ``gradmeter`` (peak gradient bytes during
backward, measured on the tensors), ``zero3_schedule`` (DeepSpeed ZeRO-3's gather schedule
replayed without DeepSpeed; it lives in ``gpumem.memory``; ZeRO-3's seconds per step are
``gpumem.timing.zero3_cost``),
``ds_engine`` (a DeepSpeed engine's config and what it holds), ``ds_audit`` (which config keys
DeepSpeed reads), ``dsops`` (DeepSpeed's CPU ops, built once into the course cache),
``examples`` (tiny rank functions that show the launcher).

May import ``gpumem.memory``; never the course or a chapter.
"""
