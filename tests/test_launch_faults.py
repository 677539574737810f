"""Faults injected into the rank launcher (gpumem.runs.launch): the launcher killed outright or
sent SIGTERM, a rank stopped, killed, ended without a result or raising. Each leaves no process
and no file behind and is reported in one line naming the rank. Plain gloo ranks running tiny
functions (gpumem.runs.examples): the launcher's mechanism is what is tested, not DeepSpeed."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest

from conftest import ROOT
from gpumem.runs import launch
from gpumem.errors import RunFailure

EX = "gpumem.runs.examples"
# a parent that reports a run failure in one line, as the command line does
PARENT = ("import sys\nfrom gpumem.runs import launch\nfrom gpumem.errors import RunFailure\n"
          "try:\n    launch.run('gpumem.runs.examples:sleep_then_return', 2, progress=False)\n"
          "except RunFailure as err:\n    print(err, file=sys.stderr)\n    sys.exit(1)\n")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE   # dead, not yet reaped by init
    except psutil.NoSuchProcess:
        return True


def _start_parent(tmp_path):
    """The parent script with its temp dir in tmp_path, once both ranks are guarded and beating."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob(f"gpumem-ranks-{proc.pid}-*/heartbeat*"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    return proc, [c.pid for c in psutil.Process(proc.pid).children()]


