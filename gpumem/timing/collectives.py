"""Collectives as an alpha-beta model with placement: seconds = latency + bytes / achieved bandwidth.

Sizes follow nccl-tests (doc/PERFORMANCE.md, NVIDIA/nccl-tests 2.19.6): ``nbytes`` is S, the whole
array: an all-gather's output, a reduce-scatter's input, an all-reduce's buffer, an all-to-all's
send buffer per rank, a send's message. Each rank sends (and receives) ``S x f`` bytes, with
f = 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for a send;
nccl-tests' bus bandwidth is the same factor, ``busbw = algbw x f`` with ``algbw = S / t``.

Bandwidth (beta). A ring over ``r`` ranks on each of ``k`` nodes (NCCL keeps a node's ranks
adjacent in each ring and builds a ring per channel, the channels spread over the NICs):
  * one node: every send crosses the intra-node link, ``t = S f / B_intra``;
  * k > 1: in each ring one hop in r leaves the node, so a GPU's NVLink carries (r-1)/r of its
    sends and the node's NICs together carry one rank's worth, ``S f``, spread over the m NICs its
    ranks sit beside (m = 8 for 8 ranks of a DGX, 1 for a group of one rank per node):
    ``t = max((r-1)/r S f / B_nvlink, S f / (m B_nic))``. On a PCIe-only node every send crosses
    the GPU's PCIe link, to a peer or to the NIC. The binding link is the larger term.
``B`` is line rate x an achieved factor from published nccl-tests results (below).
Tree all-reduce (only across nodes, as in NCCL): each rank moves 2S (NCCL's algbw = busbw / 2,
tuning.cc line 380) at 0.92 of the ring's bandwidth (line 331), the NICs 2S per node, S on two
nodes (:func:`tree_links`). NVLink SHARP all-reduce on a full H100/H200 node uses
the published busbw (``NodeType.nvls_busbw``). All-to-all: a rank's (r-1)/n S stays in the node,
a node's r (n-r)/n S crosses its m NICs. Not modelled: NVLSTree, CollNet/SHARP switches, PAT,
LL128 (between LL and Simple), PXN, the x1.4 ring "plateau" latency (line 649), congestion.

Latency (alpha), from NCCL's own tuning model (tuning.cc lines 149-175, 384-428), in us:
ring ``base + (steps - inter) x intra + inter x net``, with steps = 2(n-1) for all-reduce, n-1 for
all-gather/reduce-scatter, inter = 2(k-1) or k-1 of them crossing nodes; tree
``base + 2 ((r-1) intra + floor(log2 k) net)``. Protocols LL (low latency, half the bandwidth,
capped at llMaxBw: tuning.cc line 327) and Simple; like NCCL's tuner the fastest is taken.
"""

import math
from dataclasses import dataclass

from ..errors import UsageError, one_of
from .hardware import Group

# Achieved share of line rate, as NCCL's busbw shows it on large messages.
# NVLink: S. Jeaugey (NVIDIA), nccl-tests issue #212 (2024-05-06): "450GB/s is the line rate. With
# the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s" (H100, ring).
NVLINK_EFFICIENCY = 370 / 450
# Network: AddyLaddy (NCCL maintainer), nccl-tests issue #290 (2025-03-03): "For NDR @ 400Gbps you should
# see 46-48GB/s per NIC"; the middle, 47 of 50 GB/s.
NETWORK_EFFICIENCY = 47 / 50
# PCIe: assumption, NCCL's ~20 % protocol overhead as on NVLink; cross-socket hops not modelled.
# Effect: every intra-node time on a PCIe-only box.
PCIE_EFFICIENCY = NVLINK_EFFICIENCY

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv")

# NCCL 2.30.7 src/graph/tuning.cc ncclTunerConstantsDefaults (us): baseLatencies, hwLatencies.
BASE_LATENCY_US = {"ring": {"LL": 6.6, "simple": 8.4}, "tree": {"LL": 6.8, "simple": 8.4},
                   "nvls": {"simple": 0.0}}
HW_LATENCY_US = {"nvlink": {"ring": {"LL": 0.6, "simple": 3.4}, "tree": {"LL": 0.6, "simple": 4.0},
                            "nvls": {"simple": 25.0}},
                 "pcie": {"ring": {"LL": 1.0, "simple": 5.7}, "tree": {"LL": 1.0, "simple": 4.0}},
                 "net": {"ring": {"LL": 2.7, "simple": 14.0}, "tree": {"LL": 5.0, "simple": 14.0}}}
# getNetOverhead (tuning.cc line 228): 1 us on Intel, 2 us on AMD hosts, x3 for Simple.
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
# Bandwidth per protocol (tuning.cc lines 327-332): ring LL x0.5, tree all-reduce x0.92 then LL
# x1/3.8, tree Simple x0.92; LL's bus bandwidth is also capped at llMaxBw (below).
PROTOCOL_SHARE = {("ring", "LL"): 0.5, ("ring", "simple"): 1.0, ("tree", "LL"): 0.92 / 3.8,
                  ("tree", "simple"): 0.92, ("nvls", "simple"): 1.0, ("p2p", "simple"): 1.0}
