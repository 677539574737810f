"""The GPUs the course reasons about: capacity as the device reports it, speeds from datasheets.

A GPU's capacity is not its marketing name. An "80 GB" H100 reports 81,559 MiB in
``nvidia-smi`` (85.5 x 10^9 bytes, 79.6 GiB); an A100 80GB 81,920 MiB. Fits are judged against
capacity minus a stated :class:`Reserve` (CUDA context and library workspaces, NCCL buffers,
allocator fragmentation), never against the name on the box. What PyTorch calls the total (in an
out-of-memory message, from ``cudaMemGetInfo``) is lower still by the driver's own share, e.g.
14.75 GiB on a T4 that ``nvidia-smi`` shows as 15,360 MiB, 39.50 GiB on an A100 40GB (public
error reports: hpcaitech/Open-Sora #697, TianheWu/CoSeR #10); the reserve's CUDA-context term
covers it.

Sources. Capacity: ``nvidia-smi`` ``memory.total`` as printed on those GPUs (H100, A100, L4, T4
as collected in modal-labs/modal-client PR #2797; H200 143,771 MiB as printed in public
nvidia-smi outputs, and on the H200 this course ran on, 2026-12-04: results/gpu/). Speeds:
NVIDIA's datasheets (A100, H100/H200, L4, T4), dense tensor-core peaks without sparsity; link
bandwidths per direction (NVIDIA quotes NVLink and PCIe summed over both directions: "600 GB/s",
"900 GB/s", "64 GB/s"). PCIe per direction: Gen3 x16 15.75 GB/s,
Gen4 x16 31.5 GB/s, Gen5 x16 63 GB/s (line rate x 128/130 encoding).
"""

from dataclasses import dataclass

from ..errors import one_of
from ..units import GB, GiB, MiB, fmt

TB = 10**12

# Between nodes: one 400 Gb/s InfiniBand NDR port per GPU (the DGX H100 layout), per direction.
# Stated, not measured; the ZeRO-3 cost model and the planner both read it from here.
INTER_NODE = 50 * GB


@dataclass(frozen=True)
class GPU:
    """One GPU model: bytes it reports, peak bf16 FLOP/s, HBM, NVLink and PCIe bytes/s."""
    name: str
    label: str                   # how people name it
    capacity: int                # bytes, nvidia-smi memory.total
    bf16_flops: float | None     # dense bf16 tensor-core FLOP/s; None: no bf16 tensor cores
    fp16_flops: float            # dense fp16 tensor-core FLOP/s
    hbm: float                   # memory bandwidth, bytes/s
    nvlink: float | None         # GPU-to-GPU bandwidth per direction, bytes/s (None: PCIe only)
    pcie: float                  # host link per direction, bytes/s
    flash_attention_2: bool      # FlashAttention-2 runs on it (Ampere sm80 and newer)


REGISTRY: dict[str, GPU] = {g.name: g for g in [
    GPU("a100-40gb", "A100 40GB SXM", 40_960 * MiB, 312e12, 312e12, 1.555 * TB, 300 * GB, 31.5 * GB, True),
    GPU("a100-80gb", "A100 80GB SXM", 81_920 * MiB, 312e12, 312e12, 2.039 * TB, 300 * GB, 31.5 * GB, True),
    GPU("h100-80gb", "H100 80GB SXM", 81_559 * MiB, 989e12, 989e12, 3.35 * TB, 450 * GB, 63 * GB, True),
    GPU("h200", "H200 141GB SXM", 143_771 * MiB, 989e12, 989e12, 4.8 * TB, 450 * GB, 63 * GB, True),
    GPU("l4", "L4 24GB", 23_034 * MiB, 121e12, 121e12, 300 * GB, None, 31.5 * GB, True),
    GPU("t4", "T4 16GB (Colab)", 15_360 * MiB, None, 65e12, 320 * GB, None, 15.75 * GB, False),
]}


def get(name: str) -> GPU:
    """Look a GPU up by name; a :class:`UsageError` lists the accepted names."""
    return REGISTRY[one_of(name, tuple(REGISTRY), "GPU")]


# What ``torch.cuda.get_device_name()`` contains for each GPU of the table (the first match wins)
DEVICE_NAMES = {"H100 80GB HBM3": "h100-80gb", "A100-SXM4-80GB": "a100-80gb", "A100-SXM4-40GB": "a100-40gb",
                "H200": "h200", "L4": "l4", "Tesla T4": "t4"}


