"""A planned layout written as the switches people set: a DeepSpeed config (0.19.8 keys) and,
where one exists, the PyTorch FSDP2 equivalent (torch-free: plain dicts).

DeepSpeed. ``zero_optimization.stage`` with its buckets and stage-3 thresholds as the planner
counted them (``planner.memory``); ``bf16`` for the bf16 recipes (pure bf16 is
``bf16_master_weights_and_grads`` + ``bf16_optimizer_states``, which DeepSpeed accepts at ZeRO
1-3 only); ``offload_optimizer`` / ``offload_param`` (on NVMe with ``buffer_size`` raised to the largest
parameter partition: DeepSpeed's 1e8 default is smaller than Llama-3-70B's embedding partition
over 8 ranks, 131,334,144 elements); ``tensor_parallel.autotp_size`` (AutoTP). The batch is
given as ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` without
``train_batch_size``: without an ``mpu``, ``DeepSpeedConfig`` counts every rank (the AutoTP ranks
too) in ``train_batch_size = micro x accumulation x world``, so DeepSpeed derives it. Pipeline
stages are not config keys the engine reads: they are ``deepspeed.pipe.PipelineModule``'s
arguments (``num_stages``, ``partition_method``, ``activation_checkpoint_interval``), given under
``model_code`` with the checkpointing and attention the model's code must do.

Megatron-DeepSpeed (tensor x pipeline layouts, ``Layout.framework``): the same DeepSpeed config
(ZeRO-0/1, no ``tensor_parallel`` key: Megatron splits the model itself) passed with
``--deepspeed --deepspeed_config``, and :func:`megatron_args`: ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size``, ``--sequence-parallel``, ``--micro-batch-size``,
``--global-batch-size``, ``--zero-stage`` and the recompute flags (``full``: uniform chunks of 1
layer; ``every-2``: of 2; ``every-other``: ``block`` over half a stage's layers, the same count;
``selective``: ``--recompute-granularity selective``).

Hybrid sharding (``Layout.hybrid``, :mod:`.hybrid`). hpZ is ZeRO-3 with
``"zero_hpz_partition_size": group``; its FSDP2 twin is ``reshard_after_forward=group`` (an int:
"the world size to reshard to after forward", ``_fully_shard.py``), whose backward all-gather runs
over the group. HSDP is FSDP2's own: a 2-D mesh of shape (dp / group, group) and
``reshard_after_forward=True``, with ``set_requires_all_reduce`` on only for the last micro-batch
(the replicas' all-reduce once a step, as :mod:`.hybrid` prices it). Its DeepSpeed twin, MiCS
(``mics_shard_size``), is refused by DeepSpeed 0.19.8 (``runtime/config.py``
``_REMOVED_ZERO_CONFIG_KEYS``), so an HSDP plan has no DeepSpeed config: :func:`deepspeed_config`
returns None.

FSDP2 (``torch.distributed.fsdp.fully_shard``). ZeRO-3 is ``reshard_after_forward=True`` and
ZeRO-2 ``reshard_after_forward=False`` (parameters stay gathered between forward and backward;
gradients and optimizer states are sharded); ZeRO-0 is DDP. FSDP has no optimizer-only sharding
(ZeRO-1), no optimizer-only offload (its ``CPUOffloadPolicy`` moves parameters, gradients and the
optimizer step together) and no NVMe offload: those plans have no FSDP equivalent (None).
"""

from ..memory.models import ModelConfig
from ..memory.zero3_schedule import DEFAULTS as DS_STAGE3_DEFAULTS
from .stage_split import stage_layers
from .memory import FRAMEWORK_MCORE, DS_BUCKET, DS_PREFETCH, Layout, layers_per_stage, local_params, persistence_threshold
from . import moe
from .swap_buffers import OPT_BUFFERS, PARAM_BUFFERS, SUB_GROUP, offload_buffers

