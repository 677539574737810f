"""The DeepSpeed op cache: stale JIT locks are cleared, live ones are left alone."""

import os
import subprocess
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
