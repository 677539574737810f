"""Run one function on N ranks and get each rank's result back as data.

CPU: N processes on this machine, gloo over 127.0.0.1 on a free port, one thread each. With
CUDA and ``device="cuda"``: one rank per GPU, NCCL. The function is named ``"module:function"``;
each rank is a fresh ``python -m gpumem.dist.launch`` process (so it works the same from a notebook,
a script or the command line), sets the usual MASTER_ADDR / RANK / WORLD_SIZE variables, joins
the process group, calls ``fn(rank, world_size, **kwargs)`` and pickles the result back.

A rank that raises writes its traceback and exits; the launcher then ends every other rank at
once and raises :class:`RankError` with that traceback. No process is left behind. The same
functions run under ``torchrun`` or the ``deepspeed`` launcher (see env/launch_examples.md).
"""

import importlib
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NoReturn

import torch


class RankError(RuntimeError):
    """A rank failed; the message carries the rank number and its traceback."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for the ranks' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(device: str = "cpu", deepspeed: bool = False) -> None:
    """Join the process group described by the environment (used by every rank)."""
    torch.set_num_threads(1)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if deepspeed:
        from . import dsops
        dsops.use_course_cache()
        import deepspeed as ds
        ds.init_distributed(dist_backend=backend, verbose=False)
    else:
        torch.distributed.init_process_group(backend)


def _worker(job: Path, rank: int) -> NoReturn:
    spec = pickle.loads((job / "spec.pkl").read_bytes())
    try:
        init(spec["device"], spec["deepspeed"])
        module, name = spec["target"].split(":")
        result = getattr(importlib.import_module(module), name)(rank, spec["ranks"], **spec["kwargs"])
        torch.distributed.barrier()
        part = job / f"result{rank}.part"
        part.write_bytes(pickle.dumps(result))
        part.rename(job / f"result{rank}.pkl")     # whole or absent, never half-written
        torch.distributed.destroy_process_group()
    except BaseException:
        (job / f"error{rank}.txt").write_text(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)   # never wait in collective teardown for peers that may be stuck
    # Skip interpreter finalization: gloo's worker threads can abort it ("terminate called
    # without an active exception", pytorch/pytorch#190489) after the work is done and saved.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(target: str, ranks: int = 2, device: str = "cpu", deepspeed: bool = False,
        timeout: float = 600, progress: bool = True, **kwargs) -> list:
    """Run ``target`` on ``ranks`` processes; return the per-rank results in rank order."""
    if device == "cuda" and ranks > torch.cuda.device_count():
        raise ValueError(f"{ranks} ranks asked for, {torch.cuda.device_count()} GPUs present")
    with tempfile.TemporaryDirectory(prefix="gpumem-ranks-") as tmp:
        job = Path(tmp)
        (job / "spec.pkl").write_bytes(pickle.dumps(dict(target=target, ranks=ranks, device=device,
                                                         deepspeed=deepspeed, kwargs=kwargs)))
        port = free_port()
        procs, logs = [], []
        for r in range(ranks):
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                   "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(ranks),
                   "OMP_NUM_THREADS": "1"}
            logs.append(open(job / f"stderr{r}.txt", "wb"))
            procs.append(subprocess.Popen([sys.executable, "-m", "gpumem.dist.launch", str(job), str(r)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=logs[-1]))
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=ranks, desc=f"{target.split(':')[1]} on {ranks} {device} ranks", unit="rank",
                       leave=False)
        deadline = time.monotonic() + timeout
        done: set[int] = set()
        try:
            while len(done) < ranks:
                for r, p in enumerate(procs):
                    code = p.poll()
                    if code is None or r in done:
                        continue
                    finished = (job / f"result{r}.pkl").exists()   # saved after the final barrier
                    if code != 0 and not finished:
                        err = job / f"error{r}.txt"
                        detail = err.read_text() if err.exists() else (job / f"stderr{r}.txt").read_text()[-3000:]
                        raise RankError(f"rank {r} failed (exit code {code}):\n{detail}")
                    done.add(r)
                    if bar:
                        bar.update(1)
                if time.monotonic() > deadline:
                    raise RankError(f"ranks did not finish within {timeout:.0f} s")
                time.sleep(0.05)
            return [pickle.loads((job / f"result{r}.pkl").read_bytes()) for r in range(ranks)]
        finally:
            if bar:
                bar.close()
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            for log in logs:
                log.close()


def _under_external_launcher(argv: list[str]) -> int:
    """``torchrun ... -m gpumem.dist.launch --env module:function [--deepspeed] [key=value ...]``:
    the process group comes from the launcher's environment; rank 0 prints the results as JSON."""
    import json
    target, rest = argv[0], argv[1:]
    use_ds = "--deepspeed" in rest
    kwargs = {k: json.loads(v) for k, v in (a.split("=", 1) for a in rest if "=" in a)}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    init(device, use_ds)
    module, name = target.split(":")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    result = getattr(importlib.import_module(module), name)(rank, world, **kwargs)
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, result)
    if rank == 0:
        print(json.dumps(gathered, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    # The deepspeed launcher passes --local_rank=N first unless told --no_local_rank; the
    # rank is read from the environment (LOCAL_RANK) either way.
    while len(sys.argv) > 1 and sys.argv[1].startswith("--local_rank"):
        del sys.argv[1:3 if sys.argv[1] == "--local_rank" else 2]
    if sys.argv[1] == "--env":
        sys.exit(_under_external_launcher(sys.argv[2:]))
    _worker(Path(sys.argv[1]), int(sys.argv[2]))
