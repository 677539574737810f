"""One candidate layout of the planner: what each field means and which framework runs it.

A :class:`Layout` is a precision recipe, a ZeRO stage (optionally hybrid-sharded), a checkpoint
policy, an attention kernel, an offload choice, a micro-batch, and the tensor, context, pipeline
and data-parallel degrees (with virtual pipeline stages). Its :attr:`Layout.framework` names the
framework the planner prices it under (DeepSpeed, Megatron-DeepSpeed, Megatron-Core, FSDP2), and
so which overlaps (``gpumem.timing.overlap``) and which configs (``planner.config``) apply.
"""

from dataclasses import dataclass

FRAMEWORK_3D = "megatron-deepspeed"
FRAMEWORK_MCORE = "megatron-core"
FRAMEWORK_FSDP2 = "fsdp2"


@dataclass(frozen=True)
class Layout:
    """One candidate: precision recipe, ZeRO stage, checkpoint policy, attention kernel, offload,
    micro-batch, and the tensor / pipeline / data parallel degrees."""
    recipe: str
    zero: int
    checkpoint: str
    attention: str
    offload: str
    device: str
    micro_batch: int
    tp: int
    pp: int
    dp: int
    n_micro: int          # micro-batches per step per data-parallel replica (gradient accumulation)
    cp: int = 1           # context parallelism: the sequence split over cp ranks (ring attention)
    vp: int = 1           # virtual pipeline stages per rank (interleaved 1F1B)
    hybrid: str = "none"  # hybrid sharding with ZeRO-3: "hsdp" (FSDP2 HSDP = DeepSpeed MiCS), "hpz" (ZeRO++)
    group: int = 0        # ranks of one shard group under ``hybrid`` (e.g. the dp ranks of a node); 0: none
    mcore: bool = False   # run a tensor- or pipeline-parallel layout under Megatron-Core (its overlaps)
    ep: int = 1           # expert parallelism (mixtures of experts): each rank holds n_experts / ep experts

    @property
    def framework(self) -> str:
        """``megatron-core`` for layouts with context parallelism or virtual stages (only
        Megatron-Core runs ring attention and the interleaved schedule) and for tensor- or pipeline-
        parallel layouts asked to run under it (``mcore``: its overlaps and distributed optimizer), ``fsdp2`` for hybrid-sharded ZeRO-3 (``hybrid="hsdp"``:
        FSDP2's HSDP, whose DeepSpeed twin is MiCS), ``megatron-deepspeed`` for tensor x pipeline layouts
        (DeepSpeed's AutoTP mesh is 2-D: data x tensor), else ``deepspeed`` (ZeRO, AutoTP, or
        DeepSpeed's pipeline engine)."""
        if self.cp > 1 or self.vp > 1 or self.mcore:
            return FRAMEWORK_MCORE
        if self.hybrid == "hsdp":
            return FRAMEWORK_FSDP2
        return FRAMEWORK_3D if self.tp > 1 and self.pp > 1 else "deepspeed"

    @property
    def state_recipe(self) -> str:
        """The recipe whose bytes the states follow: Megatron-Core trains ``--bf16`` with fp32 main
        gradients (``accumulate_allreduce_grads_in_fp32``, forced for bf16 in
        ``megatron/training/arguments.py``; the gradient buffer is not sharded by the distributed
        optimizer), which is ``mixed-ds``'s 2 + 4 + 12 bytes, and it reduces them in fp32."""
        return "mixed-ds" if self.framework == FRAMEWORK_MCORE and self.recipe == "mixed" else self.recipe

    @property
    def sequence_parallel(self) -> bool:
        """Whether the activations are planned with Megatron's sequence parallelism."""
        return self.framework in (FRAMEWORK_3D, FRAMEWORK_MCORE) and self.tp > 1

    @property
    def gpus(self) -> int:
        """GPUs the layout spans: tp x cp x pp x dp."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_shards(self) -> int:
        """Ranks ZeRO shards the experts' states over: the expert-data-parallel group, dp x cp / ep
        (DeepSpeed's ``expert_dp_process_group``, Megatron-Core's expert data parallelism)."""
        return self.shards // self.ep

    @property
    def shards(self) -> int:
        """Ranks ZeRO shards over: ``dp x cp`` (context-parallel ranks hold the same weights, so
        Megatron's distributed optimizer shards over the data-and-context-parallel group)."""
        return self.dp * self.cp

    def label(self) -> str:
        """A short name: ``mixed ZeRO-3 tp1 pp1 dp8 mb1 full flash``, with offload when used."""
        off = "" if self.offload == "none" else f" offload {self.offload}->{self.device}"
        extra = (f" cp{self.cp}" if self.cp > 1 else "") + (f" vp{self.vp}" if self.vp > 1 else "") \
            + (f" {self.hybrid}{self.group}" if self.hybrid != "none" else "") + (" mcore" if self.mcore else "") \
            + (f" ep{self.ep}" if self.ep > 1 else "")
        return (f"{self.recipe} ZeRO-{self.zero} tp{self.tp} pp{self.pp} dp{self.dp}{extra} mb{self.micro_batch}"
                f" ckpt {self.checkpoint} {self.attention}{off}")
