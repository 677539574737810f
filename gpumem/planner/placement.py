"""Where a layout's groups sit on the machine, and what their collectives cost there (torch-free).

The planner asks questions by GPU (``gpumem.memory.gpus``); seconds need a node
(:mod:`gpumem.timing.hardware`): how many GPUs share NVLink and which NICs carry the traffic.
:func:`node_for` takes the node type built around that GPU (:data:`NODE_OF_GPU`), with the
question's GPUs per node; ``inter_node`` (bytes/s, optional) replaces its network by one NIC per
GPU at that line rate, the planner's old "bytes/s per GPU between nodes".

Rank order (:func:`groups`): tensor-parallel ranks are adjacent, then context-parallel ranks,
then data-parallel ranks, pipeline stages outermost: global rank = tp_rank + tp x (cp_rank + cp x
(dp_rank + dp x pp_rank)). That is Megatron's default order (``--rank-order tp-cp-ep-dp-pp``:
tensor fastest, pipeline slowest); gradients are reduced over the data-and-context-parallel group
(dp x cp ranks, stride tp). Without cp it is Megatron-DeepSpeed's
``PipeModelDataParallelTopology`` (axes pipe, data, model), DeepSpeed's
``PipeDataParallelTopology`` (pipe, data) and AutoTP's (data, tensor) mesh. So a data-parallel
group is contiguous when tp = 1 (eight ranks per DGX node, the node's eight NICs carry its ring)
and strided when tp = 8 (one rank per node, one NIC per node). A group spread unevenly over
nodes (a GPU count that is not a multiple of a node) is priced with its fewest ranks on a node
(the fewest NICs: the slowest node binds).

Collectives are :func:`gpumem.timing.collectives.collective_time` (NCCL's fastest algorithm,
latency plus bandwidth), cached: :func:`seconds`; a transfer cut into ``calls`` equal buckets
pays the latency once per bucket.
"""

from dataclasses import replace
from functools import lru_cache

from ..errors import UsageError
from ..memory.gpus import GPU
from ..timing.collectives import collective_time
from ..timing.hardware import NODES, Cluster, Group, NodeType
from ..timing.zero_layouts import concurrent_time

# The node each bf16 GPU of the course's table is planned in (gpumem.timing.hardware.NODES);
# a100-40gb: DGX A100 320GB, the same chassis and network as the 640GB (DGX A100 datasheet).
NODE_OF_GPU = {"a100-40gb": "dgx-a100", "a100-80gb": "dgx-a100", "h100-80gb": "dgx-h100",
               "h200": "hgx-h200", "l4": "g2-l4x8", "t4": "colab-t4"}


@lru_cache(maxsize=64)
def node_for(gpu: GPU, gpus_per_node: int = 8, inter_node: float | None = None) -> NodeType:
    """The node type a plan on ``gpu`` is priced on: the GPU's node (:data:`NODE_OF_GPU`) with
    ``gpus_per_node`` GPUs (its NVLink domain no larger) and, when ``inter_node`` (bytes/s per
    direction) is given, one NIC per GPU at that line rate instead of the node's own network."""
    name = gpu.name
    if name not in NODE_OF_GPU:
        raise UsageError(f"no node type for GPU {name!r}; accepted: {', '.join(NODE_OF_GPU)}")
    base = NODES[NODE_OF_GPU[name]]
    node = replace(base, gpu_name=name, gpus_per_node=gpus_per_node,
                   nvlink_domain=min(base.nvlink_domain, gpus_per_node), nics=min(base.nics, gpus_per_node))
    if name != base.gpu_name:
        node = replace(node, name=f"{base.name}/{name}", label=f"{base.label} with {gpu.label}")
    if inter_node is not None:
        if not inter_node > 0:
            raise UsageError(f"inter_node must be a bandwidth > 0 bytes/s, got {inter_node!r}")
        node = replace(node, nics=gpus_per_node, nic_bw=float(inter_node),
                       label=f"{node.label}, {inter_node / 1e9:g} GB/s per GPU between nodes")
    return node


def per_gpu_network(node: NodeType) -> float:
    """Line rate between nodes per GPU, bytes/s per direction: the node's NICs over its GPUs."""
    return node.nics * node.nic_bw / node.gpus_per_node


