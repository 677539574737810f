"""The machines seconds are computed for: node types, clusters and where a group's ranks sit.

Per-GPU figures (capacity, dense bf16/fp16 peak, HBM, NVLink and PCIe per direction) live in
:mod:`gpumem.memory.gpus` and are read from there, never repeated. This module adds what a node
contributes: how many GPUs share an NVLink domain, the NICs that carry GPU traffic and their
speed, host DRAM bandwidth and the local NVMe drives. Every figure has its source beside it in
``NodeType.sources``; a figure no document gives is marked ``assumption`` with its effect.

Units: bytes and bytes/s, per direction (a "400 Gb/s" port moves 50 GB/s each way). Host DRAM
bandwidth = sockets x channels x transfer rate x 8 bytes, from the CPU's datasheet (the peak the
memory controllers allow, not a STREAM measurement).

Placement. A :class:`Cluster` is ``nodes`` nodes of one :class:`NodeType`; global ranks are
numbered node-major (rank ``i`` is GPU ``i % gpus_per_node`` of node ``i // gpus_per_node``), the
order ``torchrun`` and Megatron use. A :class:`Group` is ``ranks_per_node`` ranks on each of
``nodes`` nodes: ``Cluster.group(8)`` is one full DGX node; ``Cluster.group(8, stride=8)`` is a
data-parallel group of one rank per node.
"""

from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import UsageError, one_of
from ..memory.gpus import GPU, REGISTRY
from ..units import GB

Gbps = GB / 8          # 1 Gb/s in bytes/s (10^9 bits / 8)


def ddr(sockets: int, channels: int, mts: int) -> float:
    """Peak host DRAM bandwidth in bytes/s: sockets x channels x MT/s x 8 bytes per transfer."""
    return sockets * channels * mts * 1e6 * 8


