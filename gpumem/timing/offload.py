"""ZeRO-Infinity's parameter reads placed on nodes: bandwidth-centric partitioning against one owner.

With parameters offloaded, every forward and every backward pass needs each parameter on every
GPU, and the bytes start in host memory or on a drive. ZeRO-Infinity (Rajbhandari et al.,
arXiv:2104.07857, section 6.1, "bandwidth-centric partitioning") contrasts two ways to bring
them up:

* **one owner** (ZeRO and ZeRO-Offload): each parameter belongs to one data-parallel rank, which
  reads it up over its own PCIe link (and drive) and broadcasts it; while a layer is fetched, one
  link of the whole group works, so a pass reads all ``p16 x Psi`` bytes at one link's rate;
* **bandwidth-centric** (ZeRO-Infinity): each parameter is split over all ``dp`` ranks; every
  rank reads its ``1/dp`` slice over its own link at the same time, and an all-gather over the
  GPU-to-GPU links (NVLink in a node, the NICs across nodes) assembles it. The offload bandwidth
  grows with ``dp`` until the all-gather binds.

DeepSpeed 0.19.8's ZeRO-3 is the second: each rank's ``ds_tensor`` is its slice of every
parameter, swapped in by ``partitioned_param_swapper.py`` and gathered by
``partitioned_param_coordinator.py``. The per-rank read rate is the slower of the GPU's PCIe link
(line rate, as :mod:`gpumem.timing.offload_time` uses it) and its share of the node's drives
(``NodeType.nvme_drives`` x ``nvme_read`` / GPUs per node) or of host DRAM; the all-gather is
:func:`gpumem.timing.collectives.collective_time` over the group's placement. Reads and the
gathers of different layers pipeline (prefetch), so a pass lasts the longer of the two.
"""

from dataclasses import dataclass

from ..errors import UsageError, one_of, positive_int
from ..memory import accounting
from .collectives import CollectiveTime, collective_time
from .hardware import Group

SOURCES = ("nvme", "cpu")


@dataclass(frozen=True)
class ParamRead:
    """One pass's parameter fetch for a data-parallel group (seconds, bytes, bytes/s)."""
    group: Group
    source: str
    total_bytes: int          # p16 x Psi: what every GPU needs per pass
    slice_bytes: int          # p16 x ceil(Psi / dp): what each rank reads
    rank_rate: float          # bytes/s one rank reads at
    binding: str              # "NVMe", "PCIe" or "host DRAM": what sets rank_rate
    gather: CollectiveTime    # the all-gather of the whole parameters

    @property
    def read_s(self) -> float:
        """Each rank reads its slice, all at once."""
        return self.slice_bytes / self.rank_rate

    @property
    def seconds(self) -> float:
        """Bandwidth-centric pass: slice reads and all-gathers of different layers pipelined."""
        return max(self.read_s, self.gather.seconds)

    @property
    def owner_s(self) -> float:
        """One-owner pass: every byte up one rank's link in turn (the broadcast not counted)."""
        return self.total_bytes / self.rank_rate

    def describe(self) -> str:
        """Three lines (under 100 characters): the group, the bandwidth-centric pass with its parts,
        and the one-owner pass."""
        return (f"{self.group.describe()}, pass {self.seconds:.2f} s:\n"
                f"  each rank reads {self.slice_bytes / 1e9:.2f} GB at {self.rank_rate / 1e9:.2f} GB/s "
                f"({self.binding}) in {self.read_s:.2f} s; all-gather of {self.total_bytes / 1e9:.1f} GB "
                f"{self.gather.seconds:.2f} s ({self.gather.binding})\n"
                f"  one owner per parameter: {self.total_bytes / 1e9:.1f} GB up one link in "
                f"{self.owner_s:.2f} s, {self.owner_s / self.seconds:.1f}x longer")


def rank_read_rate(group: Group, source: str = "nvme") -> tuple[float, str]:
    """Bytes/s one rank reads its offloaded slice at, and the link that sets it: the GPU's PCIe
    line rate against its share of the node's drives (``nvme``) or of host DRAM (``cpu``)."""
    node = group.node
    one_of(source, SOURCES, "offload source")
    if source == "nvme":
        if not node.nvme_drives or not node.nvme_read:
            raise UsageError(f"{node.label} has no local NVMe drives to offload to")
        share, name = node.nvme_drives * node.nvme_read / node.gpus_per_node, "NVMe"
    else:
        share, name = node.host_dram_bw / node.gpus_per_node, "host DRAM"
    return (share, name) if share < node.pcie else (node.pcie, "PCIe")


def param_read(n_params: int, group: Group, recipe: str = "mixed", source: str = "nvme") -> ParamRead:
    """One forward or backward pass's parameter fetch for ZeRO-3 with parameters offloaded over the
    data-parallel ``group`` (``Cluster.group``): bandwidth-centric, and one owner beside it."""
    n_params = positive_int(n_params, "parameter count")
    p16 = accounting.recipe(recipe).params
    rate, binding = rank_read_rate(group, source)
    total = p16 * n_params
    return ParamRead(group, source, total, p16 * accounting.shard(n_params, group.size), rate, binding,
                     collective_time("all_gather", total, group))
