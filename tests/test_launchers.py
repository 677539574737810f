"""Chapter rank functions under the usual launchers, on 2 CPU ranks of this machine: torchrun with
its multi-node flags, DeepSpeed's launcher with a hostfile, and the SLURM batch script (its
srun/scontrol given a one-node allocation). Each result must equal what the course's own launcher
(gpumem.runs.launch.run) returns for the same function and arguments: same losses, same bytes,
rank by rank. Nothing is mocked: real processes, gloo, real DeepSpeed engines."""

import json
import os
import shutil
import socket
import stat
import subprocess

import pytest

from conftest import ROOT

BIN = ROOT / ".venv" / "bin"
SCRATCH = "gpumem.chapters.ch02_zero.scratch_ranks:from_scratch_stages"
DS = "gpumem.chapters.ch02_zero.ds_ranks:deepspeed_stages"
ARGS = {"stages": [2], "steps": 2}          # ZeRO-2, 2 steps: the shortest run that shards something
pytestmark = pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="needs .venv (make setup)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    return {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1",
            "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"), **extra}
# PATH is left as the rest of the suite has it: putting .venv/bin first would make torch's JIT use
# pip's ninja (1.13) instead of the system's (1.11); each rejects the other's .ninja_log and
# DeepSpeed's shm_comm op is recompiled on every switch (30-60 s here).


def kv(args: dict) -> list[str]:
    return [f"{k}={json.dumps(v)}" for k, v in args.items()]


def last_json(proc) -> list:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # rank 0's JSON line; DeepSpeed's launcher logs its processes' exits after it
    return json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("[{")))


def course_launcher(target, deepspeed=False) -> list:
    from gpumem.runs import launch
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return json.loads(json.dumps(launch.run(target, 2, "cpu", deepspeed=deepspeed, progress=False, **ARGS),
                                 default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


@pytest.fixture(scope="module")
def scratch_reference():
    return course_launcher(SCRATCH)


def assert_same_ranks(got: list, want: list):
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        for stage in w:
            assert g[stage]["losses"] == pytest.approx(w[stage]["losses"], rel=1e-6)
            for key in ("bytes", "held"):
                if key in w[stage]:
                    assert g[stage][key] == w[stage][key]


def test_torchrun_multi_node_flags(scratch_reference):
    """One node of a multi-node job: --nnodes/--node-rank/--master-addr/--master-port."""
    proc = subprocess.run([str(BIN / "torchrun"), "--nnodes=1", "--node-rank=0", "--nproc-per-node=2",
                           "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                           "-m", "gpumem.runs.launch", "--env", SCRATCH, *kv(ARGS)],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=180)
    got = last_json(proc)
    assert [r["2"]["rank"] for r in got] == [0, 1]
    assert_same_ranks(got, scratch_reference)
    # ZeRO-2 on 2 ranks: each rank keeps half of every parameter's fp32 gradient and Adam moments
    n = got[0]["2"]["n_params"]
    assert sum(r["2"]["bytes"]["optimizer"] for r in got) == 2 * 4 * n


def test_deepspeed_launcher_with_a_hostfile(tmp_path):
    """DeepSpeed's launcher reads the hostfile (localhost, 2 slots) and starts 2 real engines."""
    (tmp_path / "hostfile").write_text("localhost slots=2\n")
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([str(BIN / "deepspeed"), "--hostfile", str(tmp_path / "hostfile"), "--no_ssh_check",
                           "--no_local_rank", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                           "--module", "gpumem.runs.launch", "--env", DS, "--deepspeed", *kv(ARGS)],
                          cwd=ROOT, env=env(TMPDIR=str(tmp_path / "tmp")), capture_output=True, text=True,
                          timeout=240)
    got = last_json(proc)
    assert "world_size=2" in proc.stdout + proc.stderr or len(got) == 2
    # DeepSpeed makes torch.compile wrappers at import: inductor's cache goes to the course cache,
    # not <tmp>/torchinductor_<user>; and no rank aborts at exit (gloo threads at finalization)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert "terminate called" not in proc.stdout + proc.stderr
    assert_same_ranks(got, course_launcher(DS, deepspeed=True))


def test_slurm_script_on_a_one_node_allocation(tmp_path, scratch_reference):
    """env/slurm_example.sbatch as SLURM runs it: SLURM_* set, srun starting the task (one task on
    one node: it runs the command), scontrol naming the node. torchrun's c10d rendezvous is real."""
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, body in {"srun": 'while [[ "$1" == --* ]]; do shift; done\nexec "$@"',
                       "scontrol": 'echo localhost'}.items():
        (shims / name).write_text(f"#!/bin/bash\n{body}\n")
        (shims / name).chmod(stat.S_IRWXU)
    proc = subprocess.run(["bash", str(ROOT / "env" / "slurm_example.sbatch"), SCRATCH, *kv(ARGS)], cwd=tmp_path,
                          env=env(PATH=f"{shims}{os.pathsep}{os.environ['PATH']}",
                                  SLURM_SUBMIT_DIR=str(ROOT), SLURM_JOB_NODELIST="localhost", SLURM_NNODES="1",
                                  SLURM_JOB_ID="4242", GPUS_PER_NODE="2", MASTER_PORT=str(free_port())),
                          capture_output=True, text=True, timeout=180)
    assert_same_ranks(last_json(proc), scratch_reference)


def test_example_hostfile_parses_with_deepspeed():
    from deepspeed.launcher.runner import fetch_hostfile
    pool = fetch_hostfile(str(ROOT / "env" / "hostfile.example"))
    assert len(pool) >= 2 and all(slots > 0 for slots in pool.values())


def test_sbatch_script_is_valid_bash():
    assert shutil.which("bash")
    proc = subprocess.run(["bash", "-n", str(ROOT / "env" / "slurm_example.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_launch_examples_use_the_flags_tested_here():
    """The documented commands are the ones run above (DeepSpeed passes --local_rank unless told not to)."""
    text = (ROOT / "env" / "launch_examples.md").read_text()
    for flag in ("--no_local_rank", "--hostfile", "--nnodes", "--node-rank", "--master-addr", "slurm_example.sbatch"):
        assert flag in text, flag
    for line in text.splitlines():
        if line.startswith("deepspeed "):
            assert "--no_local_rank" in line, line