def place(node: NodeType, gpus: int, size: int, stride: int) -> Group:
    """The group of ``size`` ranks ``0, stride, 2 stride, ...`` on ``gpus`` GPUs of ``node``
    (ranks node-major); uneven spreads take the fewest ranks any node holds (see the module)."""
    return Cluster(node, max(1, -(-gpus // node.gpus_per_node))).group(size, stride, uneven=True)


def groups(node: NodeType, tp: int, pp: int, dp: int, cp: int = 1) -> dict[str, Group]:
    """The tensor-, context-, data- and pipeline-parallel groups of rank 0 (see the module's rank
    order; ``dp`` is the gradient group of dp x cp ranks); ``pp`` is a pair of neighbouring
    stages: one rank on each of two nodes when the pipeline spans more than one node (the slowest
    boundary binds 1F1B's steady state), else two in one node."""
    gpus = tp * cp * pp * dp
    pair = Group(node, 1, 2) if gpus > node.gpus_per_node else Group(node, 2, 1)   # some boundary
    return {"tp": place(node, gpus, tp, 1), "cp": place(node, gpus, cp, tp),      # crosses nodes
            "dp": place(node, gpus, dp * cp, tp), "pp": pair if pp > 1 else place(node, gpus, 1, 1)}


def hybrid_groups(node: NodeType, tp: int, pp: int, dp: int, cp: int, group: int) -> dict[str, Group]:
    """Rank 0's groups under hybrid sharding (:mod:`.hybrid`): ``dp`` (all dp x cp ranks, as
    :func:`groups`), ``shard`` (``group`` consecutive ranks of it, stride tp: inside one node when
    group x tp <= GPUs per node) and ``replicate`` (the dp x cp / group ranks holding the same
    shard, stride tp x group: one a node when group x tp fills a node). FSDP2's 2-D mesh
    ``(dp / group, group)`` over ranks in this order, and MiCS's ``_generate_mics_config``
    (``arange(world).reshape(-1, shard_size)``), put them there."""
    gpus = tp * cp * pp * dp
    return {"dp": place(node, gpus, dp * cp, tp), "shard": place(node, gpus, group, tp),
            "replicate": place(node, gpus, dp * cp // group, tp * group)}


def shared_seconds(collective: str, nbytes: float, group: Group, calls: int = 1) -> float:
    """:func:`seconds` when every GPU of the group's nodes runs a group of this shape at once (the
    replicas of hybrid sharding: one group per local rank), so that their ranks on a node share
    its NICs: ``zero_layouts.concurrent_time`` where the node has fewer NICs than the groups
    assume for themselves (a one-port node), else :func:`seconds` itself (DGX: a NIC per GPU)."""
    node, r = group.node, group.ranks_per_node
    per_node = node.gpus_per_node // r if group.nodes > 1 else 1
    if group.size == 1 or nbytes <= 0 or per_node <= 1 or node.nics_for(per_node * r) >= per_node * node.nics_for(r):
        return seconds(collective, nbytes, group, calls)
    calls = max(1, int(calls))
    return calls * _shared(collective, float(nbytes) / calls, group, per_node)


@lru_cache(maxsize=1024)
def _shared(collective: str, nbytes: float, group: Group, per_node: int) -> float:
    return concurrent_time(collective, nbytes, group, per_node).seconds


@lru_cache(maxsize=8192)
def _one(collective: str, nbytes: float, group: Group) -> tuple[float, str]:
    t = collective_time(collective, nbytes, group)
    return t.seconds, t.binding


def seconds(collective: str, nbytes: float, group: Group, calls: int = 1) -> float:
    """Seconds of ``collective`` moving S = ``nbytes`` over ``group``, in ``calls`` equal buckets."""
    if group.size == 1 or nbytes <= 0:
        return 0.0
    calls = max(1, int(calls))
    return calls * _one(collective, float(nbytes) / calls, group)[0]


def binding(collective: str, nbytes: float, group: Group) -> str:
    """The link that binds ``collective`` over ``group`` (NVLink, PCIe, network, none)."""
    if group.size == 1:
        return "none"
    return _one(collective, float(nbytes), group)[1]