def _wait_gone(pids, limit_s: float = 15) -> bool:
    deadline = time.monotonic() + limit_s
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return all(_gone(p) for p in pids)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """This process's and the ranks' temp directory is tmp_path (empty)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_parent_killed_takes_its_ranks_and_the_next_run_sweeps_its_folder(private_tmp, capsys):
    proc, ranks = _start_parent(private_tmp)
    assert len(ranks) == 2
    proc.kill()                        # SIGKILL: no handler, no finally runs in the parent
    proc.communicate(timeout=30)
    assert _wait_gone(ranks), "ranks outlived their parent (they would sleep 60 s)"
    left = list(private_tmp.glob(f"gpumem-ranks-{proc.pid}-*"))
    assert len(left) == 1                  # nobody could remove it ...
    # ... the next run sweeps it and says so in one line. Its ranks make inductor's cache folder
    # (as every torch.compile wrapper does; DeepSpeed makes some at import), by default
    # <tmp>/torchinductor_<user>: they keep it in their job folder, removed with it.
    where = launch.run(f"{EX}:make_inductor_cache", 2, progress=False)
    assert all(w.startswith(str(private_tmp / "gpumem-ranks-")) for w in where), where
    notes = [line for line in capsys.readouterr().err.splitlines() if "removed" in line]
    assert len(notes) == 1 and str(left[0]) in notes[0] and f"pid {proc.pid}" in notes[0]
    assert list(private_tmp.iterdir()) == []
    assert psutil.Process().children(recursive=True) == []


def test_sigterm_to_the_parent_ends_the_ranks_and_removes_the_folder_in_one_line(tmp_path):
    proc, ranks = _start_parent(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert err.strip() == "run stopped by SIGTERM: 2 ranks ended, their folder removed"
    assert _wait_gone(ranks, limit_s=1)    # ended by the parent before it exited
    assert list(tmp_path.iterdir()) == []


def _signal_rank_one(base, sig) -> threading.Thread:
    """From outside, as a user or the OS would: once both ranks beat, send ``sig`` to rank 1."""
    def go():
        deadline = time.monotonic() + 90
        while len(list(base.glob("gpumem-ranks-*/heartbeat*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        for child in psutil.Process().children():
            if child.cmdline()[-1] == "1":
                os.kill(child.pid, sig)
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("how, line", [
    ("SIGSTOP", r"rank 1 stopped responding \(no heartbeat for 2 s\)"),
    ("SIGKILL", r"rank 1 killed by SIGKILL"),
    ("exit 0", r"rank 1 ended without a result \(exit code 0\)"),
    ("raise", r"rank 1 failed: ValueError: rank 1 fails on purpose"),
])
def test_a_misbehaving_rank_is_named_in_one_line_and_the_group_ended(private_tmp, how, line):
    start = time.monotonic()
    with pytest.raises(launch.RankError) as err:
        if how == "raise":
            launch.run(f"{EX}:fail_on_rank_one", 2, progress=False)
        elif how == "exit 0":
            launch.run(f"{EX}:exit_on_rank_one", 2, progress=False)
        else:
            injector = _signal_rank_one(private_tmp, getattr(signal, how))
            launch.run(f"{EX}:sleep_then_return", 2, progress=False, stall_timeout=2)
    assert isinstance(err.value, RunFailure) and len(str(err.value).splitlines()) == 1
    assert re.fullmatch(line, str(err.value)), str(err.value)
    if how == "raise":   # the traceback is kept, out of the one line
        assert "Traceback" in err.value.detail and 'raise ValueError("rank 1 fails on purpose")' in err.value.detail
    elif how.startswith("SIG"):
        injector.join()
    assert time.monotonic() - start < 50     # well before the other rank's 60 s sleep (or 600 s timeout)
    assert psutil.Process().children(recursive=True) == []
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_heartbeat_deadline_is_one_line_exit_2(value, monkeypatch, capsys):
    from gpumem import cli
    monkeypatch.setenv("GPUMEM_RANK_STALL_S", value)
    assert cli.main(["run", "zero", "--ranks", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPUMEM_RANK_STALL_S" in err[0] and "seconds" in err[0]


def test_ranks_keep_inductors_cache_in_their_job_even_after_torch_set_its_default(private_tmp, monkeypatch):
    """Torch writes its default cache folder into the parent's environment once anything looks it
    up (importing DeepSpeed in-process does): the ranks must still not use the temp folder."""
    import getpass
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(private_tmp / f"torchinductor_{getpass.getuser()}"))
    where = launch.run(f"{EX}:make_inductor_cache", 2, progress=False)
    assert all(w.startswith(str(private_tmp / "gpumem-ranks-")) for w in where), where
    assert list(private_tmp.iterdir()) == []


def test_a_rank_that_exits_abruptly_is_named_not_its_peers_consequence(private_tmp):
    with pytest.raises(launch.RankError) as err:
        launch.run(f"{EX}:exit_code_on_rank_one_while_rank_zero_waits", 2, progress=False)
    assert str(err.value).startswith("rank 1 failed with exit code 3"), str(err.value)
    assert list(private_tmp.iterdir()) == []


def test_what_ranks_put_in_the_temp_folder_goes_with_their_job(private_tmp):
    where = launch.run(f"{EX}:make_temp_folder", 2, progress=False)
    assert all(w.startswith(str(private_tmp / "gpumem-ranks-")) for w in where), where
    assert list(private_tmp.iterdir()) == []


def test_a_stale_jit_lock_is_removed_before_deepspeed_ranks_start(tmp_path, monkeypatch, capsys):
    """A rank killed while loading an op leaves <cache>/<op>/lock; every later load would wait on it."""
    import os as _os

    import shutil

    from gpumem.runs import dsops
    cache = tmp_path / "ext"
    # `make setup` built the op in the course cache: a copy spares the ranks a 40 s rebuild, and
    # torch's loader still waits on <op>/lock before it loads a built op, so the sweep is still needed
    built = dsops.cache_dir() / "deepspeed_shm_comm"
    if (built / "deepspeed_shm_comm.so").exists():
        shutil.copytree(built, cache / "deepspeed_shm_comm", ignore=shutil.ignore_patterns("lock"))
    (cache / "deepspeed_shm_comm").mkdir(parents=True, exist_ok=True)
    lock = cache / "deepspeed_shm_comm" / "lock"
    lock.write_text("")
    old = time.time() - 60
    _os.utime(lock, (old, old))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))
    with pytest.raises(launch.RankError):      # the target does not exist: only the sweep matters here
        launch.run(f"{EX}:no_such_function", 1, deepspeed=True, progress=False)
    assert not lock.exists()
    assert "stale JIT lock" in capsys.readouterr().err
    assert dsops.cache_dir() == cache
