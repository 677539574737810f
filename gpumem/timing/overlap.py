"""What each framework overlaps with compute, as data with sources, and the seconds left exposed.

A step's communication and host work (a *term*, :data:`TERMS`) either runs on a side stream while
some compute runs (its *window*, :data:`WINDOWS`) or holds the GPU up. For each framework,
:data:`FRAMEWORKS` gives every term an :class:`Overlap`: the window, the share of the window that
hides it, and the code that says so ("file, function (line)"). :func:`exposed` applies it:
``max(0, seconds - share x window)``; share 0 leaves the term fully exposed.

Windows: ``forward``, ``backward``, ``forward+backward`` (all micro-batches' passes of a step);
``last_backward`` (the last micro-batch's backward: reductions deferred by gradient accumulation);
``attention`` (the attention compute of the layers the term serves); ``attention_step`` (one ring
step's attention: what an all-gather launched at step 0 hides behind); ``none``.

Terms a framework does not perform (ZeRO-3's gathers under ZeRO-1, a parameter all-gather after
the step under FSDP) are listed with window ``none`` and a source that says "not performed": their
seconds are 0. Flags: DeepSpeed with ``overlap_comm: true`` (the course's configs; DeepSpeed's own
default is true only for stage 3, zero/config.py ``overlap_comm_valid``); ``megatron`` is
Megatron-Core's defaults with the 1F1B schedule, ``megatron-overlap`` adds
``--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap`` and
the interleaved schedule.

Assumption: a hidden term costs compute nothing (share 1.0). Real overlap is below 1: NCCL kernels
take SMs and HBM bandwidth from the compute they run beside, and a bucket issued after the last
backward kernel has nothing left to hide behind. Effect: exposed seconds here are a lower bound.
"""

from dataclasses import dataclass

from ..errors import UsageError, one_of

TERMS = ("dp_grad_reduce", "dp_param_gather", "zero3_gather", "tp_collectives", "pp_p2p", "cp_ring",
         "optimizer_step", "offload_copies", "cpu_adam", "nvme_state_swaps")
WINDOWS = ("forward", "backward", "forward+backward", "last_backward", "attention", "attention_step", "none")


@dataclass(frozen=True)
class Overlap:
    """How one term runs: ``share`` of ``window``'s compute hides it; ``source``: file, function."""
    window: str
    share: float
    source: str


def _o(window: str, source: str) -> Overlap:
    return Overlap(one_of(window, WINDOWS, "window"), 0.0 if window == "none" else 1.0, source)


_DS = "DeepSpeed 0.19.8 deepspeed/runtime/zero/"
_S12, _S3, _PPC = _DS + "stage_1_and_2.py", _DS + "stage3.py", _DS + "partitioned_param_coordinator.py"
_FS = "PyTorch 2.13 torch/distributed/fsdp/_fully_shard/"
_MC = "NVIDIA/Megatron-LM@d98e8a6 (core 0.20.0) megatron/"
_TT = "pytorch/torchtitan@b5bcd76 torchtitan/"
_NOT = "not performed: "

DS_TP = _o("none", "DeepSpeed 0.19.8 module_inject/layers.py, LinearAllreduce.forward (896) -> "
                   "RowParallel.forward (215): dist.all_reduce inline (AsyncColumnParallel.backward "
                   "may overlap a backward all-reduce with the weight gradient: not counted)")
DS_PP = _o("none", "DeepSpeed 0.19.8 runtime/pipe/engine.py, _exec_send_activations (1024) -> "
                   "pipe/p2p.py send/recv (46, 67): blocking dist.send/recv")
DS_CP = _o("none", _NOT + "DeepSpeed has no ring attention; its sequence parallelism is Ulysses "
                   "(deepspeed/sequence/layer.py, DistributedAttention: all-to-alls, another term)")
DS_OPT = _o("none", _S12 + ", DeepSpeedZeroOptimizer.step (3013): the update runs after backward")
DS_ADAM = _o("none", _S12 + ", step (3013) -> _optimizer_step (2967) -> ops/adam/cpu_adam.py "
                     "DeepSpeedCPUAdam.step (117): after backward, in series (ZenFlow, off by default, "
                     "overlaps it)")