# llMaxBws (tuning.cc lines 177-183, chosen at 265-272), GB/s of bus bandwidth for LL: on one node
# by GPU generation (sm70 Volta, sm80-89 Ampere and Ada, sm90 Hopper); across nodes by the host
# CPU's vendor, for 2 nodes and for more.
LL_MAX_BUSBW_GBS = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0,
                    "intel": (39.0, 20.4), "amd": (22.5, 19.0)}
_GENERATION = {"t4": "volta", "a100-40gb": "ampere", "a100-80gb": "ampere", "l4": "ampere",
               "h100-80gb": "hopper", "h200": "hopper"}


def ll_max_busbw(group: Group) -> float:
    """NCCL's cap on the LL protocol's bus bandwidth for ``group`` (bytes/s)."""
    if group.nodes == 1:
        return LL_MAX_BUSBW_GBS[_GENERATION.get(group.node.gpu_name, "hopper")] * 1e9
    return LL_MAX_BUSBW_GBS[group.node.cpu_vendor][0 if group.nodes == 2 else 1] * 1e9


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``n`` ranks (doc/PERFORMANCE.md, 'Summary')."""
    one_of(collective, COLLECTIVES, "collective")
    if collective == "send_recv":
        return 1.0
    return (2 if collective == "all_reduce" else 1) * (n - 1) / n


def bytes_per_rank(collective: str, nbytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring/pairwise collective of S = ``nbytes``."""
    return nbytes * bus_factor(collective, n)


def busbw(collective: str, algbw: float, n: int) -> float:
    """Bus bandwidth from algorithm bandwidth, as nccl-tests prints it."""
    return algbw * bus_factor(collective, n)


def _intra(group: Group) -> tuple[str, float]:
    node = group.node
    if node.nvlink and group.ranks_per_node <= node.nvlink_domain:
        return "NVLink", node.nvlink * NVLINK_EFFICIENCY
    return "PCIe", node.pcie * PCIE_EFFICIENCY


def _network(group: Group) -> float:
    node = group.node
    if node.nics == 0 or node.nic_bw <= 0:
        raise UsageError(f"{node.label} has no network for GPU traffic; a group over "
                         f"{group.nodes} nodes cannot be placed on it")
    return node.nics_for(group.ranks_per_node) * node.nic_bw * NETWORK_EFFICIENCY


def ring_links(group: Group, volume: float) -> dict[str, float]:
    """Seconds each link needs when every rank sends ``volume`` bytes around rings."""
    r, k = group.ranks_per_node, group.nodes
    name, bw = _intra(group)
    if k == 1:
        return {name: volume / bw} if r > 1 else {}
    links = {}
    if name == "PCIe":
        links[name] = volume / bw               # to a peer or to the NIC: always over PCIe
    elif r > 1:
        links[name] = (r - 1) / r * volume / bw
    links["network"] = volume / _network(group)
    return links


def tree_links(group: Group, nbytes: float) -> dict[str, float]:
    """Seconds each link needs in NCCL's tree all-reduce (a chain in each node, two binary trees
    over the nodes, each carrying half of S up and down): a rank moves 2S over its intra-node
    link; a node's NICs move 2S, or S on two nodes, where each node is one tree's root and the
    other's leaf -- why 2-node busbw can exceed the network's (S. Jeaugey, nccl-tests #196)."""
    name, bw = _intra(group)
    links = {name: 2 * nbytes / bw} if group.ranks_per_node > 1 else {}
    links["network"] = (nbytes if group.nodes == 2 else 2 * nbytes) / _network(group)
    return links


def _all_to_all_links(group: Group, nbytes: float) -> dict[str, float]:
    r, k, n = group.ranks_per_node, group.nodes, group.size
    name, bw = _intra(group)
    links = {}
    intra = (n - 1) / n * nbytes if (name == "PCIe" and k > 1) else (r - 1) / n * nbytes
    if intra > 0:
        links[name] = intra / bw
    if k > 1:
        links["network"] = r * (n - r) / n * nbytes / _network(group)
    return links


def _hw(group: Group) -> str:
    return "nvlink" if _intra(group)[0] == "NVLink" else "pcie"


def ring_latency_us(group: Group, protocol: str, steps: int, inter_steps: int) -> float:
    """NCCL's ring latency: base + intra-node steps x intra + inter-node steps x net (us)."""
    base, hw = BASE_LATENCY_US["ring"][protocol], _hw(group)
    intra = HW_LATENCY_US[hw]["ring"][protocol]
    if group.nodes == 1:
        return base + steps * intra
    overhead = NET_OVERHEAD_US[group.node.cpu_vendor] * (3 if protocol == "simple" else 1)
    intra = max(intra, overhead)
    net = HW_LATENCY_US["net"]["tree" if group.ranks_per_node == 1 else "ring"][protocol]
    return base + (steps - inter_steps) * intra + inter_steps * net


