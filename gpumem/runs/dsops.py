"""DeepSpeed's CPU ops for the course: one JIT cache inside the repo, ready before any notebook.

DeepSpeed compiles its C++ ops the first time they load (``deepspeed_shm_comm`` at every CPU
``init_distributed``, ``cpu_adam`` for ZeRO-Offload, ``fused_adam`` for an Adam config without
``torch_adam``, ``async_io`` for NVMe). ``prepare()`` does that once, into
``<repo>/.cache/torch_extensions``, so no notebook waits on a compiler. (Left out, ``fused_adam``
was built by chapter 02's run of the note's config: that cell took 54 s instead of 11 on 2 cores.)

A JIT build that was killed leaves ``<cache>/<op>/lock`` behind, and the next load waits on it
forever. ``clear_stale_locks()`` removes a lock that no live process is building under.

``async_io`` is 12 translation units, and parsing ``torch/extension.h`` is most of each one's
compile (one unit: 38.6 s, 13.7 s with the header precompiled, on a busy machine). ``prepare()``
compiles that header once for an op of 4 or more units, with the op's own flags, and each unit
includes the precompiled copy (:func:`precompiled_header`). Measured on 2 idle cores, 2026-12-07:
async_io 175 s before, 132 s after; the four ops 283 s before, 238 s after.

Run ``python -m gpumem.runs.dsops prepare`` (``make lab`` and ``make test`` do).
"""

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Course op -> (DeepSpeed builder class name, what it is for)
OPS = {
    "deepspeed_shm_comm": ("ShareMemCommBuilder", "built by every CPU init_distributed"),
    "cpu_adam": ("CPUAdamBuilder", "ZeRO-Offload's optimizer on the CPU"),
    "fused_adam": ("FusedAdamBuilder", "DeepSpeed's Adam where a config leaves out torch_adam (chapter 02's note)"),
    "async_io": ("AsyncIOBuilder", "NVMe offload (needs Debian's libaio-dev)"),
}
STALE_AFTER_S = 5.0
PCH_MIN_UNITS = 4      # fewer units than this: the header's own compile (about 1.5 units) saves nothing
PCH_HEADER = "gpumem_torch_pch.h"


def repo_root() -> Path | None:
    """The course checkout gpumem is installed from (editable install), if any."""
    root = Path(__file__).resolve().parents[2]   # gpumem/runs/dsops.py -> the checkout
    return root if (root / "pyproject.toml").exists() and (root / "notebooks").exists() else None


def cache_dir() -> Path:
    """The JIT cache in use: ``$TORCH_EXTENSIONS_DIR``, else the repo's, else torch's default."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    root = repo_root()
    if root is not None:
        return root / ".cache" / "torch_extensions"
    return Path.home() / ".cache" / "torch_extensions"


def use_course_cache() -> Path:
    """Point torch's JIT at the course cache (call before DeepSpeed loads an op)."""
    path = cache_dir()
    os.environ["TORCH_EXTENSIONS_DIR"] = str(path)
    return path


def libaio_present() -> bool:
    """Whether libaio's headers are installed (DeepSpeed's async_io op for NVMe offload needs them)."""
    return any(Path(p).exists() for p in ("/usr/include/libaio.h", "/usr/local/include/libaio.h"))


def _op_dirs(name: str, root: Path) -> list[Path]:
    # torch puts ops in <root>/<name> or, on some versions, <root>/<pyXY_cpu>/<name>
    return [d for d in [root / name, *root.glob(f"*/{name}")] if d.is_dir()]


def op_built(name: str, root: Path | None = None) -> bool:
    """True when a compiled ``<name>.so`` is in the cache (loading it then takes a second)."""
    root = root or cache_dir()
    return any((d / f"{name}.so").exists() for d in _op_dirs(name, root))


def _busy_dirs() -> set[Path]:
    """Working directories of live processes (a compiler or ninja works inside the op dir)."""
    busy = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            busy.add(Path(os.readlink(proc / "cwd")))
        except OSError:
            continue
    return busy