@dataclass(frozen=True)
class NodeType:
    """One kind of node: its GPUs (a :data:`gpumem.memory.gpus.REGISTRY` key) and its links."""
    name: str
    label: str
    gpu_name: str                  # key into gpumem.memory.gpus.REGISTRY
    gpus_per_node: int
    nvlink_domain: int             # GPUs that reach each other over NVLink (1: PCIe only)
    nics: int                      # NICs carrying GPU (east-west) traffic, per node
    nic_bw: float                  # bytes/s per NIC per direction (0: no network)
    fabric: str                    # "InfiniBand NDR", "RoCE", ...
    pcie_gen: int
    host_dram_bw: float            # bytes/s per node, peak
    cpu_vendor: str                # "intel" or "amd": NCCL's per-step network overhead differs
    nvme_drives: int
    nvme_read: float | None        # bytes/s per drive, sequential read
    nvme_write: float | None       # bytes/s per drive, sustained sequential write
    nvls_busbw: float | None = None   # all-reduce busbw with NVLink SHARP on a full node
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def gpu(self) -> GPU:
        """The GPU's own figures, from :mod:`gpumem.memory.gpus`."""
        return REGISTRY[self.gpu_name]

    @property
    def nvlink(self) -> float | None:
        """NVLink bytes/s per GPU per direction (None: the node has no NVLink)."""
        return self.gpu.nvlink if self.nvlink_domain > 1 else None

    @property
    def pcie(self) -> float:
        """The GPU's PCIe bytes/s per direction."""
        return self.gpu.pcie

    def nics_for(self, ranks_on_node: int) -> int:
        """NICs that ``ranks_on_node`` ranks of a group reach on their own PCIe switches: NICs are
        spread evenly over the node's GPUs (DGX: one per GPU), and a rank uses those beside it
        (NCCL's default; PXN, which borrows a neighbour's NIC over NVLink, is not modelled)."""
        if self.nics == 0:
            return 0
        return min(self.nics, max(1, -(-ranks_on_node * self.nics // self.gpus_per_node)))


_SAMSUNG_U2 = ("assumption: the DGX datasheets name no drive model; figures of a Gen4 U.2 3.84 TB "
               "drive (Samsung PM1733 datasheet: 7,000 MB/s sequential read, 3,800 MB/s sequential "
               "write). Effect: NVMe offload times scale with them")
_XEON_8480C = ("Dual Intel Xeon Platinum 8480C (DGX BasePOD reference architecture, core "
               "components: 'Dual Intel Xeon Platinum 8480C processors ... 2 TB of DDR5'); Intel "
               "ark, Xeon Platinum 8480+: 8 channels DDR5-4800 -> 2 x 8 x 4800 MT/s x 8 B = 614.4 GB/s")

NODES: dict[str, NodeType] = {n.name: n for n in [
    NodeType("dgx-a100", "DGX A100 640GB", "a100-80gb", 8, 8, 8, 200 * Gbps, "InfiniBand HDR", 4,
             ddr(2, 8, 3200), "amd", 8, 7.0e9, 3.8e9, None, {
                 "gpus_per_node, nvlink_domain": "DGX A100 datasheet: 8x A100 80GB, 6x NVSwitch, "
                                                 "'600 GB/s GPU-to-GPU bidirectional'",
                 "nics, nic_bw": "DGX A100 datasheet/user guide: '8x single-port Mellanox ConnectX-6 "
                                 "VPI 200Gb/s HDR InfiniBand' for compute (the 2 dual-port are storage)",
                 "pcie_gen": "A100 SXM4: PCIe Gen4 x16",
                 "host_dram_bw": "2x AMD EPYC 7742 (DGX A100 datasheet); AMD spec: 8 channels "
                                 "DDR4-3200 -> 2 x 8 x 3200 MT/s x 8 B = 409.6 GB/s",
                 "cpu_vendor": "AMD EPYC 7742",
                 "nvme": "DGX A100 640GB datasheet: internal storage 30 TB (8x 3.84 TB) U.2 NVMe; "
                         + _SAMSUNG_U2}),
    NodeType("dgx-h100", "DGX H100", "h100-80gb", 8, 8, 8, 400 * Gbps, "InfiniBand NDR", 5,
             ddr(2, 8, 4800), "intel", 8, 7.0e9, 3.8e9, 480 * GB, {
                 "gpus_per_node, nvlink_domain": "DGX BasePOD RA core components: 'Eight NVIDIA "
                                                 "Hopper GPUs', 'Four NVIDIA NVSwitch chips'; 900 GB/s "
                                                 "NVLink bidirectional per GPU (H100 datasheet)",
                 "nics, nic_bw": "DGX BasePOD RA: 'Four OSFP ports serving eight single-port NVIDIA "
                                 "ConnectX-7 VPI ... up to 400 Gb/s InfiniBand/Ethernet'; DGX H100 "
                                 "user guide table 6: one ConnectX-7 per GPU",
                 "pcie_gen": "H100 SXM5: PCIe Gen5 x16",
                 "host_dram_bw": _XEON_8480C, "cpu_vendor": "Intel Xeon Platinum 8480C",
                 "nvme": "DGX H100 datasheet: internal storage 8x 3.84 TB NVMe U.2; " + _SAMSUNG_U2,
                 "nvls_busbw": "S. Jeaugey (NVIDIA), nccl-tests issue #212, 2024-05-06: NVLink SHARP "
                               "all-reduce on 8 H100 'peak busBw of ~480GB/s (algbw ~275GB/s)'"}),
    NodeType("hgx-h200", "HGX/DGX H200", "h200", 8, 8, 8, 400 * Gbps, "InfiniBand NDR", 5,
             ddr(2, 8, 4800), "intel", 8, 7.0e9, 3.8e9, 480 * GB, {
                 "all": "DGX BasePOD RA: 'NVIDIA DGX H200 and H100 Systems' share one specification "
                        "list (same NVSwitch, same 8x ConnectX-7 400 Gb/s, same CPUs)",
                 "host_dram_bw": _XEON_8480C, "nvme": _SAMSUNG_U2,
                 "nvls_busbw": "assumption: H100's 480 GB/s (same NVSwitch gen3); HBM is faster "
                               "but NVLink is the same. Effect: TP all-reduce on one node"}),
    NodeType("h100-roce", "H100 RoCE (Meta Grand Teton)", "h100-80gb", 8, 8, 8, 400 * Gbps, "RoCE v2",
             5, ddr(2, 8, 4800), "intel", 8, 7.0e9, 3.8e9, 480 * GB, {
                 "fabric, nic_bw": "Llama 3 paper (arXiv 2407.21783) sec. 3.3.1: 405B trained on a "
                                   "RoCE fabric (Arista 7800, Minipack2 OCP switches); 'both use "
                                   "400 Gbps interconnects between GPUs'; 8 GPUs per Grand Teton server",
                 "nics": "Grand Teton (as summarised by G. Lockwood, 'Meta's H100 clusters'): 4 PCIe "
                         "Gen5 switches each with 2x 400G backend NICs = 8 per node",
                 "host_dram_bw": "assumption: Sapphire Rapids like DGX H100 (8 ch DDR5-4800 per "
                                 "socket). Effect: CPU offload only",
                 "nvme": "Grand Teton: 2 NVMe per PCIe switch = 8 (Lockwood); " + _SAMSUNG_U2,
                 "achieved": "assumption: RoCE reaches IB's per-NIC NCCL bandwidth (Meta reports "
                             "parity after tuning, SIGCOMM 2024 'RDMA over Ethernet for distributed "
                             "AI training at Meta scale'). Effect: every network-bound time"}),
    NodeType("g2-l4x8", "Google Cloud g2-standard-96 (8x L4, PCIe)", "l4", 8, 1, 1, 100 * Gbps,
             "Ethernet (gVNIC, TCP)", 4, ddr(1, 8, 4800), "intel", 4, 2.4e9, 1.2e9, None, {
                 "gpus_per_node, nvlink_domain": "Google Cloud 'GPU machine types', G2: "
                                                 "g2-standard-96 has 8 L4; L4 has no NVLink (L4 datasheet)",
                 "nics, nic_bw": "Google Cloud 'Networking and GPU machines': 'For A2 and G2 ... a "
                                 "maximum network bandwidth of up to 100 Gbps, based on the machine "
                                 "type' (one virtual NIC)",
                 "pcie_gen": "L4 datasheet: PCIe Gen4 x16",
                 "host_dram_bw": "assumption: a 96-vCPU G2 VM is one 4th-gen Xeon socket, 8 ch "
                                 "DDR5-4800 = 307.2 GB/s. Effect: CPU offload only (PCIe binds first)",
                 "nvme": "assumption: 4 local SSDs of 375 GiB at 2.4/1.2 GB/s read/write each "
                         "(not published per drive). Effect: NVMe offload times",
                 "achieved": "assumption: NCCL over TCP sockets reaches the same 94% as RDMA. "
                             "Effect: optimistic for this box"}),
    NodeType("colab-t4", "Colab T4 (single GPU)", "t4", 1, 1, 0, 0.0, "none", 3, 20 * GB, "intel",
             0, None, None, None, {
                 "gpus_per_node": "Colab free tier: one T4 (nvidia-smi in a Colab runtime)",
                 "pcie_gen": "T4 datasheet: PCIe Gen3 x16",
                 "host_dram_bw": "assumption: 20 GB/s for a 2-vCPU VM (not published). Effect: none "
                                 "while PCIe Gen3 (15.75 GB/s) binds host transfers",
                 "nvme": "assumption: no local NVMe (the runtime disk is network storage)"}),
]}


def node(name: str) -> NodeType:
    """Look a node type up by name; a :class:`UsageError` lists the accepted names."""
    return NODES[one_of(name, tuple(NODES), "node type")]


@dataclass(frozen=True)
class Group:
    """A communicator's placement: ``ranks_per_node`` ranks on each of ``nodes`` nodes."""
    node: NodeType
    ranks_per_node: int
    nodes: int

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return self.ranks_per_node * self.nodes

    def describe(self) -> str:
        """The placement in words, e.g. '64 ranks: 8 per node x 8 nodes of DGX H100'."""
        return (f"{self.size} ranks: {self.ranks_per_node} per node x {self.nodes} "
                f"node{'s' if self.nodes > 1 else ''} of {self.node.label}")


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of one node type; ranks numbered node-major."""
    node: NodeType
    nodes: int = 1

    @property
    def gpus(self) -> int:
        """GPUs in the cluster."""
        return self.node.gpus_per_node * self.nodes

    def group(self, size: int, stride: int = 1, first: int = 0, uneven: bool = False) -> Group:
        """The group of ranks ``first, first + stride, ...`` (``size`` of them). Each node it
        touches must hold the same number of its ranks, as in tensor-, pipeline- and
        data-parallel groups of a regular layout; ``uneven``: a group that does not (a GPU count that
        is not a multiple of a node, tp x cp = 12 on nodes of 8) is priced with the fewest ranks any
        node holds (the fewest NICs: the slowest node binds) instead of refused."""
        if size < 1 or stride < 1 or first < 0 or first + (size - 1) * stride >= self.gpus:
            raise UsageError(f"a group of {size} ranks with stride {stride} from rank {first} does "
                             f"not fit in {self.gpus} GPUs ({self.nodes} x {self.node.label})")
        return Group(self.node, *_spread(self.node.gpus_per_node, size, stride, first, uneven))


@lru_cache(maxsize=4096)
def _spread(per: int, size: int, stride: int, first: int, uneven: bool) -> tuple[int, int]:
    """(ranks on a node, nodes touched) of :meth:`Cluster.group`'s ranks, nodes of ``per`` GPUs
    (remembered: a planner's search asks for the same few groups some 400,000 times)."""
    per_node: dict[int, int] = {}
    for i in range(size):
        n = (first + i * stride) // per
        per_node[n] = per_node.get(n, 0) + 1
    counts = set(per_node.values())
    if len(counts) != 1 and not uneven:
        raise UsageError(f"ranks of this group are spread unevenly over nodes: {per_node}")
    return min(counts), len(per_node)      # uneven: the fewest ranks a node holds binds
