"""The DeepSpeed op cache: stale JIT locks are cleared, live ones are left alone; set-up builds
every op a CPU engine loads."""

import json
import os
import subprocess
import sys
import time

from conftest import ROOT
from gpumem.runs import dsops


def old_lock(root, op_name):
    """A JIT lock file in ``root/op_name``, last touched a minute ago."""
    op = root / op_name
    op.mkdir()
    lock = op / "lock"
    lock.touch()
    old = time.time() - 60
    os.utime(lock, (old, old))
    return lock


def test_stale_lock_is_removed(tmp_path):
    lock = old_lock(tmp_path, "cpu_adam")
    assert dsops.clear_stale_locks(tmp_path) == [lock]
    assert not lock.exists()


def test_lock_of_a_running_build_is_kept(tmp_path):
    lock = old_lock(tmp_path, "async_io")
    builder = subprocess.Popen(["sleep", "30"], cwd=lock.parent)   # a compiler working in the op dir
    try:
        assert dsops.clear_stale_locks(tmp_path) == []
        assert lock.exists()
    finally:
        builder.kill()
        builder.wait()


def test_fresh_lock_is_kept(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "lock").touch()
    assert dsops.clear_stale_locks(tmp_path) == []


def test_ops_are_built_in_the_course_cache():
    # make test runs `python -m gpumem.runs.dsops prepare` first
    for name in dsops.wanted_ops():
        assert dsops.op_built(name), f"{name} not built in {dsops.cache_dir()}"


