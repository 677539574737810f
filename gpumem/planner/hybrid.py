"""Hybrid sharding of ZeRO-3: shard inside a group of ranks, replicate across groups (torch-free).

Two layouts (``Layout.hybrid``), each with ``group`` ranks in one shard group (the dp ranks of a
node, typically), among the dp x cp = N data-parallel ranks:

* ``hsdp``: PyTorch FSDP2's hybrid sharding, ``fully_shard(mesh=2-D DeviceMesh)``: "parameters
  are sharded across the 1st dim and replicated across the 0th dim (HSDP) with (Replicate(),
  Shard(0))" (PyTorch 2.13 ``torch/distributed/fsdp/_fully_shard/_fully_shard.py``,
  ``fully_shard``, argument ``mesh``). Parameters, gradients and optimizer states are sharded over
  the group; the group's ranks gather parameters in forward and again in backward
  (``reshard_after_forward=True``) and reduce-scatter gradients; then each reduced shard is
  all-reduced across the N / group replicas (``_fsdp_collectives.py``, ``foreach_reduce``:
  ``dist.all_reduce(reduce_output, group=all_reduce_group)`` on ``all_reduce_stream``). By
  default that all-reduce runs every micro-batch; ``FSDPModule.set_requires_all_reduce(False)``
  (``_fully_shard.py``) keeps the reduce-scattered shard in ``partial_reduce_output`` and
  all-reduces once, at the last micro-batch: the plans emit that (``config.fsdp_equivalent``).
  DeepSpeed's twin was MiCS (``runtime/zero/mics.py``, ``MiCS_Optimizer.allreduce_mics_shard_grads``:
  the shard group's gradients all-reduced over ``param_repli_group`` only at the accumulation
  boundary; groups from ``mics_utils._generate_mics_config``: contiguous world ranks
  ``np.arange(world).reshape(-1, shard_size)``; read in the 0.16.x source), removed by
  DeepSpeed 0.19.8, which refuses ``mics_shard_size`` (``runtime/config.py``, ``_REMOVED_ZERO_CONFIG_KEYS``:
  DeepSpeedConfigError "MiCS ZeRO-3 sharding has been removed", issue 8489).
* ``hpz``: DeepSpeed ZeRO++'s hierarchical partitioning (``zero_hpz_partition_size``). Optimizer
  states, gradients and the primary 16-bit parameter partition stay sharded over all N ranks;
  when a parameter is released after forward, ``Init._partition_param_sec``
  (``runtime/zero/partition_parameters.py``) also keeps a secondary 16-bit copy partitioned over
  the group (``secondary_partition_size = tensor_size // num_ranks_in_param_group``, allocated on
  ``remote_device``: the GPU unless parameters are offloaded). ``_all_gather_coalesced`` gathers
  from the secondary copy over ``zero_param_process_group`` when one exists: the forward
  all-gather spans all N ranks, the backward one only the group. ``stage3.py``
  ``_post_step`` -> ``invalidate_secondary_tensor`` drops it after the step, so it is held from
  the end of forward through backward: counted whole. The group is contiguous world ranks
  (``utils/groups.py``, ``_create_zero_param_parallel_group``).

ZeRO++'s other two switches, ``zero_quantized_weights`` (int8 parameter all-gathers) and
``zero_quantized_gradients`` (all-to-all int4 gradient reduction), are not modelled: every
collective here moves the recipe's 16-bit (or fp32) elements.

Which combinations run (:func:`allowed_hybrid`) is stated with its source there.
"""

from __future__ import annotations

from dataclasses import dataclass
from ..memory import accounting
from ..timing import overlap
from . import placement

HYBRIDS = ("none", "hsdp", "hpz")
FRAMEWORK = {"hsdp": "fsdp2", "hpz": "deepspeed-zero3"}   # the overlap table each runs under


