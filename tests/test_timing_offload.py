"""ZeRO-Infinity's parameter reads (gpumem.timing.offload), redone by hand from the node's figures.

The mechanism is the ZeRO-Infinity paper's (arXiv:2104.07857, section 6.1): each data-parallel
rank reads its 1/dp slice over its own link at once and an all-gather assembles the parameter,
where one owner per parameter would push every byte up one link.
"""

import pytest

from gpumem.errors import UsageError
from gpumem.timing import hardware, offload

N70 = 70_553_706_496
DGX = hardware.node("dgx-h100")


def test_one_dgx_h100_reads_slices_from_its_drives_and_gathers_over_nvlink():
    g = hardware.Cluster(DGX, 1).group(8)
    r = offload.param_read(N70, g)
    slice_bytes = 2 * -(-N70 // 8)                          # bf16 slice of every parameter
    assert r.slice_bytes == slice_bytes and r.total_bytes == 2 * N70
    # DGX H100: 8 U.2 drives for 8 GPUs, 7.0 GB/s read each (hardware.py's stated assumption),
    # below the GPU's PCIe Gen5 x16 (63 GB/s per direction): the drive binds
    assert (r.rank_rate, r.binding) == (7.0e9, "NVMe")
    assert r.read_s == pytest.approx(slice_bytes / 7.0e9)
    # all-gather over one node's NVLink: (n - 1)/n of the whole at 370 GB/s achieved (nccl-tests #212)
    assert r.gather.binding == "NVLink"
    assert r.gather.seconds == pytest.approx(2 * N70 * 7 / 8 / 370e9, rel=1e-3)
    assert r.seconds == pytest.approx(r.read_s)             # pipelined: the reads bind
    # one owner: every byte up one drive, 8x the bandwidth-centric pass
    assert r.owner_s == pytest.approx(2 * N70 / 7.0e9)
    assert r.owner_s / r.seconds == pytest.approx(8, rel=1e-6)


def test_more_ranks_shrink_the_slice_until_the_network_gather_binds():
    g = hardware.Cluster(DGX, 8).group(64)
    r = offload.param_read(N70, g)
    assert r.read_s == pytest.approx(2 * -(-N70 // 64) / 7.0e9)
    # 64 ranks on 8 nodes: each node's 8 NICs (400 Gb/s, 47 GB/s achieved, nccl-tests #290) carry
    # one rank's (n - 1)/n of the whole
    assert r.gather.binding == "network"
    assert r.gather.bandwidth_s == pytest.approx(2 * N70 * 63 / 64 / (8 * 47e9), rel=1e-6)
    assert r.seconds == pytest.approx(r.gather.seconds) and r.gather.seconds > r.read_s


def test_host_memory_source_is_bound_by_pcie_and_a_pcie_box_by_its_share_of_drives():
    r = offload.param_read(N70, hardware.Cluster(DGX, 1).group(8), source="cpu")
    # DDR5 614.4 GB/s per node / 8 GPUs = 76.8 GB/s > PCIe Gen5 63 GB/s
    assert (r.rank_rate, r.binding) == (DGX.gpu.pcie, "PCIe")
    l4 = hardware.node("g2-l4x8")                           # 4 local SSDs for 8 GPUs, 2.4 GB/s each
    rate, binding = offload.rank_read_rate(hardware.Cluster(l4, 1).group(8))
    assert (rate, binding) == (pytest.approx(4 * 2.4e9 / 8), "NVMe")


def test_no_drive_or_bad_source_is_refused():
    with pytest.raises(UsageError, match="no local NVMe"):
        offload.param_read(1000, hardware.Cluster(hardware.node("colab-t4"), 1).group(1))
    with pytest.raises(UsageError):
        offload.param_read(1000, hardware.Cluster(DGX, 1).group(8), source="tape")
