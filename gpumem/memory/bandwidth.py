"""The bandwidth ladder, measured on this machine: what each link an offloaded state crosses moves.

Offloading is only as fast as the slowest link a state crosses, so the chapter measures the
rungs instead of quoting them: a RAM copy (host memory), a write and a read of a real file with
the page cache defeated (DeepSpeed's async I/O handle when its ``async_io`` op is built, else
``O_DIRECT``, which bypasses the cache on Linux; the read could otherwise come from RAM), and with
CUDA the PCIe transfers both ways from pageable and from pinned host memory, and a copy inside
the GPU. Each rung is the best of ``repeats`` timed runs; bytes/s counts the bytes moved once
(a copy of n bytes is n bytes, not 2n). :func:`cpu_adam_rate` times one rank's CPU optimizer.

Caveats: the disk write is timed without ``fsync`` (``O_DIRECT`` hands each block to the device,
but a drive's own cache may still hold it); on a virtual machine the hypervisor may cache the
virtual disk, so its figure says little about a physical drive. The async I/O handle uses the
course's DeepSpeed ``aio`` block size and queue depth (:data:`AIO_BLOCK`, :data:`AIO_QUEUE_DEPTH`).
PCIe datasheet figures are line rate, an upper bound: pinned copies reach about 25 GB/s at Gen4
x16 and about 50 at Gen5, and GPUs behind one PCIe switch share its uplink (``nvidia-smi topo -m``).
"""

import contextlib
import datetime
import mmap
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from .. import scratch
from ..errors import RunFailure, Stopped, UsageError
from ..units import MiB

RUNGS = ("ram_copy", "disk_write", "disk_read", "h2d_pageable", "h2d_pinned", "d2h_pageable",
         "d2h_pinned", "d2d")
ABOUT = {"ram_copy": "host RAM to host RAM (torch copy_)",
         "disk_write": "file write, page cache bypassed", "disk_read": "file read, page cache bypassed",
         "h2d_pageable": "host to GPU, pageable memory", "h2d_pinned": "host to GPU, pinned memory",
         "d2h_pageable": "GPU to host, pageable memory", "d2h_pinned": "GPU to host, pinned memory",
         "d2d": "GPU to GPU memory (HBM copy)"}


LADDER = "ladder"      # the scratch kind of the disk rung's folder (gpumem.scratch)


def stderr_note(line: str) -> None:
    """Print one note line on stderr (e.g. a swept folder a killed run left)."""
    print(f"gpumem: note: {line}", file=sys.stderr)


def writable_folder(path, option: str = "--nvme-path") -> Path:
    """``path`` as a Path if it is an existing folder this process can create files in (a probe
    file is made and removed), else :class:`UsageError` naming it; ``None``: the temp folder."""
    if path is None:
        path, option = tempfile.gettempdir(), "temp folder"
    text = os.fspath(path)
    if not str(text).strip():
        raise UsageError(f"{option} {text!r} is empty; accepted: an existing folder on the drive to test")
    folder = Path(text)
    try:
        is_dir, exists = folder.is_dir(), folder.exists()
    except OSError as err:   # a name the OS refuses: too long, a symbolic-link loop
        raise UsageError(f"{option} {text[:60]!r}: {err.strerror}; accepted: an existing folder on the drive "
                         "to test") from None
    if not is_dir:
        what = "not a folder" if exists else "no such folder"
        raise UsageError(f"{option} {text}: {what}; accepted: an existing folder on the drive to test")
    try:
        fd, probe = tempfile.mkstemp(prefix=".gpumem-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UsageError(f"{option} {text}: cannot create files there ({err.strerror}); accepted: a folder "
                         "this user can write to") from None
    return folder


def check_room(folder, need: int, what: str, option: str = "--nvme-path") -> None:
    """:class:`UsageError` naming ``folder``, the bytes needed and the bytes free when its
    filesystem has fewer than ``need`` bytes free for this user."""
    free = shutil.disk_usage(folder).free
    if free < need:
        raise UsageError(f"{option} {folder}: {need:,} bytes needed ({what}), {free:,} free; accepted: "
                         "a folder (--nvme-path) on a filesystem with that much room")


