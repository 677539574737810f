"""Chapter 02's real-DeepSpeed rank functions (run with ``launch.run(..., deepspeed=True)``).

All ZeRO stages run in one launch: the engine is re-created in the same processes for each
stage. ``gather_trace`` records ZeRO-3's parameter fetches, all-gathers and releases.
"""

import contextlib
import io
import logging

import torch

from gpumem.dist.ds_engine import ds_config, held
from gpumem.dist.training import batches, build, device_of_rank
from gpumem.memory import models


def deepspeed_stages(rank: int, world: int, stages=(0, 1, 2, 3), model: str = "tiny", steps: int = 3,
                     seq: int = 32, batch_per_rank: int = 2, seed: int = 0) -> dict:
    """Train a few steps under real DeepSpeed at each ZeRO stage; per stage: losses, what this rank
    holds, and its CUDA peak bytes on a GPU."""
    import deepspeed
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    device = device_of_rank(rank)
    out = {}
    for stage in stages:
        net = build(model, seed).to(device)
        data = batches(net.cfg, steps, world * batch_per_rank, seq, seed).to(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with contextlib.redirect_stdout(io.StringIO()):
            engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                              config=ds_config(stage, batch_per_rank))
        losses = []
        for step in range(steps):
            mine = data[step, rank * batch_per_rank:(rank + 1) * batch_per_rank]
            loss = engine(mine[:, :-1], mine[:, 1:])
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        out[stage] = {"losses": losses, "held": held(engine, net, stage),
                      "cuda_max_memory_allocated": torch.cuda.max_memory_allocated(device)
                      if device.type == "cuda" else None}
        engine.destroy()
        del engine, net
    return out


# ---- the ZeRO-3 gather trace --------------------------------------------------------------
# DeepSpeed 0.19.8's PartitionedParameterCoordinator does the fetching; we wrap three of its
# methods to record what they do (the originals still run): the per-module fetch, the coalesced
# all-gather of the parameters that are not on this rank, and the release back to a shard.
# Name-mangled private methods: the DeepSpeed version is pinned and tests check they exist.
_COORD = "deepspeed.runtime.zero.partitioned_param_coordinator"
_GATHER = "_PartitionedParameterCoordinator__all_gather_params_"
_RELEASE = "_PartitionedParameterCoordinator__release_param"

# DeepSpeed's defaults measured against one Llama-3-70B layer (856 M parameters).
DEFAULTS_70B = {"stage3_param_persistence_threshold": 1e5, "stage3_max_reuse_distance": 1e9,
                "stage3_prefetch_bucket_size": 5e7}


def scaled_zero3_config(cfg) -> dict:
    """DeepSpeed's stage-3 thresholds scaled from a 70B layer to this model's layer size, so a
    tiny model gathers, keeps and prefetches the way Llama-3-70B does with the defaults."""
    ratio = cfg.layer_params() / models.get("llama-3-70b").layer_params()
    scaled = {k: max(int(v * ratio), 1) for k, v in DEFAULTS_70B.items()}
    scaled["stage3_param_persistence_threshold"] = max(scaled["stage3_param_persistence_threshold"],
                                                       cfg.d_model + 1)   # norms stay whole, as in 70B
    return scaled


def gather_trace(rank: int, world: int, model: str = "mini", steps: int = 2, seq: int = 32,
                 batch_per_rank: int = 1, seed: int = 0, scaled: bool = True) -> dict:
    """Every parameter fetch, all-gather and release of ZeRO-3, for each training step."""
    import importlib

    import deepspeed
    coord_mod = importlib.import_module(_COORD)
    Coord = coord_mod.PartitionedParameterCoordinator
    net = build(model, seed)
    names = {id(p): n for n, p in net.named_parameters()}
    modules = {id(m): n or "model" for n, m in net.named_modules()}
    events: list[dict] = []
    state = {"step": 0, "phase": "forward"}

    orig_fetch, orig_gather, orig_release = Coord.fetch_sub_module, getattr(Coord, _GATHER), getattr(Coord, _RELEASE)

    def fetch(self, module, forward):
        state["phase"] = "forward" if forward else "backward"
        events.append({"step": state["step"], "event": "fetch", "phase": state["phase"],
                       "module": modules.get(id(module), "?")})
        return orig_fetch(self, module, forward)

    def gather(self, params, forward, quantize=False):
        todo = [p for p in params if p.ds_status.name == "NOT_AVAILABLE"]
        if todo:
            events.append({"step": state["step"], "event": "all-gather", "phase": "forward" if forward else "backward",
                           "params": sorted(names.get(id(p), "?") for p in todo),
                           "bytes": sum(p.ds_numel * p.element_size() for p in todo)})
        return orig_gather(self, params, forward, quantize)

    def release(self, param, free_data=True):
        if param.ds_status.name == "AVAILABLE" and not param.ds_active_sub_modules:
            events.append({"step": state["step"], "event": "release", "phase": state["phase"],
                           "params": [names.get(id(param), "?")],
                           "bytes": param.ds_numel * param.element_size()})
        return orig_release(self, param, free_data)

    setattr(Coord, "fetch_sub_module", fetch)
    setattr(Coord, _GATHER, gather)
    setattr(Coord, _RELEASE, release)
    zero = scaled_zero3_config(net.cfg) if scaled else {}
    try:
        data = batches(net.cfg, steps, world * batch_per_rank, seq, seed)
        with contextlib.redirect_stdout(io.StringIO()):
            engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                              config=ds_config(3, batch_per_rank, zero))
        persistent = sorted(n for n, p in net.named_parameters() if p.ds_persist)
        for step in range(steps):
            state["step"] = step
            mine = data[step, rank * batch_per_rank:(rank + 1) * batch_per_rank]
            loss = engine(mine[:, :-1], mine[:, 1:])
            engine.backward(loss)
            engine.step()
        engine.destroy()
    finally:
        setattr(Coord, "fetch_sub_module", orig_fetch)
        setattr(Coord, _GATHER, orig_gather)
        setattr(Coord, _RELEASE, orig_release)
    owners = sorted({n.rsplit(".", 1)[0] for n, p in net.named_parameters() if n not in persistent})
    return {"rank": rank, "events": events, "persistent": persistent, "config": zero, "owners": owners,
            "n_layers": net.cfg.n_layers, "counts": gather_counts(events, set(owners))}


def gather_counts(events: list[dict], owners: set[str]) -> dict:
    """Per step and phase: fetches of modules that own sharded parameters, all-gather calls,
    parameters gathered, releases. (Container modules are fetched too, with nothing to gather.)"""
    out: dict = {}
    for e in events:
        key = f"step{e['step']}"
        row = out.setdefault(key, {"forward_fetches": 0, "backward_fetches": 0, "forward_all_gathers": 0,
                                   "backward_all_gathers": 0, "params_gathered": 0, "bytes_gathered": 0,
                                   "releases": 0})
        if e["event"] == "fetch":
            if e["module"] in owners:
                row[f"{e['phase']}_fetches"] += 1
        elif e["event"] == "all-gather":
            row[f"{e['phase']}_all_gathers"] += 1
            row["params_gathered"] += len(e["params"])
            row["bytes_gathered"] += e["bytes"]
        else:
            row["releases"] += 1
    return out


def sharded_bytes(events: list[dict]) -> int:
    """Bytes of all sharded parameters (each counted once), from a trace's all-gathers."""
    seen: dict[str, int] = {}
    for e in events:
        if e["event"] == "release":
            seen[e["params"][0]] = e["bytes"]
    return sum(seen.values())