def clear_stale_locks(root: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove lock files older than a few seconds in op dirs no live process works in."""
    root = root or cache_dir()
    if not root.exists():
        return []
    now = time.time() if now is None else now
    busy = _busy_dirs()
    removed = []
    for lock in root.glob("**/lock"):
        op_dir = lock.parent
        in_use = any(b == op_dir or op_dir in b.parents for b in busy)
        if not in_use and now - lock.stat().st_mtime > STALE_AFTER_S:
            lock.unlink()
            removed.append(lock)
    return removed


def wanted_ops() -> list[str]:
    """The ops to build on this machine: all of them, except async_io when libaio is missing."""
    return [n for n in OPS if n != "async_io" or libaio_present()]


def _cpu_or_cuda_accelerator(verbose: bool):
    """DeepSpeed's accelerator, imported late (it is slow). Without CUDA, DeepSpeed logs "[WARNING]
    Setting accelerator to CPU ... we were unable to detect it", which a newcomer reads as a fault;
    set-up says what happens in a line of its own instead and keeps DeepSpeed's logging quiet for
    the import (only the import: errors while building still print)."""
    import logging

    import torch
    if verbose and not torch.cuda.is_available():
        print("no CUDA device here: DeepSpeed uses its CPU accelerator (expected on a laptop)", flush=True)
    logging.disable(logging.WARNING)
    try:
        from deepspeed.accelerator import get_accelerator
        return get_accelerator()
    finally:
        logging.disable(logging.NOTSET)


def host_builder(name: str):
    """DeepSpeed's builder of the course op ``name`` as CPU ranks load it: the CPU accelerator's,
    whatever accelerator this process has. On a GPU machine DeepSpeed picks CUDA, which has no
    ``ShareMemCommBuilder`` (``create_op_builder`` returns None) and builds ``async_io`` with CUDA's
    flags: one flavour loaded after the other rebuilds the op in the shared cache."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    return CPU_Accelerator().create_op_builder(OPS[name][0])


def add_precompiled_header(build_dir: Path, header: str = "#include <torch/extension.h>\n") -> dict | None:
    """Compile ``header`` once with the flags of ``build_dir/build.ninja`` (as torch's JIT wrote it),
    and return the environment in which each unit includes it first: ``PATH`` with a folder in front
    whose compiler, named as the ninja file names it (``c++``), adds ``-include`` for a compile and
    runs the real one. The ninja file is left as written: ninja keeps a hash of each command, so a
    changed flag would rebuild the op at its next load. GCC takes the ``.gch`` beside the header
    (about 1 GB for torch's: :func:`precompiled_header` deletes the folder). None where the build has
    fewer than :data:`PCH_MIN_UNITS` units, names its compiler by a path, or the header did not
    compile: the build then runs as written."""
    lines = (build_dir / "build.ninja").read_text().splitlines()
    units = sum(line.startswith("build ") and ": compile " in line for line in lines)
    var = dict(line.split(" = ", 1) for line in lines if " = " in line and not line[:1].isspace())
    cxx = shlex.split(var.get("cxx", ""))
    real = shutil.which(cxx[0]) if len(cxx) == 1 and "/" not in cxx[0] else None
    if units < PCH_MIN_UNITS or real is None or "cflags" not in var:
        return None
    folder = build_dir / "gpumem_pch"
    folder.mkdir(exist_ok=True)
    (folder / PCH_HEADER).write_text(header)
    done = subprocess.run([real, *shlex.split(var["cflags"]), "-x", "c++-header", PCH_HEADER,
                           "-o", f"{PCH_HEADER}.gch"], cwd=folder, capture_output=True)
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    wrapper = folder / cxx[0]
    here = shlex.quote(str(build_dir.resolve()))      # another op built meanwhile runs the real one
    wrapper.write_text("#!/bin/sh\n# gpumem: the precompiled torch header first, for this op's compiles only\n"
                       f'if [ "$(pwd -P)" = {here} ]; then case " $* " in *" -c "*) exec {shlex.quote(real)} '
                       f'-include {shlex.quote(str(folder / PCH_HEADER))} "$@";; esac; fi\n'
                       f'exec {shlex.quote(real)} "$@"\n')
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}


@contextlib.contextmanager
def precompiled_header():
    """While it is open, torch's JIT builds of 4 or more units use :func:`add_precompiled_header`
    (it wraps ``torch.utils.cpp_extension._run_ninja_build``, private in torch 2.13: tests/test_dsops.py
    checks the name, the header taken on four small units, and that the cache's async_io has nothing
    left to build, so a rank's load rebuilds nothing)."""
    from torch.utils import cpp_extension
    run = cpp_extension._run_ninja_build

    def with_header(build_directory, *args, **kwargs):
        env = add_precompiled_header(Path(build_directory))
        if env is None:
            return run(build_directory, *args, **kwargs)
        saved = os.environ.get("PATH")
        os.environ["PATH"] = env["PATH"]            # ninja runs with a copy of this process's environment
        try:
            return run(build_directory, *args, **kwargs)
        finally:
            os.environ["PATH"] = saved if saved is not None else ""
            shutil.rmtree(Path(build_directory) / "gpumem_pch", ignore_errors=True)
    cpp_extension._run_ninja_build = with_header
    try:
        yield
    finally:
        cpp_extension._run_ninja_build = run


def prepare(verbose: bool = True) -> dict[str, float]:
    """Build (or load) every op the course uses into the course cache; seconds per op."""
    root = use_course_cache()
    for lock in clear_stale_locks(root):
        print(f"removed a stale JIT lock left by a killed build: {lock}", flush=True)
    if all(op_built(name, root) for name in wanted_ops()):
        if verbose:
            print(f"DeepSpeed ops ready: {', '.join(wanted_ops())}", flush=True)
        return {name: 0.0 for name in wanted_ops()}
    _cpu_or_cuda_accelerator(verbose)            # DeepSpeed imported quietly; the ops are the CPU ranks'
    times: dict[str, float] = {}
    with precompiled_header():
        for name in wanted_ops():
            if verbose:
                state = "ready" if op_built(name, root) else "building (once; a minute or two)"
                print(f"DeepSpeed op {name:20s} {state} — {OPS[name][1]}", flush=True)
            start = time.perf_counter()
            host_builder(name).load(verbose=False)
            times[name] = time.perf_counter() - start
    return times


def main(argv: list[str]) -> int:
    """``python -m gpumem.runs.dsops prepare``: build the ops, print their times; returns exit status."""
    if argv[:1] != ["prepare"]:
        print("usage: python -m gpumem.runs.dsops prepare", file=sys.stderr)
        return 2
    times = prepare()
    print("DeepSpeed ops ready in", cache_dir(), {k: round(v, 1) for k, v in times.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
