"""Scratch folders: a folder whose owner was killed is swept by the next run; a live owner's is kept."""

import subprocess
import sys

from gpumem import scratch


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_a_dead_owners_folder_and_keeps_a_live_ones(tmp_path):
    dead = tmp_path / f"gpumem-swap-{_dead_pid()}-abc"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "f.bin").write_bytes(b"x" * 10)
    live = tmp_path / "gpumem-swap-1-xyz"            # pid 1 is always alive
    live.mkdir()
    other = tmp_path / f"gpumem-ranks-{_dead_pid()}-q"  # another kind is not this sweep's
    other.mkdir()
    notes = scratch.sweep("swap", tmp_path)
    assert not dead.exists() and live.exists() and other.exists()
    assert len(notes) == 1 and str(dead) in notes[0] and "killed" in notes[0]


def test_folder_is_removed_on_exit_and_on_error(tmp_path):
    with scratch.folder("ladder", tmp_path) as path:
        (path / "rung.bin").write_bytes(b"1")
    assert not path.exists()
    try:
        with scratch.folder("ladder", tmp_path) as path:
            raise KeyError("boom")
    except KeyError:
        pass
    assert not path.exists() and list(tmp_path.iterdir()) == []
