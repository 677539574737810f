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
