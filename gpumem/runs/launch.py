"""Run one function on N ranks and get each rank's result back as data.

CPU: N processes on this machine, gloo over 127.0.0.1 on a free port, one thread each. With
CUDA and ``device="cuda"``: one rank per GPU, NCCL. The function is named ``"module:function"``;
each rank is a fresh ``python -m gpumem.runs.launch`` process (so it works the same from a notebook,
a script or the command line), sets the usual MASTER_ADDR / RANK / WORLD_SIZE variables, joins
the process group, calls ``fn(rank, world_size, **kwargs)`` and pickles the result back.

Nothing is left behind, whatever happens:

* a rank that raises, is killed, stops responding (no heartbeat for ``stall_timeout`` seconds) or
  ends without a result makes the launcher end every other rank at once and raise
  :class:`RankError`: one line naming the rank and the cause, the traceback in ``err.detail``;
* Ctrl-C or SIGTERM to the launcher ends the ranks and raises :class:`RunStopped` (one line);
* a launcher killed outright (SIGKILL) takes its ranks with it (:mod:`gpumem.runs.rank_guard`),
  and its job folder, named after its pid (:mod:`gpumem.scratch`), is removed by the next run.

The same functions run under ``torchrun`` or the ``deepspeed`` launcher (see env/launch_examples.md).
"""

import contextlib
import importlib
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from .. import scratch
from ..errors import RunFailure, Stopped, UsageError
from . import rank_guard, rank_results

STALL_S = 60.0               # default heartbeat deadline; GPUMEM_RANK_STALL_S overrides it
STALL_ENV = "GPUMEM_RANK_STALL_S"


class RankError(RunFailure):
    """A rank failed, was killed, stopped responding or ended without a result: ``str(err)`` is one
    line naming the rank and the cause, ``err.detail`` the rank's traceback or its last output."""


