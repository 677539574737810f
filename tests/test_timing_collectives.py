"""The collectives' alpha-beta model against hand counts, nccl-tests' definitions and published
nccl-tests results (each cited where it is used). Torch-free, well under a second."""

import dataclasses
import math

import pytest

from gpumem.errors import UsageError
from gpumem.memory.gpus import REGISTRY
from gpumem.timing import collectives as C
from gpumem.timing.hardware import NODES, Cluster, ddr

GB = 1e9
BIG = 8 * 2**30          # 8 GiB: nccl-tests' largest sizes, where latency is negligible
H100, A100 = NODES["dgx-h100"], NODES["dgx-a100"]


def busbw_at(coll, group, size=BIG, algorithm=None):
    return C.collective_time(coll, size, group, algorithm).busbw


# ---- bytes per rank: hand counts of a ring -------------------------------------------------

def test_bytes_per_rank_by_hand():
    """Ring all-gather of S over n = 4: each rank forwards 3 chunks of S/4; reduce-scatter the
    same; all-reduce = reduce-scatter + all-gather = 6 chunks; all-to-all: 3 of its 4 blocks leave."""
    S = 4_000
    assert C.bytes_per_rank("all_gather", S, 4) == 3 * 1_000
    assert C.bytes_per_rank("reduce_scatter", S, 4) == 3 * 1_000
    assert C.bytes_per_rank("all_reduce", S, 4) == 6 * 1_000
    assert C.bytes_per_rank("all_to_all", S, 4) == 3 * 1_000
    assert C.bytes_per_rank("send_recv", S, 2) == S
    assert C.bytes_per_rank("all_reduce", S, 1) == 0


def test_busbw_factors_from_nccl_tests_doc():
    """nccl-tests doc/PERFORMANCE.md 'Summary': AllReduce 2(n-1)/n, ReduceScatter and AllGather
    (n-1)/n, AlltoAll (n-1)/n; busbw = algbw x factor."""
    assert C.busbw("all_reduce", 100.0, 8) == pytest.approx(100 * 2 * 7 / 8)
    assert C.busbw("all_gather", 100.0, 8) == pytest.approx(100 * 7 / 8)
    assert C.busbw("reduce_scatter", 100.0, 16) == pytest.approx(100 * 15 / 16)
    assert C.busbw("all_to_all", 100.0, 64) == pytest.approx(100 * 63 / 64)
    # a result's busbw is its algbw (S / t) times that factor
    r = C.collective_time("all_reduce", BIG, Cluster(H100).group(8))
    assert r.algbw == pytest.approx(BIG / r.seconds)
    assert r.busbw == pytest.approx(r.algbw * 2 * 7 / 8)


# ---- hardware: figures come from gpus.py, DRAM from channel counts ---------------------------

def test_node_reads_gpu_figures_from_the_registry():
    assert H100.nvlink == REGISTRY["h100-80gb"].nvlink == 450 * GB
    assert NODES["g2-l4x8"].nvlink is None                         # PCIe only
    assert H100.nic_bw == 400e9 / 8 and A100.nic_bw == 200e9 / 8   # 400 / 200 Gb/s per direction
    # EPYC 7742: 8 channels DDR4-3200 per socket; Xeon 8480C: 8 channels DDR5-4800 per socket
    assert A100.host_dram_bw == ddr(2, 8, 3200) == pytest.approx(409.6e9)
    assert H100.host_dram_bw == pytest.approx(2 * 8 * 4800e6 * 8)
    for n in NODES.values():
        assert n.sources, n.name


def test_placement_of_groups():
    c = Cluster(H100, 8)
    assert (c.group(8).ranks_per_node, c.group(8).nodes) == (8, 1)
    assert (c.group(64).ranks_per_node, c.group(64).nodes) == (8, 8)
    assert (c.group(8, stride=8).ranks_per_node, c.group(8, stride=8).nodes) == (1, 8)
    assert (c.group(16, stride=4).ranks_per_node, c.group(16, stride=4).nodes) == (2, 8)
    with pytest.raises(UsageError):
        c.group(65)
    with pytest.raises(UsageError):
        c.group(12)            # 8 on node 0, 4 on node 1


# ---- which link binds ------------------------------------------------------------------------

def test_binding_link_one_dgx_h100():
    """(a) 8 GPUs in one DGX H100: nothing leaves the node; NVLink binds."""
    r = C.collective_time("all_gather", BIG, Cluster(H100).group(8))
    assert r.binding == "NVLink" and [name for name, _ in r.links] == ["NVLink"]


