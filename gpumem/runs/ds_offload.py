"""Real DeepSpeed offload: the configs, the swap folder's life, and what each rank holds where.

ZeRO-Offload (``offload_optimizer: cpu``) keeps the fp32 master, Adam's moments and the fp32
gradients in host memory and runs DeepSpeedCPUAdam there; ZeRO-Infinity (stage 3,
``offload_optimizer`` and ``offload_param`` on ``nvme``) writes them, and the 16-bit parameter
shards, to swap files through DeepSpeed's async I/O op (libaio). DeepSpeed 0.19.8 swaps only
tensors of at least 1 MiB (``MIN_AIO_BYTES``); smaller ones stay in host memory.

The swap folder is made and removed by the parent process (:func:`swap_folder`), around the
rank launch: the launcher kills every rank when one fails, so a rank could never clean up after
itself, but the parent's ``finally`` runs after a failure, a Ctrl-C or a SIGTERM. It is a
:mod:`gpumem.scratch` folder named with the parent's pid, so one a SIGKILLed parent left is swept
by the next run. :func:`swap_files` counts the bytes the run will write, so a folder without that
much room is refused before any rank starts (DeepSpeed's async I/O would abort on a short file).

Holdings are read from DeepSpeed's own structures after the last backward, before the last
step (when gradients and optimizer states both exist), deduplicated by storage, and filed by
role; the role's device (accelerator, host, NVMe) follows the config, because on CPU ranks the
"accelerator" is host memory too. NVMe bytes are the swap files' sizes on disk.
"""

import contextlib
import os
import shutil
from pathlib import Path

import torch

from .. import scratch
from ..errors import RunFailure
from ..memory import bandwidth
from ..memory.models import ModelConfig
from . import dsops
from .ds_engine import ds_config

# Embedding and head of 4096 x 256 = 1,048,576 elements: each rank's bf16 shard is exactly
# 1 MiB, so DeepSpeed swaps those two; the 2 layers' matrices are smaller and stay in RAM.
MODEL = ModelConfig("offload-demo", 2, 256, 4, 2, 704, 4096, teaching=True)

# name -> (ZeRO stage, offload, device), in accounting's vocabulary
CONFIGS = {"zero1": (1, "none", "cpu"), "zero1+cpu": (1, "optimizer", "cpu"),
           "zero2": (2, "none", "cpu"), "zero2+cpu": (2, "optimizer", "cpu"),
           "zero3": (3, "none", "cpu"), "zero3+cpu": (3, "optimizer", "cpu"),
           "zero3+nvme": (3, "optimizer+params", "nvme")}
# DeepSpeed 0.19.8's aio keys (runtime/swap_tensor/constants.py); the ladder's handle uses the same
# block size and queue depth (bandwidth.AIO_BLOCK, bandwidth.AIO_QUEUE_DEPTH)
AIO = {"block_size": bandwidth.AIO_BLOCK, "queue_depth": bandwidth.AIO_QUEUE_DEPTH, "intra_op_parallelism": 1,
       "single_submit": False, "overlap_events": True}
INSTALL_LIBAIO = ("NVMe offload needs libaio for DeepSpeed's async_io op: `sudo apt-get install libaio-dev` "
                  "(Debian/Ubuntu; `dnf install libaio-devel` on Fedora), then `make setup` to build the op")


def nvme_ready() -> tuple[bool, str]:
    """Whether NVMe offload can run here; if not, the one line that says how to fix it."""
    if not dsops.libaio_present():
        return False, INSTALL_LIBAIO
    return True, "libaio present; DeepSpeed's async_io op " + ("built" if dsops.op_built("async_io") else
                                                              "will build on first use")


