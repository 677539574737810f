"""Seconds, beside the bytes of :mod:`gpumem.memory`: the time engine (torch-free).

What it holds:

* :mod:`.hardware`: node types (DGX A100, DGX H100, HGX H200, an H100 RoCE node, an 8 x L4 cloud
  box, Colab's T4), every figure with its source or labelled an assumption, and a
  ``Cluster(node, nodes).group(size, stride)`` placement of a process group on nodes;
* :mod:`.collectives`: the alpha-beta cost of all-gather, reduce-scatter, all-reduce (ring, tree,
  NVLS), all-to-all and send/recv over a placed group, ``collective_time(coll, nbytes, group)``,
  naming the binding link; checked against published nccl-tests figures;
* :mod:`.schedules` (and :mod:`.schedule_sim`, its independent check): GPipe, 1F1B, interleaved
  1F1B, ZB-H1 and ZB-H2 pipeline schedules;
* :mod:`.zero3_cost` and :mod:`.zero_layouts`: ZeRO-3's gathers and reduce-scatters by group shape,
  and the sharding layouts per step (ZeRO-3, hpZ, MiCS/HSDP, ZeRO-1), used by chapters 02 and 07;
* :mod:`.compute`: a step's FLOPs, the whole-step MFU (40 %) and the planner's kernel share (54 %,
  calibrated once), and AdamW's HBM-bound step, in seconds;
* :mod:`.overlap`: what DeepSpeed (ZeRO-0 to 3), FSDP2, Megatron-Core and torchtitan hide behind
  which compute window, each entry with its source file and function;
* :mod:`.context_parallel`: ring attention (TransformerEngine's p2p ring) and all-gather context
  parallelism: bytes, exposed seconds, transient buffers, where it pays;
* :mod:`.attention_time`: the roofline bound on attention's FLOPs and HBM bytes (chapter 04);
* :mod:`.offload_time`: NVMe drives, datasheet and measured links, and the seconds of an offloaded
  step (ideal and stock schedules, break-even tokens) from :mod:`gpumem.memory.offload_cost`'s bytes;
* :mod:`.offload`: ZeRO-Infinity's bandwidth-centric parameter reads (chapter 05);
* :mod:`.published`: measured training runs from papers and benchmark tables, with sources; the
  planner prices each run's own layout against them in :mod:`gpumem.planner.validate`.

The planner (:mod:`gpumem.planner`) prices its compute, collectives and offload here;
:mod:`gpumem.memory` keeps the bytes and FLOP counts these seconds are built on.
"""