DS_NVME12 = _o("none", _NOT + "stage_1_and_2.py has no NVMe swapper (offload_config.py: parameter "
                       "offload 'Valid only with stage 3'); NVMe optimizer swapping is stage3.py's")
DS_NO_Z3 = _o("none", _NOT + "ZeRO-1/2 keep whole parameters on every rank")
DS_PARAM_AG = _o("none", _S12 + ", step (3013) -> all_gather_dp_groups (3155): after the update, "
                         "before step() returns")

_DS12 = {"dp_param_gather": DS_PARAM_AG, "zero3_gather": DS_NO_Z3, "tp_collectives": DS_TP,
         "pp_p2p": DS_PP, "cp_ring": DS_CP, "optimizer_step": DS_OPT, "cpu_adam": DS_ADAM,
         "nvme_state_swaps": DS_NVME12}

ZERO1 = dict(_DS12, dp_grad_reduce=_o(
    "last_backward", _S12 + ", process_gradients (2284) -> reduce_ready_partitions_and_remove_grads "
    "(2293): stage 1 reduces only at the accumulation boundary, in buckets on reduction_stream "
    "(reduce_ipg_grads, 2239)"), offload_copies=_o(
    "last_backward", _S12 + ", reduce_ipg_grads (2205) -> copy_grads_in_partition (2142): host "
    "copies of the reduced gradients with the boundary's reductions"))
ZERO0 = dict(ZERO1, dp_grad_reduce=_o(
    "none", "DeepSpeed 0.19.8 deepspeed/runtime/engine.py, allreduce_gradients (3073): without ZeRO the "
    "engine all-reduces the gradient buckets after backward, at the accumulation boundary"),
    offload_copies=_o("none", _NOT + "offload needs ZeRO (zero/offload_config.py)"))
ZERO2 = dict(_DS12, dp_grad_reduce=_o(
    "backward", _S12 + ", reduce_ready_partitions_and_remove_grads (2293): partition_gradients "
    "reduces every micro-batch in buckets, reduce_ipg_grads (2205) on reduction_stream -> "
    "average_tensor (1695): all-reduced while use_multi_rank_bucket_allreduce (default on)"),
    offload_copies=_o("backward", _S12 + ", copy_grads_in_partition (2142) -> "
                      "async_accumulate_grad_in_cpu_via_gpu (1809): every micro-batch, reduction_stream"))
ZERO3 = {
    "dp_grad_reduce": _o("backward", _S3 + ", reduce_independent_p_g_buckets_and_remove_grads (1569) -> "
                         "__reduce_and_partition_ipg_grads (1648) on reduce_and_partition_stream (1669)"),
    "dp_param_gather": _o("none", _NOT + "updated shards stay partitioned; the next forward gathers them "
                          "(zero3_gather)"),
    "zero3_gather": _o("forward+backward", _PPC + ", fetch_sub_module (310): prefetches the next modules' "
                       "parameters up to stage3_prefetch_bucket_size (452) on __allgather_stream (400); "
                       "release_sub_module (494) frees them"),
    "tp_collectives": DS_TP, "pp_p2p": DS_PP, "cp_ring": DS_CP,
    "optimizer_step": _o("none", _S3 + ", step (2873): sub-group by sub-group after backward"),
    "offload_copies": _o("forward+backward", _PPC + ", fetch_sub_module (310): offloaded parameters "
                         "come up with the prefetched gathers; " + _S3 + ", partition_grads (2006): "
                         "gradients go down on reduce_and_partition_stream"),
    "cpu_adam": _o("none", _S3 + ", step (2873) -> _optimizer_step (1235): CPU Adam per sub-group after "
                   "backward"),
    "nvme_state_swaps": _o("none", _S3 + ", step (2873): _prepare_sub_group -> "
                           "_optimizer_states_and_gradient_swap_in (2710), _release_sub_group -> "
                           "_optimizer_states_and_gradient_swap_out (2761); pipeline_read/write "
                           "overlap them with other sub-groups' CPU Adam, never with compute"),
}