@contextlib.contextmanager
def sigterm_as_exit():
    """While inside, SIGTERM raises :class:`~gpumem.errors.Stopped` (main thread only), so ``finally``
    blocks and ``with`` exits remove scratch files; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Stopped("run stopped by SIGTERM: its test file removed", signum)
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _best(fn, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls of ``fn`` (seconds); ``fn`` synchronises itself."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _aligned(nbytes: int) -> tuple[mmap.mmap, torch.Tensor]:
    """A page-aligned host buffer (anonymous mmap) and a uint8 tensor over it (O_DIRECT needs it)."""
    buf = mmap.mmap(-1, nbytes)
    return buf, torch.frombuffer(buf, dtype=torch.uint8)


def _quiet_deepspeed():
    """Import DeepSpeed without its start-up chatter (CPU accelerator where CUDA is absent)."""
    import logging
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


AIO_BLOCK, AIO_QUEUE_DEPTH = 1 << 20, 8      # the same as the course's DeepSpeed aio config


def aio_handle(libaio_present: bool = True):
    """DeepSpeed's async I/O handle, or None when its ``async_io`` op cannot load (no libaio:
    pass ``dsops.libaio_present()``, which callers above the engine layer may check)."""
    if not libaio_present:
        return None
    try:
        _quiet_deepspeed()
        # the CPU ranks' flavour (gpumem.runs.dsops.host_builder), also where DeepSpeed picked CUDA
        from deepspeed.ops.op_builder.cpu import AsyncIOBuilder
        return AsyncIOBuilder().load(verbose=False).aio_handle(AIO_BLOCK, AIO_QUEUE_DEPTH, False, True, 1)
    except Exception:   # an op that fails to build or load: fall back to O_DIRECT
        return None


def disk(folder: str | Path | None, nbytes: int = 256 * MiB, repeats: int = 3, use_aio: bool = True,
         note=stderr_note) -> dict:
    """Write then read one file of ``nbytes`` in ``folder`` with the page cache bypassed. The file
    lives in a scratch folder removed on every path (SIGTERM too; one a killed ladder left is
    swept first, each sweep line to ``note``); a folder that cannot be written or lacks room is
    refused with :class:`UsageError` before writing. Returns both rungs and the method used."""
    nbytes = -(-nbytes // (1 << 20)) * (1 << 20)          # whole MiB: O_DIRECT needs aligned sizes
    option = "--nvme-path" if folder is not None else "temp folder"
    folder = writable_folder(folder)
    with sigterm_as_exit(), scratch.folder(LADDER, folder, note=note) as where:
        check_room(folder, nbytes, "the bandwidth ladder's test file", option)
        return _disk_rungs(where / "rung.bin", nbytes, repeats, use_aio)


def _disk_rungs(path: Path, nbytes: int, repeats: int, use_aio: bool) -> dict:
    handle = aio_handle(use_aio)                   # use_aio=False: O_DIRECT (no libaio needed)
    buf, tensor = _aligned(nbytes)
    tensor.fill_(7)
    try:
        if handle is not None:
            how = "DeepSpeed async_io (libaio, O_DIRECT)"
            write = lambda: handle.sync_pwrite(tensor, str(path))   # noqa: E731
            read = lambda: handle.sync_pread(tensor, str(path))     # noqa: E731
        else:
            how = "O_DIRECT (os.pwritev / os.preadv)"

            def write():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
                try:
                    os.pwritev(fd, [buf], 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)

            def read():
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                try:
                    os.preadv(fd, [buf], 0)
                finally:
                    os.close(fd)

        def whole_write():      # a short write (full disk) would make the aio read abort the process
            try:
                write()
            except OSError as err:
                raise RunFailure(f"the bandwidth ladder could not write {path}: {err.strerror}") from None
            size = path.stat().st_size
            if size != nbytes:
                raise RunFailure(f"the bandwidth ladder wrote {size:,} of {nbytes:,} bytes to {path} (the filesystem "
                                 f"filled up: {shutil.disk_usage(path.parent).free:,} bytes free); its file is removed")
        w = _best(whole_write, repeats)
        tensor.zero_()
        r = _best(read, repeats)
        intact = bool((tensor[:: 1 << 16] == 7).all())    # the read really brought the bytes back
    finally:
        path.unlink(missing_ok=True)
        del tensor
        buf.close()
    return {"disk_write": {"bytes": nbytes, "seconds": w, "bytes_per_s": nbytes / w, "how": how},
            "disk_read": {"bytes": nbytes, "seconds": r, "bytes_per_s": nbytes / r, "how": how,
                          "intact": intact}}


def ram_copy(nbytes: int = 256 * MiB, repeats: int = 3) -> dict:
    """One host-to-host copy of ``nbytes`` (torch ``copy_``)."""
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    s = _best(lambda: dst.copy_(src), repeats)
    return {"bytes": nbytes, "seconds": s, "bytes_per_s": nbytes / s, "how": ABOUT["ram_copy"]}


def cuda_rungs(nbytes: int = 256 * MiB, repeats: int = 5) -> dict:
    """PCIe both ways from pageable and pinned memory, and a copy inside the GPU (needs CUDA)."""
    dev = torch.device("cuda")
    gpu, gpu2 = torch.empty(nbytes, dtype=torch.uint8, device=dev), torch.empty(nbytes, dtype=torch.uint8, device=dev)
    hosts = {"pageable": torch.ones(nbytes, dtype=torch.uint8),
             "pinned": torch.ones(nbytes, dtype=torch.uint8).pin_memory()}

    def timed(copy):
        def go():
            copy()
            torch.cuda.synchronize()
        go()                                             # warm-up (first touch, driver set-up)
        return _best(go, repeats)
    out = {}
    for kind, host in hosts.items():
        out[f"h2d_{kind}"] = timed(lambda: gpu.copy_(host, non_blocking=kind == "pinned"))
        out[f"d2h_{kind}"] = timed(lambda: host.copy_(gpu, non_blocking=kind == "pinned"))
    out["d2d"] = timed(lambda: gpu2.copy_(gpu))
    return {k: {"bytes": nbytes, "seconds": s, "bytes_per_s": nbytes / s, "how": ABOUT[k]} for k, s in out.items()}


def cpu_adam_rate(n_params: int = 4_000_000, repeats: int = 3, threads: int = 1) -> dict:
    """Parameters per second one thread's CPU Adam updates: DeepSpeedCPUAdam when its op loads,
    else torch's AdamW (``how`` says which)."""
    p = torch.nn.Parameter(torch.randn(n_params))
    p.grad = torch.randn(n_params)
    try:
        _quiet_deepspeed()
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        opt, how = DeepSpeedCPUAdam([p], lr=1e-3), "DeepSpeedCPUAdam"
    except Exception:
        opt, how = torch.optim.AdamW([p], lr=1e-3), "torch.optim.AdamW (cpu_adam op unavailable)"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)                       # as one rank runs it (the launcher sets 1)
    try:
        opt.step()                                       # first step allocates the moments
        s = _best(opt.step, repeats)
    finally:
        torch.set_num_threads(before)
    return {"params": n_params, "seconds": s, "params_per_s": n_params / s, "how": how, "threads": threads}