class RunStopped(Stopped):
    """Ctrl-C or SIGTERM stopped the run; its ranks were ended and their folder removed. Also a
    KeyboardInterrupt, so whatever stops on Ctrl-C (a notebook, pytest) still stops."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for the ranks' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerator(device: str) -> str:
    """DeepSpeed's accelerator for ranks on ``device``, set in each rank's ``DS_ACCELERATOR``.
    Left to itself DeepSpeed picks CUDA wherever a GPU is visible, also on gloo CPU ranks: their
    engines then go to ``cuda:<local rank>`` (rank 1 of 2 on one GPU has no device) and meet the
    CPU token ids. Nor may a ``DS_ACCELERATOR=cpu`` in this process reach CUDA ranks."""
    return "cuda" if device == "cuda" else "cpu"


def init(device: str = "cpu", deepspeed: bool = False) -> None:
    """Join the process group described by the environment (used by every rank)."""
    import torch
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


def one_line(exc: BaseException, limit: int = 400) -> str:
    """``Type: message`` on one line (a multi-line message is joined), at most ``limit`` characters."""
    text = " ".join("".join(traceback.format_exception_only(type(exc), exc)).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _worker(job: Path, rank: int) -> NoReturn:
    rank_guard.start(job, rank)      # before the slow imports: die with the parent, heartbeat
    import torch
    spec = pickle.loads((job / "spec.pkl").read_bytes())
    try:
        init(spec["device"], spec["deepspeed"])
        module, name = spec["target"].split(":")
        result = getattr(importlib.import_module(module), name)(rank, spec["ranks"], **spec["kwargs"])
        torch.distributed.barrier()
        part = job / f"result{rank}.part"
        part.write_bytes(rank_results.dump(result, spec.get("results", "any")))
        part.rename(job / f"result{rank}.pkl")     # whole or absent, never half-written
        torch.distributed.destroy_process_group()
    except BaseException as exc:
        part = job / f"error{rank}.part"
        part.write_text(json.dumps({"cause": one_line(exc), "traceback": traceback.format_exc()}))
        part.rename(job / f"error{rank}.json")
        sys.stderr.flush()
        os._exit(1)   # never wait in collective teardown for peers that may be stuck
    _exit_now(0)


def _exit_now(code: int) -> NoReturn:
    """Flush and end the process without interpreter finalization. DeepSpeed keeps the world gloo
    group referenced after ``destroy_process_group`` (``deepspeed.utils.groups._WORLD_GROUP`` and
    references outside Python's gc), so gloo's run-loop threads are still alive at exit; freeing the
    group during finalization can abort ("terminate called without an active exception",
    pytorch/pytorch#190489, PR #179291) after the work is done and saved."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _last_output(job: Path, rank: int) -> tuple[str, str]:
    """The rank's stderr tail (3000 characters) and its last non-empty line."""
    try:
        tail = (job / f"stderr{rank}.txt").read_text(errors="replace")[-3000:]
    except OSError:
        tail = ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return tail, (lines[-1][:200] if lines else "")


def _failure(job: Path, procs, rank: int) -> RankError:
    """Why ``rank`` ended without a result. The root cause comes first: a rank killed by a signal
    (its peers' errors are the consequence), else the first error any rank wrote."""
    codes = {k: p.poll() for k, p in enumerate(procs)}
    errors = sorted(job.glob("error*.json"), key=lambda p: p.stat().st_mtime_ns)
    # ended abruptly: no result and no error of its own (a signal, os._exit, a crash in C)
    killed = [k for k, c in codes.items() if c is not None and not (job / f"result{k}.pkl").exists()
              and not (job / f"error{k}.json").exists()]
    killed.sort(key=lambda k: codes[k] == 0)   # a signal or an exit code before a quiet exit 0
    if errors and not killed:
        first = int(errors[0].stem.removeprefix("error"))
        saved = json.loads(errors[0].read_text())
        return RankError(f"rank {first} failed: {saved['cause']}", saved["traceback"])
    rank = killed[0] if killed else rank
    code = codes[rank]
    tail, last = _last_output(job, rank)
    said = f" (last output: {last})" if last else ""
    if code == 0:
        return RankError(f"rank {rank} ended without a result (exit code 0){said}", tail)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return RankError(f"rank {rank} killed by {name}{said}", tail)
    return RankError(f"rank {rank} failed with exit code {code}{said}", tail)


def _collect(procs, job: Path, timeout: float, stall_s: float, bar, results: str = "any") -> list:
    ranks = len(procs)
    deadline = time.monotonic() + timeout
    done: set[int] = set()
    beats = {r: (None, time.monotonic()) for r in range(ranks)}
    while len(done) < ranks:
        for r, p in enumerate(procs):
            if r in done:
                continue
            code = p.poll()
            if code is None:
                if rank_guard.stalled(job / f"heartbeat{r}", r, beats, stall_s):
                    raise RankError(f"rank {r} stopped responding (no heartbeat for {stall_s:g} s)",
                                    _last_output(job, r)[0])
            elif (job / f"result{r}.pkl").exists():   # saved after the final barrier
                done.add(r)
                if bar:
                    bar.update(1)
            else:
                raise _failure(job, procs, r)
        if time.monotonic() > deadline:
            raise RankError(f"ranks did not finish within {timeout:g} s")
        time.sleep(0.05)
    return [rank_results.load((job / f"result{r}.pkl").read_bytes(), results) for r in range(ranks)]


def _end(procs, pipes_and_logs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
    for f in pipes_and_logs:
        with contextlib.suppress(OSError):
            f.close()


def _note(line: str) -> None:
    print(f"gpumem: {line}", file=sys.stderr)


def run(target: str, ranks: int = 2, device: str = "cpu", deepspeed: bool = False,
        timeout: float = 600, progress: bool = True, stall_timeout: float | None = None,
        results: str = "any", **kwargs) -> list:
    """Run ``target`` on ``ranks`` processes; return the per-rank results in rank order
    (``results="plain"``: tensors and plain values only, :func:`.rank_results.load`).

    ``stall_timeout``: seconds without a heartbeat after which a rank counts as stopped (default
    ``$GPUMEM_RANK_STALL_S`` or 60)."""
    if device == "cuda":
        import torch
        if ranks > torch.cuda.device_count():
            raise UsageError(f"{ranks} ranks asked for, {torch.cuda.device_count()} GPUs present")
    stall_s = rank_guard.stall_seconds(stall_timeout, STALL_ENV, STALL_S)
    procs: list[subprocess.Popen] = []
    files: list = []
    bar = None
    with rank_guard.signals_stop_the_run(), scratch.folder("ranks", note=_note) as job:
        if deepspeed:   # a rank killed while loading an op leaves its JIT lock: every later load would wait
            from . import dsops
            for lock in dsops.clear_stale_locks():
                _note(f"removed a stale JIT lock left by a killed rank: {lock}")
        try:
            (job / "spec.pkl").write_bytes(pickle.dumps(dict(target=target, ranks=ranks, device=device,
                                                             deepspeed=deepspeed, kwargs=kwargs, results=results)))
            port = free_port()
            for r in range(ranks):
                env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                       "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(ranks),
                       "OMP_NUM_THREADS": "1", rank_guard.PARENT_ENV: str(os.getpid()), rank_guard.PIPE_ENV: "1",
                       "DS_ACCELERATOR": accelerator(device)}
                # torch's and triton's caches default to <tmp>/torchinductor_<user>: keep them in the job.
                # Torch writes that default into this process's environment once anything here
                # looked the cache up (DeepSpeed's import does), so a value in the temp folder is replaced.
                if rank_guard.inductor_default(env.get("TORCHINDUCTOR_CACHE_DIR")):
                    env["TORCHINDUCTOR_CACHE_DIR"] = str(job / "torchinductor")
                env.setdefault("TRITON_CACHE_DIR", str(job / "triton"))
                # whatever else a rank puts in the temp folder (DeepSpeed's compile checks make
                # /tmp/tmpXXXX folders) lives and dies with the job folder
                (job / "tmp").mkdir(exist_ok=True)
                env["TMPDIR"] = str(job / "tmp")
                files.append(open(job / f"stderr{r}.txt", "wb"))
                procs.append(subprocess.Popen([sys.executable, "-m", "gpumem.runs.launch", str(job), str(r)],
                                              env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                              stderr=files[-1]))
                files.append(procs[-1].stdin)   # held open: its end-of-file tells the rank we are gone
            if progress:
                from tqdm.auto import tqdm
                bar = tqdm(total=ranks, desc=f"{target.split(':')[1]} on {ranks} {device} ranks", unit="rank",
                           leave=False)
            return _collect(procs, job, timeout, stall_s, bar, results)
        except KeyboardInterrupt as stop:
            how = getattr(stop, "how", "Ctrl-C (KeyboardInterrupt)")
            _end(procs, files)
            ended = f"{len(procs)} rank{'s' if len(procs) != 1 else ''} ended"
            raise RunStopped(f"run stopped by {how}: {ended}, their folder removed",
                             getattr(stop, "signum", 2)) from None   # the command line exits 128 + signum
        finally:
            if bar:
                bar.close()
            _end(procs, files)


def _under_external_launcher(argv: list[str]) -> NoReturn:
    """``torchrun ... -m gpumem.runs.launch --env module:function [--deepspeed] [key=value ...]``:
    the process group comes from the launcher's environment; rank 0 prints the results as JSON."""
    from . import dsops
    # torch.compile wrappers (DeepSpeed makes some at import) create inductor's cache folder,
    # by default <tmp>/torchinductor_<user>: keep it in the course cache instead
    if rank_guard.inductor_default(os.environ.get("TORCHINDUCTOR_CACHE_DIR")):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(dsops.cache_dir().parent / "torchinductor")
    import torch
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
    _exit_now(0)


if __name__ == "__main__":
    # The deepspeed launcher passes --local_rank=N first unless told --no_local_rank; the
    # rank is read from the environment (LOCAL_RANK) either way.
    while len(sys.argv) > 1 and sys.argv[1].startswith("--local_rank"):
        del sys.argv[1:3 if sys.argv[1] == "--local_rank" else 2]
    if sys.argv[1] == "--env":
        _under_external_launcher(sys.argv[2:])
    _worker(Path(sys.argv[1]), int(sys.argv[2]))