ADAMW = {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
NVME_PATH = "/local_nvme"
CHECKPOINT_CODE = {
    "none": "no activation checkpointing",
    "full": "torch.utils.checkpoint(layer, x, use_reentrant=False) around every layer",
    "every-2": "torch.utils.checkpoint around segments of 2 consecutive layers",
    "every-other": "torch.utils.checkpoint around layers 0, 2, 4, ... (torchtitan selective_ac_option='2')",
    "selective": "re-run only attention's core (Megatron --recompute-granularity selective)",
}
ATTENTION_CODE = {"flash": "F.scaled_dot_product_attention (flash backend) or flash_attn",
                  "naive": "softmax(QK^T/sqrt(d)) V written out (scores materialised)",
                  "eager": "Hugging Face attn_implementation='eager'"}


# stage3_max_live_parameters and stage3_max_reuse_distance: the values the counted working set
# replays (see stage3_keys); DeepSpeed's own defaults (runtime/zero/config.py), 1e9 elements each.
DS_MAX_LIVE = int(DS_STAGE3_DEFAULTS["stage3_max_live_parameters"])
DS_MAX_REUSE = int(DS_STAGE3_DEFAULTS["stage3_max_reuse_distance"])


def stage3_keys(cfg: ModelConfig) -> dict:
    """The ``stage3_*`` keys every ZeRO-3 config carries: the values the planner's working set
    (``accounting.zero3_gathered``) replays, so that DeepSpeed holds what is counted.

    What each bounds in DeepSpeed 0.19.8 (``runtime/zero/partitioned_param_coordinator.py``,
    ``PartitionedParameterCoordinator.fetch_sub_module``): before a module runs its own
    parameters are gathered unconditionally; then the prefetcher walks the recorded order and
    gathers whole parameters while fewer than ``min(max_live_parameters - n_available,
    prefetch_bucket_size)`` elements are queued, so ``stage3_max_live_parameters`` caps only what
    prefetching adds (and the last parameter may overshoot it); parameters used again within
    ``stage3_max_reuse_distance`` elements of the order are not released (``__params_to_release``).
    No value of max_live alone therefore bounds the working set: the rules together do, and
    ``zero3_schedule.simulate`` applies them with these same values (``zero3_schedule.DEFAULTS``
    for max_live and reuse, ``memory.DS_PREFETCH``, and the persistence threshold, which keeps the
    norm weights whole both ways). On Llama-3-70B at tp 8 the counted peak is the max_live cap
    reached: in forward at ``layers.70.mlp.down``, that projection's slice, layers 71-79 and the
    output head are whole, 1,123,287,040 elements, the head's 131,334,144 being the parameter
    that crosses 1e9. A lower max_live would prefetch less and hold less than the replay counts;
    the replay would then over-count, never under-count."""
    return {"stage3_prefetch_bucket_size": DS_PREFETCH,
            "stage3_param_persistence_threshold": persistence_threshold(cfg),
            "stage3_max_live_parameters": DS_MAX_LIVE, "stage3_max_reuse_distance": DS_MAX_REUSE}


def deepspeed_config(cfg: ModelConfig, lay: Layout) -> dict | None:
    """The DeepSpeed config of ``lay`` (a JSON-ready dict); None for an HSDP layout (FSDP2's:
    DeepSpeed 0.19.8 removed MiCS, see the module) and for a Megatron-Core layout (Megatron-Core
    runs without DeepSpeed: its distributed optimizer is its ZeRO-1, :func:`megatron_args`)."""
    if lay.hybrid == "hsdp" or lay.framework == FRAMEWORK_MCORE:
        return None
    zero: dict = {"stage": lay.zero}
    bucket = min(DS_BUCKET, local_params(cfg, lay.tp, lay.pp)["params"])   # DeepSpeed allocates it whole
    if lay.zero >= 1:
        zero |= {"overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": bucket}
    if lay.zero in (1, 2):
        zero["allgather_bucket_size"] = bucket
    if lay.zero == 3:
        zero |= stage3_keys(cfg)
    if lay.hybrid == "hpz":   # ZeRO++'s hierarchical partitioning (stage3.py, zero_hpz_partition_size)
        zero["zero_hpz_partition_size"] = lay.group
    if lay.offload != "none":
        target = {"device": lay.device, "pin_memory": True}
        if lay.device == "nvme":
            target["nvme_path"] = NVME_PATH
        zero["offload_optimizer"] = dict(target)
        if lay.offload == "optimizer+params":
            zero["offload_param"] = dict(target)
        if lay.device == "nvme":
            zero["sub_group_size"] = SUB_GROUP
            zero["offload_optimizer"]["buffer_count"] = OPT_BUFFERS
            if lay.offload == "optimizer+params":
                zero["offload_param"] |= {"buffer_count": PARAM_BUFFERS,
                                          "buffer_size": offload_buffers(cfg, lay)["param_buffer_size"]}
    out = {"train_micro_batch_size_per_gpu": lay.micro_batch,
           "gradient_accumulation_steps": lay.n_micro, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": dict(ADAMW)},
           "zero_optimization": zero, "steps_per_print": 100}
    if lay.recipe in ("mixed", "mixed-ds"):
        out["bf16"] = {"enabled": True}
    if lay.recipe == "mixed-ds":
        out["data_types"] = {"grad_accum_dtype": "fp32"}
    if lay.recipe == "pure-bf16":
        out["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    if lay.tp > 1 and lay.framework == "deepspeed":
        out["tensor_parallel"] = {"autotp_size": lay.tp}
    return out | moe.deepspeed_keys(cfg, lay)   # AutoEP's section when ep > 1


def recompute_flags(policy: str, layers: int) -> list[str]:
    """Megatron's recompute arguments for a checkpoint policy on a stage of ``layers`` layers."""
    if policy == "none":
        return []
    if policy == "selective":
        return ["--recompute-granularity", "selective"]
    method, n = {"full": ("uniform", 1), "every-2": ("uniform", 2),
                 "every-other": ("block", -(-layers // 2))}[policy]
    return ["--recompute-granularity", "full", "--recompute-method", method, "--recompute-num-layers", str(n)]


def megatron_args(cfg: ModelConfig, lay: Layout) -> list[str] | None:
    """Megatron-DeepSpeed's command-line arguments of a 3-D layout, Megatron-Core's for a Megatron-Core
    layout (None for DeepSpeed and FSDP2 layouts): the parallelism, batch, recompute, precision and
    overlap arguments; the model's shape and the data arguments are the learner's to add."""
    if lay.framework in ("deepspeed", "fsdp2"):
        return None
    args = ["--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp),
            "--sequence-parallel", "--micro-batch-size", str(lay.micro_batch),
            "--global-batch-size", str(lay.micro_batch * lay.n_micro * lay.dp)]
    args += recompute_flags(lay.checkpoint, layers_per_stage(cfg, lay.pp))
    if lay.framework == "megatron-core":   # Megatron-Core's own arguments (pretrain_gpt.py), no DeepSpeed
        if lay.tp == 1:
            args.remove("--sequence-parallel")
        args += ["--context-parallel-size", str(lay.cp)]
        split = stage_layers(cfg, lay.pp)
        if len(set(split)) > 1:   # an uneven split: the end stages' layers (Megatron-Core's own flags)
            args += ["--decoder-first-pipeline-num-layers", str(split[0]),
                     "--decoder-last-pipeline-num-layers", str(split[-1])]
        if lay.vp > 1:
            args += ["--num-layers-per-virtual-pipeline-stage", str(cfg.n_layers // (lay.pp * lay.vp))]
        overlap = ["--overlap-grad-reduce"] + (["--overlap-param-gather"] if lay.zero == 1 else []) \
            + (["--tp-comm-overlap"] if lay.tp > 1 else [])   # what the cost model hides (timing.overlap)
        return args + ["--bf16", "--use-flash-attn"] + (["--use-distributed-optimizer"] if lay.zero == 1 else []) \
            + overlap
    if lay.attention == "flash":
        args.append("--use-flash-attn-v2")
    return args + ["--bf16", "--deepspeed", "--deepspeed_config", "ds_config.json", "--zero-stage", str(lay.zero)]


PIPE_INTERVAL = {"full": 1, "every-2": 2}   # PipelineModule re-runs every N layers; others: 0


def fsdp_equivalent(lay: Layout) -> dict | None:
    """The FSDP2 settings that hold the same states, or None where FSDP has no equivalent."""
    if lay.zero == 1 or lay.device == "nvme" or lay.offload == "optimizer" or lay.recipe == "mixed-ds":
        return None
    out: dict = {"api": "torch.distributed.fsdp.fully_shard on the embedding, on each layer, on the final "
                        "norm with the output head, then on the model (so the root holds no large weight)"}
    if lay.zero == 0:
        out = {"api": "torch.nn.parallel.DistributedDataParallel (no sharding)"}
    else:
        out["reshard_after_forward"] = lay.zero == 3
    out |= _fsdp_hybrid(lay)
    if lay.recipe in ("mixed", "pure-bf16"):
        out["mp_policy"] = ("MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"
                            if lay.recipe == "mixed" else "bf16 parameters and an AdamW with bf16 states "
                            "(e.g. torchao AnyPrecisionAdamW); no fp32 master copy")
    if lay.offload == "optimizer+params":
        out["offload_policy"] = "CPUOffloadPolicy(pin_memory=True)"
    if lay.tp > 1:
        out["tensor_parallel"] = (f"parallelize_module(..., tp_mesh of size {lay.tp}), "
                                  + ("with SequenceParallel" if lay.sequence_parallel else "no SequenceParallel (as planned)"))
    if lay.pp > 1:
        out["pipeline"] = f"torch.distributed.pipelining, {lay.pp} stages, Schedule1F1B"
    out["checkpoint"] = CHECKPOINT_CODE[lay.checkpoint]
    return out | moe.fsdp_keys(lay)


def _fsdp_hybrid(lay: Layout) -> dict:
    """FSDP2's switches for hybrid sharding: HSDP's 2-D mesh (replicate, shard) and the once-a-step
    all-reduce; hpZ's reshard to ``group`` ranks after forward (see the module)."""
    if lay.hybrid == "hsdp":
        dims = (lay.shards // lay.group, lay.group) + ((lay.tp,) if lay.tp > 1 else ())
        names = ("replicate", "shard") + (("tp",) if lay.tp > 1 else ())
        return {"mesh": f"init_device_mesh('cuda', {dims}, mesh_dim_names={names})"
                        + ("; fully_shard(..., mesh=mesh['replicate', 'shard'])" if lay.tp > 1 else ""),
                "mesh_shape": list(dims[:2]), "reshard_after_forward": True,
                "gradient_accumulation": "model.set_requires_all_reduce(micro_batch == last) before each "
                                         "backward: the replicas all-reduce once a step"}
    if lay.hybrid == "hpz":
        return {"mesh": f"init_device_mesh('cuda', ({lay.shards},))", "reshard_after_forward": lay.group}
    return {}


def model_code(lay: Layout) -> dict:
    """What the model's own code must do for ``lay``: its checkpointing and attention kernel."""
    out = {"checkpoint": CHECKPOINT_CODE[lay.checkpoint], "attention": ATTENTION_CODE[lay.attention]}
    if lay.framework == FRAMEWORK_MCORE:
        out["model"] = "Megatron-Core's GPTModel built by pretrain_gpt.py (its layers are the model code)"
    elif lay.pp > 1 and lay.framework != "deepspeed":
        out["pipeline"] = f"Megatron-DeepSpeed's GPTModelPipe, {lay.pp} stages (--pipeline-model-parallel-size)"
    elif lay.pp > 1:
        out["pipeline"] = (f"deepspeed.pipe.PipelineModule(layers, num_stages={lay.pp}, partition_method='parameters', "
                           f"activation_checkpoint_interval={PIPE_INTERVAL.get(lay.checkpoint, 0)})")
    return out