def ladder(folder: str | Path | None = None, nbytes: int = 256 * MiB, repeats: int = 3,
           progress: bool = True, use_aio: bool = True, note=stderr_note) -> dict:
    """Every rung this machine has (CUDA ones only with a GPU), with a progress bar; bytes/s per
    rung, how each was measured, the machine and the date."""
    from tqdm.auto import tqdm
    steps = ["ram_copy", "disk", "cpu_adam"] + (["cuda"] if torch.cuda.is_available() else [])
    rungs, adam = {}, None
    quiet = not progress or bool(os.environ.get("TQDM_DISABLE"))
    for step in tqdm(steps, desc="bandwidth ladder", unit="rung", leave=False, disable=quiet):
        if step == "ram_copy":
            rungs["ram_copy"] = ram_copy(nbytes, repeats)
        elif step == "disk":
            rungs.update(disk(folder, nbytes, repeats, use_aio, note))
        elif step == "cpu_adam":
            adam = cpu_adam_rate()
        else:
            rungs.update(cuda_rungs(nbytes))
    machine = (f"{platform.node() or 'this machine'} ({os.cpu_count()} CPUs"
               + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "") + ")")
    return {"rungs": {k: rungs[k] for k in RUNGS if k in rungs}, "cpu_adam": adam, "machine": machine,
            "date": datetime.date.today().isoformat(), "cuda": torch.cuda.is_available()}


def rates(result: dict) -> dict[str, float]:
    """Rung name -> bytes/s from a :func:`ladder` result (the shape ``offload_cost`` reads)."""
    return {k: v["bytes_per_s"] for k, v in result["rungs"].items()}