def offload_config(name: str, swap_dir: str | None, batch_per_rank: int, cfg: ModelConfig = MODEL,
                   world: int = 2, device: str = "cpu") -> dict:
    """The DeepSpeed config of one named configuration (bf16, DeepSpeedCPUAdam when offloading)
    for ranks on ``device``: host buffers are page-locked only for CUDA ranks (they help only a
    GPU's copy engine), whatever GPU the calling process can see, so that CPU ranks on a GPU
    machine, and the chapter's printed config, are the same as on a laptop.

    Stage 3 keeps only the norms whole (persistence threshold d_model + 1, as chapter 02 does)
    and prefetches nothing: DeepSpeed 0.19.8 asserts when it prefetches an NVMe parameter that
    is already being swapped in ("already assigned swap buffer").
    """
    pin = device == "cuda"
    zero, offload, device = CONFIGS[name]              # from here on, where the states go
    extra: dict = {}
    if zero == 3:
        extra.update(stage3_param_persistence_threshold=cfg.d_model + 1, stage3_prefetch_bucket_size=0)
    if offload != "none":
        opt = {"device": device, "pin_memory": pin}
        if device == "nvme":
            opt.update(nvme_path=swap_dir, buffer_count=4)
        extra["offload_optimizer"] = opt
    if offload == "optimizer+params":
        largest = -(-cfg.vocab * cfg.d_model // world)           # the largest shard, elements
        extra["offload_param"] = {"device": device, "nvme_path": swap_dir, "pin_memory": pin,
                                  "buffer_count": 5, "buffer_size": largest, "max_in_cpu": 0}
    out = ds_config(zero, batch_per_rank, extra)
    out["optimizer"]["params"]["torch_adam"] = offload == "none"    # offload: DeepSpeedCPUAdam
    out["bf16"] = {"enabled": True}
    if device == "nvme":
        out["aio"] = dict(AIO)
    return out


SWAP = "swap"          # the scratch kind of the swap folder (gpumem.scratch)
MIN_AIO_BYTES, AIO_ALIGNED_BYTES = 1 << 20, 1024     # runtime/swap_tensor/utils.py 14-15


def swap_files(name: str, cfg: ModelConfig = MODEL, world: int = 2) -> list[int]:
    """The sizes of the swap files one rank writes under configuration ``name``, by DeepSpeed
    0.19.8's rules: a tensor is swapped when it has at least ``max(MIN_AIO_BYTES, block_size)``
    bytes (optimizer_utils.py 180, 231; partitioned_param_swapper.py 100, 141); the fp32 flat
    partition and Adam's two moments are written padded up to 1,024-byte multiples
    (``_io_aligned_numel``), the 16-bit parameter shards likewise, and each fp32 gradient
    fragment cut down to a 1,024-byte multiple (``_adjust_for_misaligned_lengths``; the rest stays
    in RAM). A stage-3 shard is ceil(numel / world) elements; the ranks write the same sizes."""
    zero, offload, device = CONFIGS[name]
    if device != "nvme":
        return []
    with torch.device("meta"):
        from ..memory.llama import Llama
        shards = [-(-p.numel() // world) for p in Llama(cfg).parameters()]
    least = max(MIN_AIO_BYTES, AIO["block_size"])
    unit = AIO_ALIGNED_BYTES * AIO["intra_op_parallelism"]
    up = lambda b: -(-b // unit) * unit                      # noqa: E731  (bytes, padded)
    files = []
    if offload in ("optimizer", "optimizer+params") and 4 * sum(shards) >= least:
        files += [up(4 * sum(shards))] * 3                   # fp32 master, exp_avg, exp_avg_sq
        files += [b for b in (4 * n // unit * unit for n in shards) if b >= least]   # fp32 gradients
    if offload in ("params", "optimizer+params"):
        files += [up(2 * n) for n in shards if 2 * n >= least]                     # 16-bit shards
    return files


def swap_bytes(name: str, folder, cfg: ModelConfig = MODEL, world: int = 2) -> int:
    """Bytes the ``world`` ranks' swap files take in ``folder``: each file rounded up to the
    filesystem's block, plus one block for each folder DeepSpeed makes (zero_stage_3, optimizer,
    param and a rank folder under each of those two, per rank) and the scratch folder itself."""
    block = max(1, os.statvfs(folder).f_frsize)
    files = swap_files(name, cfg, world)
    if not files:
        return 0
    return world * sum(-(-b // block) * block for b in files) + block * (4 + 2 * world)


@contextlib.contextmanager
def swap_folder(base: str | Path | None = None, note=bandwidth.stderr_note):
    """A fresh swap folder under ``base`` (default: the temp dir), made in this (the parent)
    process and removed on exit, also after an exception, Ctrl-C or SIGTERM (SystemExit while
    the folder exists). Swap folders whose owner was killed are swept first, a line each to ``note``."""
    with bandwidth.sigterm_as_exit(), scratch.folder(SWAP, base, note=note) as path:
        yield path


def full_disk(swap: Path, need: int, err: BaseException) -> RunFailure | None:
    """A one-line :class:`RunFailure` if the ranks failed because ``swap``'s filesystem filled up
    under them (what is free plus what they wrote is less than ``need``), else None."""
    try:
        written = sum(f.stat().st_size for f in swap.rglob("*") if f.is_file())
        free = shutil.disk_usage(swap).free
    except OSError:
        return None
    if free + written >= need:
        return None
    return RunFailure(f"the swap folder {swap} ran out of room: {need:,} bytes needed, {written:,} written and "
                      f"{free:,} free (the filesystem filled up during the run); its files are removed", str(err))


def _kind(name: str) -> str:
    if "_gradient_" in name:
        return "grads"
    if name.startswith("exp_avg"):
        return "moments"
    if name.endswith("_param.tensor.swp"):
        return "params"
    return "fp32 master"


def inventory(swap_dir: str | Path) -> dict[int, dict]:
    """Swap files per rank: each file's size and the bytes per kind (params, fp32 master,
    moments, grads), read from the folder DeepSpeed wrote (``zero_stage_3/*/rank<r>/``)."""
    out: dict[int, dict] = {}
    for path in sorted(Path(swap_dir).glob("zero_stage_3/*/rank*/*")):
        rank = int(path.parent.name.removeprefix("rank"))
        row = out.setdefault(rank, {"files": {}, "by_kind": {}, "total": 0})
        size = path.stat().st_size
        row["files"][f"{path.parent.parent.name}/{path.name}"] = size
        row["by_kind"][_kind(path.name)] = row["by_kind"].get(_kind(path.name), 0) + size
        row["total"] += size
    return out


def _bytes(tensors, seen: set) -> int:
    """Resident bytes of ``tensors``, each storage counted once across calls sharing ``seen``."""
    total = 0
    for t in tensors:
        if not torch.is_tensor(t):
            continue
        st = t.untyped_storage()
        if st.nbytes() == 0 or st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        total += st.nbytes()
    return total


def _flat(x) -> list:
    if torch.is_tensor(x):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    return []


def held_by_role(engine, net, stage: int) -> dict[str, int]:
    """Resident bytes DeepSpeed holds for this rank, by role: ``params`` (16-bit weights or shards),
    ``grads16`` and ``grads32`` (16-bit gradient partitions; fp32 ones beside the optimizer),
    ``master`` (fp32 copy), ``moments`` (Adam's m and v), ``buffers`` (offload staging and swap
    buffers). Call after backward, before step."""
    opt, seen = engine.optimizer, set()
    moments = _bytes([t for s in opt.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()], seen)
    if stage == 3:
        params = _bytes([p.ds_tensor for p in net.parameters()] + [p.data for p in opt.persistent_parameters], seen)
        master = _bytes(opt.fp32_partitioned_groups_flat, seen)
        grads16 = _bytes([opt.grad_partitions_flat_buffer], seen)
        swapper = getattr(opt, "optimizer_swapper", None)
        unswapped = [g for info in getattr(swapper, "swap_params_info", {}).values()   # < 1 MiB: kept in RAM
                     for g in info.unswapped_gradients.values()]
        grads32 = _bytes([t.grad for t in opt.fp32_partitioned_groups_flat] + unswapped, seen)
        pswap = next((p.nvme_swapper for p in net.parameters() if getattr(p, "nvme_swapper", None)), None)
        buffers = _bytes(_flat(getattr(pswap, "buffers", None))
                         + _flat(getattr(getattr(swapper, "swap_buffer_manager", None), "buffers", None)), seen)
    else:
        params = _bytes(opt.bit16_groups_flat, seen)
        master = _bytes(opt.single_partition_of_fp32_groups, seen)
        grads16 = _bytes(_flat(getattr(opt, "averaged_gradients", None)), seen)
        grads32 = _bytes([t.grad for t in opt.single_partition_of_fp32_groups], seen)
        buffers = _bytes([getattr(opt, n, None) for n in ("temp_grad_buffer_for_cpu_offload",
                                                          "temp_grad_buffer_for_gpu_offload")], seen)
    return {"params": params, "grads16": grads16, "grads32": grads32, "master": master, "moments": moments,
            "buffers": buffers}


def describe(config: dict) -> tuple[int, str, str]:
    """A DeepSpeed config's (ZeRO stage, offload, device): ``offload_optimizer`` and ``offload_param``
    read independently, so offload is ``none``, ``optimizer``, ``params`` (parameter-only offload at
    stage 3, which accounting has no row for) or ``optimizer+params``; device ``nvme`` if either
    target is on the drive."""
    z = config.get("zero_optimization", {})
    opt = (z.get("offload_optimizer") or {}).get("device", "none")
    par = (z.get("offload_param") or {}).get("device", "none")
    offload = {(False, False): "none", (True, False): "optimizer", (False, True): "params",
               (True, True): "optimizer+params"}[(opt != "none", par != "none")]
    return int(z.get("stage", 0)), offload, "nvme" if "nvme" in (opt, par) else "cpu"


def unreduced_grads(net) -> int:
    """Bytes of the gradients backward left in ``param.grad`` tensors that own their storage (not
    views into DeepSpeed's reduce buckets or partitions): read as the end-of-backward reduction
    starts, it is ZeRO-1's whole 16-bit gradient, and about nothing at ZeRO-2 and 3, whose hooks
    move each gradient into a bucket as soon as it exists."""
    total, seen = 0, set()
    for p in net.parameters():
        g = p.grad
        if g is None or g.untyped_storage().data_ptr() in seen:
            continue
        if g.untyped_storage().nbytes() <= g.numel() * g.element_size():
            seen.add(g.untyped_storage().data_ptr())
            total += g.untyped_storage().nbytes()
    return total


def placement(name_or_config) -> dict[str, str]:
    """The device each role of :func:`held_by_role` lives on under a configuration (a name in
    :data:`CONFIGS` or a DeepSpeed config), as DeepSpeed 0.19.8 allocates it on a GPU machine:
    the optimizer side on the host when offloaded, the parameters there when offloaded, and
    ZeRO-3's 16-bit gradient partition on the host whenever the optimizer is offloaded
    (``stage3.py`` 333, 791: it lives on ``self.device``, the CPU under offload)."""
    zero, offload, _ = CONFIGS[name_or_config] if isinstance(name_or_config, str) else describe(name_or_config)
    opt = "host" if offload in ("optimizer", "optimizer+params") else "accelerator"
    return {"params": "host" if offload in ("params", "optimizer+params") else "accelerator",
            "grads16": "host" if zero == 3 and opt == "host" else "accelerator",
            "grads_unreduced": "accelerator", "grads32": opt, "master": opt, "moments": opt, "buffers": "host"}


def by_device(roles: dict[str, int], name_or_config, nvme_bytes: int = 0) -> dict[str, int]:
    """File role bytes under the device :func:`placement` puts them on: accelerator, host, nvme.
    The accelerator's gradients count at their largest: backward's whole gradient before the
    reduction (``grads_unreduced``, ZeRO-1) or the partition after it, whichever is more."""
    where = placement(name_or_config)
    out = {"accelerator": 0, "host": 0, "nvme": nvme_bytes}
    for role, b in roles.items():
        if role != "grads_unreduced":
            out[where.get(role, "accelerator")] += b
    on_acc = roles.get("grads16", 0) if where["grads16"] == "accelerator" else 0
    out["accelerator"] += max(0, roles.get("grads_unreduced", 0) - on_acc)
    return out