def of_device(device_name: str) -> GPU | None:
    """The table's GPU for a CUDA device name ("NVIDIA H200"), or None if it is not in the table."""
    key = next((v for k, v in DEVICE_NAMES.items() if k in device_name), None)
    return REGISTRY[key] if key else None


@dataclass(frozen=True)
class Reserve:
    """What a training process cannot use for tensors, in bytes: stated assumptions, not
    measurements (measure your own: ``torch.cuda.mem_get_info()`` after NCCL is initialised and
    one step has run, and ``memory_reserved() - memory_allocated()``).

    ``context``: the CUDA context with cuBLAS/cuDNN workspaces (about 0.5-1 GiB on Ampere and
    Hopper). ``nccl``: communicator buffers (NCCL_BUFFSIZE is 4 MiB per channel and peer; with
    several communicators it reaches about 1 GiB). ``fragmentation``: what PyTorch's caching
    allocator holds but cannot hand out. It rounds every request up (to 512 B; large ones to
    2 MiB: ``kMinBlockSize``, ``kRoundLarge`` in c10/core/AllocatorConfig.h), packs small ones
    into 2 MiB blocks and splits cached segments, so a freed block may be too small or too
    fragmented for the next request; reserved-minus-allocated in steady training is typically a
    few percent of the device. 5 % is the course's round assumption for it, not a measured law.
    """
    context: int = 1 * GiB
    nccl: int = 1 * GiB
    fragmentation: float = 0.05

    def of(self, capacity: int) -> int:
        """The reserve's bytes on a GPU of ``capacity`` bytes."""
        return self.context + self.nccl + int(self.fragmentation * capacity)

    def describe(self) -> str:
        """The reserve in words: its three terms, per GPU."""
        return (f"CUDA context {fmt(self.context, 'GiB')} + NCCL {fmt(self.nccl, 'GiB')} + "
                f"{self.fragmentation:.0%} of capacity for fragmentation, per GPU")


DEFAULT_RESERVE = Reserve()


def usable(gpu: GPU | str | int, reserve: Reserve = DEFAULT_RESERVE) -> int:
    """Bytes left for model states and activations: capacity minus the reserve. ``gpu`` is a
    registry name, a :class:`GPU` or a capacity in bytes."""
    capacity = gpu if isinstance(gpu, int) else (get(gpu) if isinstance(gpu, str) else gpu).capacity
    return capacity - reserve.of(capacity)


def table(reserve: Reserve = DEFAULT_RESERVE) -> str:
    """The GPU table as the course uses it, in two blocks no wider than 100 characters: memory
    (capacity in three units, usable bytes), then speeds; the reserve, units and sources below."""
    mem = [f"{'gpu':10s} {'as sold':16s} {'reports':>11s} {'in GB':>9s} {'in GiB':>10s} {'usable':>9s}"]
    speed = [f"{'gpu':10s} {'bf16':>7s} {'HBM':>10s} {'NVLink/dir':>10s} {'PCIe/dir':>10s}  FA-2"]
    for g in REGISTRY.values():
        bf16 = f"{g.bf16_flops / 1e12:.0f} TF" if g.bf16_flops else "none"
        link = f"{g.nvlink / GB:.0f} GB/s" if g.nvlink else "-"
        mem.append(f"{g.name:10s} {g.label:16s} {g.capacity // MiB:>7,d} MiB {g.capacity / GB:>6.1f} GB "
                   f"{g.capacity / GiB:>6.1f} GiB {usable(g, reserve) / GB:>6.1f} GB")
        speed.append(f"{g.name:10s} {bf16:>7s} {g.hbm / TB:>5.2f} TB/s {link:>10s} {g.pcie / GB:>5.1f} GB/s  "
                     f"{'yes' if g.flash_attention_2 else 'no'}")
    notes = ["usable = reports - reserve, with",
             "  reserve = " + reserve.describe(),
             "GB = 10^9 bytes, GiB = 2^30 bytes; bf16: dense tensor-core peak (TF = 10^12 FLOP/s), no",
             "  sparsity; links: per direction (NVIDIA quotes NVLink and PCIe summed over both)",
             "sources: reports = nvidia-smi memory.total (modal-labs/modal-client PR #2797; H200: public",
             "  nvidia-smi output); speeds: NVIDIA's A100, H100/H200, L4 and T4 datasheets; PCIe per",
             "  direction: Gen3/4/5 x16 line rate x 128/130 (15.75 / 31.5 / 63 GB/s)"]
    return "\n".join(mem + [""] + speed + notes)