def test_binding_link_eight_full_nodes():
    """(b) 64 GPUs as 8 full DGX H100 nodes. By hand: each GPU's NVLink carries 7/8 of its ring
    sends at 370 GB/s -> bound 370 x 8/7 = 423 GB/s; the node's 8 NICs carry one rank's worth
    at 8 x 47 = 376 GB/s. The network binds, at per-NIC speed on all 8 NICs, not 1/8 of a port."""
    r = C.collective_time("all_gather", BIG, Cluster(H100, 8).group(64))
    assert r.binding == "network"
    assert C.bytes_per_rank("all_gather", BIG, 64) / r.bandwidth_s == pytest.approx(8 * 47 * GB, rel=1e-3)
    links = dict(r.links)
    assert links["NVLink"] / links["network"] == pytest.approx((7 / 8 / 370) / (1 / 376), rel=1e-3)


def test_binding_link_one_rank_per_node():
    """(c) 8 GPUs, one per node: each rank has only its own NIC, 47 GB/s -- 8x less than (b)."""
    r = C.collective_time("all_gather", BIG, Cluster(H100, 8).group(8, stride=8))
    assert r.binding == "network" and [name for name, _ in r.links] == ["network"]
    full = C.collective_time("all_gather", BIG, Cluster(H100, 8).group(64))
    per_rank = (C.bytes_per_rank("all_gather", BIG, 64) / full.bandwidth_s,
                C.bytes_per_rank("all_gather", BIG, 8) / r.bandwidth_s)
    assert per_rank == pytest.approx((376 * GB, 47 * GB), rel=1e-3)


def test_pcie_box_binds_on_its_one_nic_across_nodes():
    """Two 8x L4 boxes with one 100 Gb/s NIC each: the NIC (11.75 GB/s achieved) binds a ring."""
    r = C.collective_time("all_gather", BIG, Cluster(NODES["g2-l4x8"], 2).group(16))
    assert r.binding == "network" and r.busbw == pytest.approx(12.5 * GB * 0.94, rel=0.01)
    with pytest.raises(UsageError):               # Colab has no network for GPU traffic
        C.collective_time("all_reduce", BIG, Cluster(NODES["colab-t4"], 2).group(2))


# ---- predicted large-message busbw vs published nccl-tests figures ---------------------------
# Tolerance 10 %: the model uses one NVLink factor (370/450) and one network factor (47/50).

PUBLISHED = [
    # (case, collective, cluster, size, stride, published busbw GB/s, algorithm, source)
    ("H100 8 GPUs ring", "all_reduce", Cluster(H100), 8, 1, 367.5, "ring",
     "nccl issue #1455: NCCL_ALGO=RING busbw 'about 365-370 GBps when gpus from 2 to 8', 2-4 GB"),
    ("H100 8 GPUs NVLS", "all_reduce", Cluster(H100), 8, 1, 480, None,
     "nccl issue #1455: NVLS busbw '480 GBps' on 8 GPUs, 2-4 GB (the model's input, #212)"),
    ("A100 8 GPUs", "all_reduce", Cluster(A100), 8, 1, 232.54, None,
     "nccl-tests issue #175: single node 8x A100, -e 4G, '232.54GB/s'"),
    ("H100 4 nodes x 8", "all_reduce", Cluster(H100, 4), 32, 1, 365.84, None,
     "nccl-tests issue #309: 4 nodes, 32 GPU-NIC pairs (NDR 400G), 'max busbw ... 365.84 GB/s'"),
    ("DGX A100 multi-node", "all_reduce", Cluster(A100, 4), 32, 1, 192, None,
     "nccl issue #812, AddyLaddy (NVIDIA): DGX-A100 '8x200Gbit/s IB ... 192GB/s AllReduce BusBW'"),
    ("A100 3 nodes, 4 HDR NICs", "all_reduce", Cluster(dataclasses.replace(A100, nics=4), 3), 24, 1,
     96, None, "nccl-tests issue #119: 3 nodes 8x A100 + 4x HDR; S. Jeaugey: '24GB/s is the peak "
     "performance per 200G NIC ... 96GB/s is the target, which you seem to reach'"),
    ("A100 one rank per node", "all_reduce", Cluster(A100, 4), 4, 8, 24, None,
     "nccl-tests issue #119, S. Jeaugey: '24GB/s is the peak performance per 200G NIC'"),
]


@pytest.mark.parametrize("case", PUBLISHED, ids=[c[0] for c in PUBLISHED])
def test_large_message_busbw_matches_published(case):
    _, coll, cluster, size, stride, published, algorithm, _source = case
    predicted = busbw_at(coll, cluster.group(size, stride), algorithm=algorithm) / GB
    assert predicted / published == pytest.approx(1.0, abs=0.10), (predicted, published)


def test_nvls_is_chosen_for_a_full_hopper_node_only():
    assert C.collective_time("all_reduce", BIG, Cluster(H100).group(8)).algorithm == "nvls"
    assert C.collective_time("all_reduce", BIG, Cluster(H100).group(4)).algorithm == "ring"
    assert C.collective_time("all_reduce", BIG, Cluster(A100).group(8)).algorithm == "ring"


