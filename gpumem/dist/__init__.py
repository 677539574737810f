"""The distributed engine: running code on N ranks, and sharding it.

``launch`` (one function on N CPU ranks over gloo, or one rank per GPU over NCCL; also under
torchrun and the deepspeed launcher), ``training`` (the same model, data and hyper-parameters on
every rank), ``zero`` (ZeRO stages 0-3 from scratch), ``ds_engine`` (a DeepSpeed engine's config
and what it holds), ``dsops`` (DeepSpeed's CPU ops, built once into the course cache),
``examples`` (tiny rank functions that show the launcher).

May import ``gpumem.memory``; never the course or a chapter.
"""