TORCH_CP = _o("attention_step", "PyTorch 2.13 torch/distributed/tensor/experimental/_context_parallel/"
                                "_attention.py: rotate_method ALL_GATHER by default (77); "
                                "_AllGatherRotater.exchange_buffers (285) gathers at step 0, next_buffer "
                                "(293) waits at step 1: only the local step's attention hides it")
TORCH_PP = _o("none", "PyTorch 2.13 torch/distributed/pipelining/schedules.py, "
                      "Schedule1F1B._step_microbatches (1026): waits on each batched send+recv "
                      "(1105, 1127) before the next compute")
FSDP2 = {
    "dp_grad_reduce": _o("backward", _FS + "_fsdp_param_group.py, FSDPParamGroup.post_backward (588) -> "
                         "_fsdp_collectives.py foreach_reduce (522) on reduce_scatter_stream "
                         "(FSDPCommContext.lazy_init, 92); every micro-batch unless "
                         "set_requires_gradient_sync(False)"),
    "dp_param_gather": _o("none", _NOT + "shards stay sharded after the step; the next forward gathers them"),
    "zero3_gather": _o("forward+backward", _FS + "_fsdp_param_group.py, FSDPCommContext.lazy_init (84-89: "
                       "all_gather_stream overlaps the next all-gather with forward compute), "
                       "FSDPParamGroup._backward_prefetch (795); reshard_after_forward=False "
                       "skips the backward gather (fewer bytes, same overlap)"),
    "tp_collectives": _o("none", "PyTorch 2.13 torch/distributed/tensor/parallel/style.py, "
                         "RowwiseParallel._prepare_output_fn (293): DTensor redistributes inline"),
    "pp_p2p": TORCH_PP, "cp_ring": TORCH_CP,
    "optimizer_step": _o("none", "PyTorch 2.13 torch/optim/optimizer.py, Optimizer.step: the training "
                         "loop calls it after backward, on the sharded DTensors"),
    "offload_copies": _o("forward+backward", _FS + "_fsdp_param.py all_gather_inputs (834: H2D, "
                         "non_blocking); _fsdp_collectives.py foreach_reduce (711-743: D2H non_blocking "
                         "only when no gradient is accumulated into, else blocking)"),
    "cpu_adam": _o("none", _FS + "_fsdp_param_group.py finalize_backward (763-772) waits for the "
                   "gradients' D2H; the CPU optimizer steps after backward"),
    "nvme_state_swaps": _o("none", _NOT + "FSDP2 offloads to CPU only (_fsdp_api.py: CPUOffloadPolicy)"),
}

_MC_CP = _o("attention", _MC + "core/extensions/transformer_engine.py TEDotProductAttention "
                         "(cp_comm_type 'p2p' by default, 2141) -> TransformerEngine "
                         "AttnFuncWithCPAndKVP2P (gpumem.timing.context_parallel)")