def allowed_hybrid(lay) -> str | None:
    """None when ``lay``'s hybrid sharding runs, else the reason in one clause. The rules:

    * ZeRO-3 only: hpZ is an argument of ``DeepSpeedZeroOptimizer_Stage3`` (``stage3.py``;
      ``stage_1_and_2.py`` has none, so at ZeRO 1-2 the key is accepted and does nothing); MiCS
      subclassed the stage-3 optimizer (``MiCS_Optimizer``); HSDP is planned with
      ``reshard_after_forward=True``, FSDP2's ZeRO-3;
    * no pipeline, context parallelism or virtual stages: ZeRO-3 is refused with pipeline
      parallelism (``runtime/pipe/engine.py``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
      parallelism"), and cp / vp layouts are Megatron-Core's (ZeRO 0-1);
    * ``1 < group < N`` and ``group`` divides N = dp x cp (``_generate_mics_config``: "dp group
      size is not dividable by dp_shard_size"; ``groups._ensure_divisibility`` for hpZ; FSDP2's
      mesh is (N / group, group)); group = N is plain ZeRO-3;
    * hsdp runs on FSDP2, which has no ``mixed-ds`` recipe (``config.fsdp_equivalent``);
    * no offload with hsdp: MiCS raised "Local sharding has no support for CPU offloading"
      (``allreduce_mics_shard_grads``); FSDP2's ``CPUOffloadPolicy`` does run with HSDP, but the
      planner's offload seconds are DeepSpeed's copies (``offload_time``), so it is not planned;
    * hpZ without parameter offload: the secondary copy would be allocated on the offload device
      (``_partition_param_sec``, ``device=self.remote_device``) and every backward gather would
      read it from the host, which the planner does not price (optimizer offload is fine: the
      secondary copy stays on the GPU);
    * hpZ with tp = 1 only: its groups are contiguous *world* ranks
      (``_create_zero_param_parallel_group``), which with AutoTP's (data, tensor) mesh would mix
      tensor-parallel ranks holding different slices. HSDP takes a DeviceMesh and composes with
      tensor parallelism (mesh (replicate, shard, tp)).
    """
    h, g = lay.hybrid, lay.group
    if h not in HYBRIDS:
        return f"hybrid={h!r}: accepted: {', '.join(HYBRIDS)}"
    if h == "none":
        return None if g == 0 else f"group={g} without hybrid sharding: accepted: hybrid=hsdp|hpz with a group"
    n = lay.shards
    if lay.zero != 3:
        return f"hybrid={h} at zero={lay.zero}: hybrid sharding is ZeRO-3's; accepted: zero=3"
    if lay.pp > 1 or lay.cp > 1 or lay.vp > 1:
        return f"hybrid={h} with pp/cp/vp above 1: ZeRO-3 runs without pipeline or context parallelism"
    if not 1 < g < n or n % g:
        return (f"hybrid={h} group={g}: the group must divide dp x cp = {n} and lie strictly between 1 and "
                f"{n}; accepted: " + (", ".join(str(d) for d in range(2, n) if n % d == 0) or "none for this dp"))
    if h == "hsdp" and lay.recipe == "mixed-ds":
        return "hybrid=hsdp with recipe=mixed-ds: FSDP2 has no DeepSpeed fp32 gradient accumulation; accepted: mixed"
    if h == "hsdp" and lay.offload != "none":
        return f"hybrid=hsdp with offload={lay.offload}: MiCS/HSDP is planned without offload; accepted: offload=none"
    if h == "hpz" and lay.offload == "optimizer+params":
        return ("hybrid=hpz with offload=optimizer+params: the secondary copy would live on the host; "
                "accepted: offload=none or optimizer")
    if h == "hpz" and lay.tp > 1:
        return f"hybrid=hpz with tp={lay.tp}: hpZ's groups are contiguous world ranks; accepted: tp=1"
    return None


def state_shards(lay) -> int:
    """Ranks the model states are sharded over: ``group`` for hsdp, all dp x cp ranks otherwise
    (hpZ shards optimizer states, gradients and the primary parameters over all of them)."""
    return lay.group if lay.hybrid == "hsdp" else lay.shards


def secondary_bytes(n_params: int, lay) -> int:
    """hpZ's secondary 16-bit parameter partition on one GPU: p16 x ceil(n / group) bytes (the
    parameters' dtype, ``_partition_param_sec``); 0 for the other layouts."""
    if lay.hybrid != "hpz":
        return 0
    return accounting.RECIPE[lay.recipe].params * accounting.shard(n_params, lay.group)


def model_states(n_params: int, lay) -> accounting.States:
    """``accounting.model_states`` of ``n_params`` local parameters over :func:`state_shards`,
    with hpZ's :func:`secondary_bytes` added to the GPU's parameters."""
    s = accounting.model_states(n_params, lay.state_recipe, state_shards(lay), lay.zero, lay.offload, lay.device)
    s.params += secondary_bytes(n_params, lay)
    return s


def reduce_bytes(lay) -> int:
    """Bytes per gradient element in the reductions: hsdp runs FSDP2 with the emitted
    ``MixedPrecisionPolicy(reduce_dtype=torch.float32)`` for the mixed recipes (4; bf16 for
    pure-bf16: 2); hpZ reduces DeepSpeed's 16-bit gradients (the recipe's gradient bytes)."""
    if lay.hybrid == "hsdp":
        return 2 if lay.recipe == "pure-bf16" else 4
    return accounting.RECIPE[lay.recipe].grads


