"""What the planner is asked: a model on a cluster, a sequence and a batch, and the levers it may pull.

``plan()`` used to take 22 keyword arguments. They are grouped here in three frozen objects, so
that a question can be built once, printed, changed in one place (``dataclasses.replace``) and
passed around; ``plan(model, gpus, **keywords)`` still works and builds the same objects
(:meth:`Question.of`), with the keywords' names and meaning unchanged.

* :class:`Cluster`: the GPU (table name, capacity override), GPUs per node, the network between
  nodes, host memory and NVMe per node, the offload links and the CPU-Adam rate;
* :class:`Levers`: what the search may vary (recipe, ZeRO stage, offload, checkpoint policy,
  attention kernel, micro-batch, tensor / context / pipeline degrees, virtual stages, hybrid
  sharding, expert parallelism for a mixture of experts);
* :class:`Question`: model, GPU count, sequence, global batch, the memory reserve, the compute
  efficiency, and the two objects above.

Pure bf16 is a lever the planner pulls only when asked (``recipes=("pure-bf16",)`` or both):
its states are smaller, but an update below half a bf16 ULP of its weight is lost
(:mod:`gpumem.memory.bf16_rounding` gives the share), which a ranking by seconds cannot see.
"""

from dataclasses import dataclass, fields

from ..memory import gpus as gpu_table
from ..memory.policies import KERNELS, POLICIES
from ..timing import compute
from ..timing.offload_time import Links

TB = 10**12
HOST_PER_NODE = 2 * TB      # DGX H100: 2 TB of system memory per 8 GPUs (NVIDIA DGX H100 datasheet)
NVME_PER_NODE = 30 * TB     # DGX H100: 8 x 3.84 TB U.2 NVMe data drives (NVIDIA DGX H100 datasheet)
GPUS_PER_NODE = 8
RECIPES = ("mixed",)                      # planned unless asked otherwise
PLANNABLE_RECIPES = ("mixed", "pure-bf16")
OFFLOAD_CHOICES = (("none", "cpu"), ("optimizer", "cpu"), ("optimizer", "nvme"),
                   ("optimizer+params", "cpu"), ("optimizer+params", "nvme"))
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
CP_DEGREES = (1, 2, 4, 8)                 # context parallelism (Megatron-Core's ring attention)
VP_DEGREES = tuple(range(1, 9))           # model chunks per pipeline rank (interleaved 1F1B; NeMo's 405B: 7)
HYBRIDS = ("none", "hsdp", "hpz")         # ZeRO-3 over all data-parallel ranks, or sharded in a group
DEFAULT_TOKENS = 4 * 2**20   # Llama 3's first-stage batch: 4M tokens (1,024 x 4,096; arXiv:2407.21783)


@dataclass(frozen=True)
class Cluster:
    """The hardware: GPU type and count per node, networks, host memory, drives, CPU Adam.

    ``gpu``: a name of :mod:`gpumem.memory.gpus` (speeds and capacity); ``gpu_mem``: bytes per
    GPU instead of the table's; ``inter_node``: a line rate in bytes/s per GPU between nodes
    instead of the node type's NICs; ``links``: offload links (default: ``datasheet_links``);
    ``cpu_adam_rate``: parameters/s one node's CPU Adam updates, shared by the ranks on the node
    (default: the published achieved rate of ``gpumem.timing.offload_time``)."""
    gpu: str = "h100-80gb"
    gpu_mem: int | None = None
    gpus_per_node: int = GPUS_PER_NODE
    inter_node: float | None = None
    host_per_node: int | None = None
    nvme_per_node: int | None = None
    links: Links | None = None
    cpu_adam_rate: float | None = None


@dataclass(frozen=True)
class Levers:
    """What the search may vary; ``None`` for ``tp``/``pp`` means every degree that places."""
    recipes: tuple = RECIPES
    zero: tuple = (0, 1, 2, 3)
    offloads: tuple = OFFLOAD_CHOICES
    checkpoints: tuple = POLICIES
    attentions: tuple = KERNELS
    micro_batches: tuple = MICRO_BATCHES
    tp: tuple | None = None
    pp: tuple | None = None
    cp: tuple = CP_DEGREES
    vp: tuple = VP_DEGREES
    hybrid: tuple = HYBRIDS
    ep: tuple | None = None   # expert-parallel degrees (mixtures of experts; planner.moe), None: every one


@dataclass(frozen=True)
class Question:
    """One question to the planner (see the module); ``global_batch`` None: 4M tokens' worth."""
    model: object              # a registry name or a ModelConfig
    gpus: int
    seq: int = 4096
    global_batch: int | None = None
    cluster: Cluster = Cluster()
    levers: Levers = Levers()
    reserve: gpu_table.Reserve = gpu_table.DEFAULT_RESERVE
    mfu: float = compute.KERNEL_SHARE
    advise: bool = True

    @classmethod
    def of(cls, model, gpus: int, gpu: str = "h100-80gb", **keywords) -> "Question":
        """The question ``plan(model, gpus, gpu, **keywords)`` asks, with ``plan``'s keyword names:
        each keyword goes to the object that has a field of its name; an unknown one is a TypeError."""
        groups = {"cluster": {"gpu": gpu}, "levers": {}, "own": {}}
        names = {"cluster": {f.name for f in fields(Cluster)}, "levers": {f.name for f in fields(Levers)},
                 "own": {f.name for f in fields(cls)} - {"model", "gpus", "cluster", "levers"}}
        for key, value in keywords.items():
            where = next((g for g, n in names.items() if key in n), None)
            if where is None:
                raise TypeError(f"plan() got an unexpected keyword argument {key!r}")
            groups[where][key] = tuple(value) if where == "levers" and value is not None else value
        return cls(model, gpus, cluster=Cluster(**groups["cluster"]), levers=Levers(**groups["levers"]),
                   **groups["own"])

    def options(self) -> dict:
        """The search's options as one dict (what ``candidates`` and ``advice`` read)."""
        c, v = self.cluster, self.levers
        return {"host_per_node": c.host_per_node or HOST_PER_NODE, "nvme_per_node": c.nvme_per_node or NVME_PER_NODE,
                "recipes": tuple(v.recipes), "zero": tuple(v.zero), "offloads": tuple(v.offloads),
                "checkpoints": tuple(v.checkpoints), "attentions": tuple(v.attentions),
                "micro_batches": tuple(sorted(v.micro_batches)), "tp": v.tp, "pp": v.pp,
                "cp": tuple(sorted(v.cp)), "vp": tuple(sorted(v.vp)), "hybrid": tuple(v.hybrid), "ep": v.ep,
                "gpus_per_node": c.gpus_per_node}