MEGATRON = {
    "dp_grad_reduce": _o("none", _MC + "core/distributed/distributed_data_parallel.py, finish_grad_sync "
                         "(668) from finalize_model_grads after backward without --overlap-grad-reduce"),
    "dp_param_gather": _o("none", _NOT + "without --use-distributed-optimizer the gradients are "
                          "all-reduced and every rank updates whole parameters"),
    "zero3_gather": _o("none", _NOT + "parameters are whole on every data-parallel rank "
                       "(Megatron-FSDP, --use-megatron-fsdp, is another layout)"),
    "tp_collectives": _o("none", _MC + "core/model_parallel_config.py tp_comm_overlap=False (265); "
                         "tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication."
                         "backward (637) overlaps part of backward's: not counted"),
    "pp_p2p": _o("none", _MC + "training/arguments.py (1010-1013): the non-interleaved schedule sets "
                 "overlap_p2p_comm False"),
    "cp_ring": _MC_CP,
    "optimizer_step": _o("none", _MC + "training/training.py, train_step (3010): optimizer.step() "
                         "(3165) after forward_backward_func (3093) returns"),
    "offload_copies": _o("none", _MC + "core/optimizer/cpu_offloading/hybrid_optimizer.py, "
                         "HybridDeviceOptimizer.step (150): gradients D2H, parameters H2D inside step(); "
                         "--overlap-cpu-optimizer-d2h-h2d pipelines them with the CPU step only"),
    "cpu_adam": _o("none", _MC + "core/optimizer/cpu_offloading/hybrid_optimizer.py, "
                   "HybridDeviceOptimizer.step (150): cpu_optimizer.step() after backward"),
    "nvme_state_swaps": _o("none", _NOT + "Megatron-Core has no NVMe offload (no option in training/arguments.py)"),
}
MEGATRON_OVERLAP = dict(MEGATRON, **{
    "dp_grad_reduce": _o("last_backward", _MC + "core/distributed/param_and_grad_buffer.py, "
                         "register_grad_ready (863) -> start_grad_sync (600) per bucket; "
                         "pipeline_parallel/schedules.py no_sync_func for all micro-batches but the "
                         "last (forward_backward_no_pipelining, 814)"),
    "dp_param_gather": _o("forward", _MC + "core/distributed/distributed_data_parallel.py, "
                          "_make_forward_pre_hook (517) -> param_and_grad_buffer.py finish_param_sync "
                          "(538) dispatches the next bucket's gather (564-573); "
                          "optimizer/distrib_optimizer.py step_with_ready_grads gathers synchronously "
                          "without --overlap-param-gather"),
    "tp_collectives": _o("forward+backward", _MC + "training/initialize.py _initialize_tp_communicators "
                         "(194) -> TransformerEngine initialize_ub (userbuffers) with --tp-comm-overlap"),
    "pp_p2p": _o("forward+backward", _MC + "core/pipeline_parallel/schedules.py, "
                 "forward_backward_pipelining_with_interleaving (1019): overlap_p2p_comm, on by default "
                 "(training/arguments.py 3118, --no-overlap-p2p-communication)"),
})
TORCHTITAN = dict(FSDP2, tp_collectives=_o(
    "none", _TT + "config/configs.py, CompileConfig.enable_async_tensor_parallel (298) False by "
    "default: torch TP's collectives inline"))
TORCHTITAN_ASYNC_TP = dict(TORCHTITAN, tp_collectives=_o(
    "forward+backward", _TT + "distributed/compile.py, _maybe_enable_async_tp (75): "
    "torch._inductor.config._micro_pipeline_tp (matmuls split and pipelined with the TP collectives)"))

FRAMEWORKS = {"deepspeed-zero0": ZERO0, "deepspeed-zero1": ZERO1, "deepspeed-zero2": ZERO2, "deepspeed-zero3": ZERO3,
              "fsdp2": FSDP2, "megatron": MEGATRON, "megatron-overlap": MEGATRON_OVERLAP,
              "torchtitan": TORCHTITAN, "torchtitan-async-tp": TORCHTITAN_ASYNC_TP}


def overlap(framework: str, term: str) -> Overlap:
    """The :class:`Overlap` of ``term`` under ``framework``."""
    return FRAMEWORKS[one_of(framework, tuple(FRAMEWORKS), "framework")][one_of(term, TERMS, "term")]


def window_seconds(window: str, windows: dict) -> float:
    """Seconds of ``window`` from ``windows`` ({name: seconds}); ``forward+backward`` is their sum
    when not given; ``none`` is 0."""
    one_of(window, WINDOWS, "window")
    if window == "none":
        return 0.0
    if window in windows:
        value = windows[window]
    elif window == "forward+backward" and "forward" in windows and "backward" in windows:
        value = windows["forward"] + windows["backward"]
    else:
        raise UsageError(f"window {window!r} not given; windows given: {', '.join(windows) or 'none'}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise UsageError(f"window {window!r} must be seconds >= 0, got {value!r}")
    return float(value)


def exposed(framework: str, term: str, seconds: float, windows: dict) -> float:
    """Seconds of ``term`` that ``framework`` leaves exposed: ``max(0, seconds - share x window)``,
    the window's compute seconds read from ``windows``; share 0: all of ``seconds``."""
    o = overlap(framework, term)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise UsageError(f"seconds must be >= 0, got {seconds!r}")
    if o.share == 0:
        return float(seconds)
    return max(0.0, seconds - o.share * window_seconds(o.window, windows))