@dataclass(frozen=True)
class Traffic:
    """One collective of a step: ``nbytes`` (S, the whole tensor) over the ``group`` named
    (``dp``: all N ranks; ``shard``: the group; ``replicate``: the N / group ranks holding the
    same shard), in ``calls`` equal pieces, ``per_step`` times a step; ``term`` is its
    :mod:`gpumem.timing.overlap` term and ``window`` the compute that can hide it."""
    name: str
    collective: str
    group: str
    nbytes: int
    calls: int
    per_step: int
    term: str
    window: str


def traffic(lay, psi: int, layers: int, gathers: int, buckets: int) -> list[Traffic]:
    """The data-parallel collectives of one step of a hybrid layout, ``psi`` local parameters.

    hsdp (FSDP2, one unit per layer plus the root: ``layers + 1`` calls each): per micro-batch
    the forward and the backward all-gather and the gradient reduce-scatter inside the group,
    hidden together behind the step's compute (``zero3_gather``, as ZeRO-3's are); once per step
    the all-reduce of the 1/group shard across the replicas, during the last micro-batch's
    backward (``dp_grad_reduce``). hpz (DeepSpeed's buckets: ``gathers`` prefetch buckets,
    ``buckets`` reduce buckets): per micro-batch the forward all-gather over all N ranks, the
    backward one from the secondary copy inside the group, the reduce-scatter over all N."""
    r = accounting.RECIPE[lay.recipe]
    params, m = psi * r.params, lay.n_micro
    if lay.hybrid == "hsdp":
        units, red, z3 = layers + 1, reduce_bytes(lay), ("zero3_gather", "step")
        return [Traffic("forward all-gather", "all_gather", "shard", params, units, m, *z3),
                Traffic("backward all-gather", "all_gather", "shard", params, units, m, *z3),
                Traffic("gradient reduce-scatter", "reduce_scatter", "shard", psi * red, units, m, *z3),
                Traffic("replica all-reduce", "all_reduce", "replicate", red * accounting.shard(psi, lay.group),
                        units, 1, "dp_grad_reduce", "last_backward")]
    z3 = ("zero3_gather", "step")
    return [Traffic("forward all-gather", "all_gather", "dp", params, gathers, m, *z3),
            Traffic("backward all-gather (secondary)", "all_gather", "shard", params, gathers, m, *z3),
            Traffic("gradient reduce-scatter", "reduce_scatter", "dp", psi * r.grads, buckets, m, *z3)]


def data_parallel(lay, node, psi: int, layers: int, gathers: int, buckets: int, busy: float,
                  mb_compute: float) -> tuple[float, float, dict]:
    """(exposed seconds, seconds moved, seconds by collective) of a hybrid layout's data-parallel
    traffic: each :func:`traffic` row priced by ``placement.shared_seconds`` over its group as
    ``placement.hybrid_groups`` places it (the replicas' groups share a node's NICs); the rows of one term summed and hidden by
    :data:`FRAMEWORK`'s overlap table (``step``: all the step's compute, ``busy``;
    ``last_backward``: the last micro-batch's backward, 2/3 of ``mb_compute``). The shard group's
    collectives and the replicas' all-reduce run on different streams over different links
    (NVLink inside a node, the NICs between nodes), so their exposures add."""
    grp = placement.hybrid_groups(node, lay.tp, lay.pp, lay.dp, lay.cp, lay.group)
    by_row, by_term = {}, {}
    for t in traffic(lay, psi, layers, gathers, buckets):
        s = t.per_step * placement.shared_seconds(t.collective, t.nbytes, grp[t.group], t.calls)
        by_row[t.name] = s
        key = (t.term, t.window)
        by_term[key] = by_term.get(key, 0.0) + s
    fw, exposed = FRAMEWORK[lay.hybrid], 0.0
    for (term, window), s in by_term.items():
        # the table names the window; the seconds that window offers here are the step's compute
        # (forward+backward) or the last micro-batch's backward (the once-per-step all-reduce)
        w = busy if window == "step" else mb_compute * 2 / 3
        exposed += overlap.exposed(fw, term, s, {"forward": w / 3, "backward": w * 2 / 3} if window == "step"
                                   else {"backward": w, "forward": 0.0, "last_backward": w})
    return exposed, sum(by_row.values()), by_row