def test_the_cache_is_inside_the_checkout(monkeypatch):
    """Without TORCH_EXTENSIONS_DIR (a notebook, a plain `python -m gpumem run`), ops are found in
    the checkout's .cache, where `make lab` built them, not in ~/.cache."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert dsops.repo_root() == ROOT
    assert dsops.cache_dir() == ROOT / ".cache" / "torch_extensions"


def test_set_up_says_cpu_in_its_own_words_not_deepspeeds_warning():
    """Issue 24 (9): set-up printed DeepSpeed's "[WARNING] Setting accelerator to CPU ... unable to
    detect it"; now one line of the course's own, and DeepSpeed's logging is back on afterwards."""
    import subprocess
    import sys
    code = ("import logging; from gpumem.runs import dsops\n"
            "a = dsops._cpu_or_cuda_accelerator(True)\n"
            "print(a._name, logging.getLogger('DeepSpeed').isEnabledFor(logging.WARNING))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in __import__("os").environ.items() if k != "DS_ACCELERATOR"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Setting accelerator to CPU" not in out and "[WARNING]" not in out, out
    assert "no CUDA device here: DeepSpeed uses its CPU accelerator" in out and "cpu True" in out, out


_ENGINE_OPS = """
import json, logging, os
from gpumem.runs import launch, training
from gpumem.runs.ds_engine import ds_config
launch.init("cpu", deepspeed=True)
logging.disable(logging.WARNING)
import deepspeed
net = training.build("tiny")
config = ds_config(2, 1)
config["optimizer"]["params"].pop("torch_adam")            # as the note's config (chapter 02)
deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
root = os.environ["TORCH_EXTENSIONS_DIR"]
print(json.dumps(sorted({line.split()[-1].rsplit("/", 1)[-1][:-3] for line in open("/proc/self/maps")
                         if root in line and line.rstrip().endswith(".so")})))
"""


def test_prepare_builds_every_op_a_cpu_engine_loads():
    """Every op this process maps from the course cache, after DeepSpeed's engine started on a CPU
    rank with an Adam config that leaves out ``torch_adam`` (chapter 02 runs the note's config so),
    is one that set-up builds. Left out, ``fused_adam`` was built by chapter 02's cell: 54 s
    instead of 11 on 2 cores (2026-12-06)."""
    from gpumem.runs import launch
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(launch.free_port()),
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "DS_ACCELERATOR": "cpu",
           "TORCH_EXTENSIONS_DIR": str(dsops.cache_dir())}
    proc = subprocess.run([sys.executable, "-c", _ENGINE_OPS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"fused_adam", "deepspeed_shm_comm"} <= set(loaded)          # what the engine maps today
    assert set(loaded) <= set(dsops.OPS), sorted(set(loaded) - set(dsops.OPS))


def _ninja_dir(tmp_path, units: int, cxx: str = "c++"):
    """A build folder as torch's JIT writes one (``cxx``, ``cflags``, a compile rule, one build line
    per unit, a link): each unit includes ``slow.h`` first, as DeepSpeed's include torch's header."""
    d = tmp_path / "op"
    d.mkdir()
    (d / "slow.h").write_text("#pragma once\ninline int answer() { return 42; }\n")
    for k in range(units):
        (d / f"u{k}.cpp").write_text(f'#include "slow.h"\nint f{k}() {{ return answer() + {k}; }}\n')
    lines = [f"cxx = {cxx}", f"cflags = -I{d} -O0 -fPIC -DOP_NAME=op", "",
             "rule compile", "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out", "  depfile = $out.d",
             "  deps = gcc", "", "rule link", "  command = $cxx $in -shared -o $out", ""]
    lines += [f"build u{k}.o: compile {d}/u{k}.cpp" for k in range(units)]
    lines += ["", "build op.so: link " + " ".join(f"u{k}.o" for k in range(units)), "", "default op.so", ""]
    (d / "build.ninja").write_text("\n".join(lines))
    return d


def test_a_build_of_four_units_includes_the_header_compiled_once(tmp_path):
    """The header is compiled with the ninja file's own flags; each compile of this op (and of no
    other folder) includes it first, and GCC takes the ``.gch`` (``-H`` marks a precompiled header
    with "!"); the ninja file is unchanged, so the next ninja run has nothing to do."""
    d = _ninja_dir(tmp_path, 4)
    written = (d / "build.ninja").read_text()
    env = dsops.add_precompiled_header(d, '#include "slow.h"\n')
    assert env is not None and (d / "gpumem_pch" / f"{dsops.PCH_HEADER}.gch").exists()
    assert (d / "build.ninja").read_text() == written
    assert subprocess.run(["ninja"], cwd=d, env=env, capture_output=True).returncode == 0
    assert (d / "op.so").exists()
    cflags = written.splitlines()[1].split(" = ", 1)[1].split()
    used = subprocess.run(["c++", *cflags, "-H", "-c", str(d / "u0.cpp"), "-o", str(tmp_path / "x.o")],
                          cwd=d, env=env, capture_output=True, text=True)
    assert used.returncode == 0 and used.stderr.splitlines()[0].startswith("! ") \
        and used.stderr.splitlines()[0].endswith(".gch"), used.stderr[:300]
    elsewhere = subprocess.run(["c++", *cflags, "-H", "-c", str(d / "u0.cpp"), "-o", str(tmp_path / "x.o")],
                               cwd=tmp_path, env=env, capture_output=True, text=True)
    assert elsewhere.returncode == 0 and ".gch" not in elsewhere.stderr          # another op's folder
    again = subprocess.run(["ninja", "-n", "-d", "explain"], cwd=d, capture_output=True, text=True)
    assert "no work to do" in again.stdout, again.stdout + again.stderr


def test_small_builds_and_a_compiler_named_by_path_run_as_written(tmp_path):
    for sub in ("a", "b", "c"):
        (tmp_path / sub).mkdir()
    assert dsops.add_precompiled_header(_ninja_dir(tmp_path / "a", 3)) is None
    assert dsops.add_precompiled_header(_ninja_dir(tmp_path / "b", 4, "/usr/bin/c++")) is None
    bad = _ninja_dir(tmp_path / "c", 4)
    assert dsops.add_precompiled_header(bad, "#include <no_such_header.h>\n") is None
    assert not (bad / "gpumem_pch").exists()


def test_async_io_in_the_cache_has_nothing_left_to_build():
    """``torch.utils.cpp_extension._run_ninja_build`` (private, torch 2.13) is what set-up wraps; in
    the course cache set-up built async_io with the header, and ninja has nothing left to build
    there (a rank's load runs it: a changed command would rebuild the op), nor is the header left."""
    from torch.utils import cpp_extension
    assert callable(cpp_extension._run_ninja_build)
    if "async_io" not in dsops.wanted_ops():
        return                                            # no libaio here: async_io is not built
    op = next(d for d in dsops._op_dirs("async_io", dsops.cache_dir()) if (d / "async_io.so").exists())
    again = subprocess.run(["ninja", "-n", "-d", "explain"], cwd=op, capture_output=True, text=True)
    assert "no work to do" in again.stdout and not (op / "gpumem_pch").exists(), again.stdout + again.stderr