def test_two_node_tree_beats_the_network_bound():
    """On two nodes NCCL's tree exceeds the ring's network bound (S. Jeaugey, nccl-tests #196);
    from four nodes on, the ring is faster for large messages."""
    two = C.collective_time("all_reduce", BIG, Cluster(A100, 2).group(16))
    assert two.algorithm == "tree" and two.busbw > 8 * 25 * GB * 0.94
    four = C.collective_time("all_reduce", BIG, Cluster(A100, 4).group(32))
    assert four.algorithm == "ring"


# ---- latency -----------------------------------------------------------------------------------

def test_small_messages_are_latency():
    """8 bytes: the latency term is the time; 8 GiB: it is under 2 % of it."""
    for group in (Cluster(H100).group(8), Cluster(H100, 8).group(64), Cluster(H100, 8).group(8, stride=8)):
        small = C.collective_time("all_reduce", 8, group)
        assert small.latency_s / small.seconds > 0.99
        big = C.collective_time("all_reduce", BIG, group)
        assert big.latency_s / big.seconds < 0.02


def test_latency_from_nccl_constants_by_hand():
    """NCCL tuning.cc: ring LL all-reduce in one NVLink node = base 6.6 + 2(n-1) x 0.6 us; over
    k nodes the tree LL = 6.8 + 2((r-1) x 0.6 + log2(k) x 5.0) us."""
    one = C.collective_time("all_reduce", 8, Cluster(H100).group(8))
    assert (one.algorithm, one.protocol) == ("ring", "LL")
    assert one.latency_s == pytest.approx((6.6 + 14 * 0.6) * 1e-6)
    multi = C.collective_time("all_reduce", 8, Cluster(H100, 8).group(64))
    assert (multi.algorithm, multi.protocol) == ("tree", "LL")
    assert multi.latency_s == pytest.approx((6.8 + 2 * (7 * 0.6 + 3 * 5.0)) * 1e-6)
    # latency grows with the number of ring steps: 64 ranks on a ring take longer than 8
    r8 = C.collective_time("all_gather", 8, Cluster(H100).group(8))
    r64 = C.collective_time("all_gather", 8, Cluster(H100, 8).group(64))
    assert r64.latency_s > r8.latency_s


def test_all_to_all_and_send_recv_by_hand():
    """All-to-all over 8 full nodes: a node sends 8 x 56/64 S over 8 NICs; a send between nodes
    uses one NIC."""
    r = C.collective_time("all_to_all", BIG, Cluster(H100, 8).group(64))
    assert r.bandwidth_s == pytest.approx(8 * 56 / 64 * BIG / (8 * 47 * GB), rel=1e-3)
    p = C.collective_time("send_recv", BIG, Cluster(H100, 2).group(2, stride=8))
    assert p.binding == "network" and p.bandwidth_s == pytest.approx(BIG / (47 * GB), rel=1e-3)
    q = C.collective_time("send_recv", BIG, Cluster(H100).group(2))
    assert q.binding == "NVLink" and q.bandwidth_s == pytest.approx(BIG / (370 * GB), rel=1e-3)
    assert math.isclose(C.collective_time("all_gather", BIG, Cluster(H100).group(1)).seconds, 0)


def test_ll_is_capped_at_nccls_llmaxbw_so_mid_size_gathers_across_nodes_use_simple():
    """tuning.cc line 327: busBw = min(llMaxBw, busBw x 0.5) for ring LL; llMaxBws (lines 177-183)
    is 20.4 GB/s for Intel hosts on more than 2 nodes. A 33.5 MB all-gather over 8 DGX H100
    nodes (64 ranks): LL would need >= 33.5e6 x 63/64 / 20.4e9 = 1.62 ms of bandwidth alone,
    so NCCL's model (and ours) takes Simple; one node of H100s caps LL at 141 GB/s."""
    from gpumem.timing import collectives as c
    from gpumem.timing.hardware import Cluster, NODES
    group = Cluster(NODES["dgx-h100"], 8).group(64)
    t = c.collective_time("all_gather", 33.5e6, group)
    assert t.protocol == "simple"
    ll = c.collective_time("all_gather", 33.5e6, group, algorithm="ring")
    assert c.ll_max_busbw(group) == 20.4e9
    assert c.ll_max_busbw(Cluster(NODES["dgx-h100"], 1).group(8)) == 141e9
    assert c.ll_max_busbw(Cluster(NODES["dgx-a100"], 2).group(16)) == 22.5e9   # AMD EPYC hosts, 2 nodes
    assert ll.seconds >= 33.5e6 * 63 / 64 / 20.4e9 or ll.protocol == "simple"
