"""The rank function of the real offload runs, and its step-time breakdown.

:func:`offload_runs` trains the same model on the same tokens under each named configuration
of :mod:`gpumem.runs.ds_offload`, in one launch (the engine is re-created per configuration).
Per configuration: the losses, the seconds of forward, backward and optimizer step (this
module's own ``perf_counter`` around each call, of the fastest step after the first: the one
least disturbed by other work on the machine), the
seconds spent waiting on swap I/O inside each phase (DeepSpeed's swapper methods wrapped, the
originals still run; asynchronous I/O that overlaps compute is not counted), what the rank holds
by role and device, and the swap files while the engine is alive.
"""

import contextlib
import importlib
import io
import logging
import time

import torch

from ..memory.llama import Llama
from . import ds_offload
from .training import batches, device_of_rank

# DeepSpeed 0.19.8 swapper methods that read or write swap files, or wait for them.
SWAP_METHODS = {
    "deepspeed.runtime.swap_tensor.partitioned_param_swapper.AsyncPartitionedParameterSwapper":
        ("swap_in", "swap_out_and_release", "synchronize_reads", "synchronize_writes", "swap_into_buffer",
         "swap_out_partitioned_params"),
    "deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper.PartitionedOptimizerSwapper":
        ("swap_in_optimizer_state", "swap_out_optimizer_state", "swap_out_gradients"),
}


class SwapClock:
    """Seconds inside DeepSpeed's swapper methods, by the phase the caller names (outermost
    call only, so nested swapper calls are not counted twice)."""

    def __init__(self):
        self.phase, self.depth, self.seconds, self.calls = "init", 0, {}, {}
        self._orig = []

    def __enter__(self):
        for path, names in SWAP_METHODS.items():
            module, cls_name = path.rsplit(".", 1)
            cls = getattr(importlib.import_module(module), cls_name)
            for name in names:
                orig = getattr(cls, name)
                self._orig.append((cls, name, orig))
                setattr(cls, name, self._wrap(orig))
        return self

    def _wrap(self, orig):
        clock = self

        def timed(*args, **kwargs):
            clock.depth += 1
            start = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                clock.depth -= 1
                if clock.depth == 0:
                    clock.seconds[clock.phase] = clock.seconds.get(clock.phase, 0.0) + time.perf_counter() - start
                    clock.calls[clock.phase] = clock.calls.get(clock.phase, 0) + 1
        return timed

    def __exit__(self, *exc):
        for cls, name, orig in self._orig:
            setattr(cls, name, orig)
        return False

    def take(self) -> dict[str, float]:
        """The seconds so far by phase, then zero."""
        out, self.seconds, self.calls = self.seconds, {}, {}
        return out


def _one_config(name: str, rank: int, world: int, swap_dir, steps: int, seq: int, batch_per_rank: int,
                seed: int, clock: SwapClock, fail_at: int | None, config: dict | None) -> dict:
    import deepspeed
    zero = ds_offload.CONFIGS[name][0] if config is None else ds_offload.describe(config)[0]
    torch.manual_seed(seed)
    net = Llama(ds_offload.MODEL)
    data = batches(net.cfg, steps, world * batch_per_rank, seq, seed)
    cfg = config or ds_offload.offload_config(name, str(swap_dir) if swap_dir else None, batch_per_rank, world=world,
                                              device=device_of_rank(rank).type)
    clock.phase = "init"
    with contextlib.redirect_stdout(io.StringIO()):
        engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    clock.take()
    losses, times, swaps, held, unreduced = [], [], [], None, []
    # on a GPU the calls return before the kernels finish: wait for them before reading the clock
    sync = torch.cuda.synchronize if str(engine.device).startswith("cuda") else (lambda: None)
    for step in range(steps):
        mine = data[step, rank * batch_per_rank:(rank + 1) * batch_per_rank].to(engine.device)
        t = {}
        clock.phase = "forward"
        sync()
        start = time.perf_counter()
        loss = engine(mine[:, :-1], mine[:, 1:])
        sync()
        t["forward"] = time.perf_counter() - start
        clock.phase = "backward"
        if step == steps - 1:     # read backward's gradients as the end-of-backward reduction starts
            reduce = engine.allreduce_gradients
            engine.allreduce_gradients = lambda *a, **k: (unreduced.append(ds_offload.unreduced_grads(net)),
                                                          reduce(*a, **k))[1]
        start = time.perf_counter()
        engine.backward(loss)
        sync()
        t["backward"] = time.perf_counter() - start
        if step == steps - 1:
            held = ds_offload.held_by_role(engine, net, zero)
            held["grads_unreduced"] = unreduced[-1] if unreduced else 0
        clock.phase = "step"
        start = time.perf_counter()
        engine.step()
        sync()
        t["step"] = time.perf_counter() - start
        losses.append(loss.item())
        times.append(t)
        swaps.append(clock.take())
        if fail_at is not None and step == fail_at and rank == world - 1:
            files = sum(len(v["files"]) for v in ds_offload.inventory(swap_dir).values()) if swap_dir else 0
            raise RuntimeError(f"planned failure on rank {rank} at step {step}, {files} swap files in place")
    files = ds_offload.inventory(swap_dir).get(rank, {"files": {}, "by_kind": {}, "total": 0}) if swap_dir else \
        {"files": {}, "by_kind": {}, "total": 0}
    engine.destroy()
    timed = times[1:] or times                      # the first step also allocates and warms up
    swaps = swaps[1:] or swaps
    fastest = min(range(len(timed)), key=lambda i: sum(timed[i].values()))   # least disturbed by other work
    mean = dict(timed[fastest])
    swap = {k: swaps[fastest].get(k, 0.0) for k in ("forward", "backward", "step")}
    numels = [p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in net.parameters()]
    return {"losses": losses, "seconds": mean, "swap_seconds": swap, "steps_timed": len(timed),
            "held_by_role": held, "swap_files": files, "n_params": sum(numels), "param_numels": numels}


def offload_runs(rank: int, world: int, configs=tuple(ds_offload.CONFIGS), swap_dir: str | None = None,
                 steps: int = 4, seq: int = 32, batch_per_rank: int = 2, seed: int = 0,
                 fail_at: int | None = None, given: dict[str, dict] | None = None) -> dict:
    """Train ``steps`` steps under each configuration; per configuration the losses, phase
    seconds, swap seconds per phase, held bytes by role and the swap files (see module doc).

    ``given``: name -> a whole DeepSpeed config to run instead of ``configs`` (e.g. a learner's).
    ``fail_at``: the last rank raises after that step (tests of clean-up).
    """
    torch.set_num_threads(1)
    out = {}
    with SwapClock() as clock:
        for name in (given or configs):
            out[name] = _one_config(name, rank, world, swap_dir, steps, seq, batch_per_rank, seed, clock,
                                    fail_at, (given or {}).get(name))
    return out