def tree_latency_us(group: Group, protocol: str) -> float:
    """NCCL's tree all-reduce latency: base + 2((r-1) intra + floor(log2 k) net) (us)."""
    hw = HW_LATENCY_US[_hw(group)]["tree"][protocol]
    net = HW_LATENCY_US["net"]["tree"][protocol]
    log2k = int(math.log2(group.nodes))
    return BASE_LATENCY_US["tree"][protocol] + 2 * ((group.ranks_per_node - 1) * hw + log2k * net)


@dataclass(frozen=True)
class CollectiveTime:
    """One collective's predicted time with its parts and the link that binds it."""
    collective: str
    nbytes: float
    group: Group
    algorithm: str
    protocol: str
    latency_s: float
    bandwidth_s: float
    binding: str                     # "NVLink", "PCIe", "network", or "none"
    links: tuple                     # ((link, seconds at full protocol share), ...)

    @property
    def seconds(self) -> float:
        """Latency plus bandwidth term."""
        return self.latency_s + self.bandwidth_s

    @property
    def algbw(self) -> float:
        """S / t, bytes/s, as nccl-tests prints it."""
        return self.nbytes / self.seconds if self.seconds else math.inf

    @property
    def busbw(self) -> float:
        """algbw x bus factor, bytes/s, as nccl-tests prints it."""
        return busbw(self.collective, self.algbw, self.group.size)

    def describe(self) -> str:
        """One line: time, its two terms, algorithm/protocol and the binding link."""
        return (f"{self.collective} of {self.nbytes / 1e6:,.1f} MB over {self.group.describe()}: "
                f"{self.seconds * 1e3:.3f} ms = {self.latency_s * 1e6:.1f} us latency + "
                f"{self.bandwidth_s * 1e3:.3f} ms bandwidth ({self.algorithm}/{self.protocol}, "
                f"bound by {self.binding}; busbw {self.busbw / 1e9:.0f} GB/s)")


def _candidates(collective: str, nbytes: float, group: Group):
    """(algorithm, protocol, latency us, {link: seconds at full share}) for each option NCCL has."""
    r, k, n = group.ranks_per_node, group.nodes, group.size
    volume = bytes_per_rank(collective, nbytes, n)
    if collective == "all_to_all":       # grouped send/recv; assumption: peers run concurrently,
        step = HW_LATENCY_US["net" if k > 1 else _hw(group)]["ring"]["simple"]   # one step each
        yield "p2p", "simple", BASE_LATENCY_US["ring"]["simple"] + step, _all_to_all_links(group, nbytes)
        return
    if collective == "send_recv":
        steps, inter = 1, (1 if k > 1 else 0)
    elif collective == "all_reduce":
        steps, inter = 2 * (n - 1), 2 * (k - 1)
    else:
        steps, inter = n - 1, k - 1
    for protocol in ("LL", "simple"):
        yield "ring", protocol, ring_latency_us(group, protocol, steps, inter), ring_links(group, volume)
    if collective == "all_reduce" and k > 1:
        tree = tree_links(group, nbytes)
        for protocol in ("LL", "simple"):
            yield "tree", protocol, tree_latency_us(group, protocol), tree
    if collective == "all_reduce" and k == 1 and group.node.nvls_busbw and r == group.node.gpus_per_node:
        yield ("nvls", "simple", HW_LATENCY_US["nvlink"]["nvls"]["simple"],
               {"NVLink": volume / group.node.nvls_busbw})


def collective_time(collective: str, nbytes: float, group: Group,
                    algorithm: str | None = None) -> CollectiveTime:
    """Seconds for ``collective`` of S = ``nbytes`` over ``group``, NCCL's fastest choice (or
    ``algorithm``: ring, tree, nvls), with the latency and bandwidth terms and the binding link."""
    one_of(collective, COLLECTIVES, "collective")
    if nbytes < 0:
        raise UsageError(f"nbytes must be >= 0, got {nbytes!r}")
    if group.size == 1 and collective != "send_recv":
        return CollectiveTime(collective, nbytes, group, "none", "none", 0.0, 0.0, "none", ())
    if collective == "send_recv" and group.size != 2:
        raise UsageError(f"send_recv takes a group of 2 ranks, got {group.size}")
    best = None
    for algo, protocol, latency_us, links in _candidates(collective, nbytes, group):
        if algorithm is not None and algo != algorithm:
            continue
        worst = max(links.values(), default=0.0)
        bandwidth_s = worst / PROTOCOL_SHARE[(algo, protocol)]
        if protocol == "LL":   # NCCL's busBw = min(llMaxBw, busBw x share): time >= S f / llMaxBw
            bandwidth_s = max(bandwidth_s, bytes_per_rank(collective, nbytes, group.size) / ll_max_busbw(group))
        binding = max(links, key=links.get) if links else "none"
        result = CollectiveTime(collective, nbytes, group, algo, protocol, latency_us * 1e-6,
                                bandwidth_s, binding, tuple(sorted(links.items())))
        if best is None or result.seconds < best.seconds:
            best = result
    if best is None:
        raise UsageError(f"algorithm {algorithm!r} is not available for {collective} over "
                         f"{group.describe()}")
    return best
