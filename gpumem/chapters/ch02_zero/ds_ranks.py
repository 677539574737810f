"""Chapter 02's real-DeepSpeed rank functions (run with ``launch.run(..., deepspeed=True)``).

All ZeRO stages run in one launch: the engine is re-created in the same processes for each
stage. ``gather_trace`` records ZeRO-3's parameter fetches, all-gathers and releases.
"""

import contextlib
import io
import logging

import torch

from gpumem.runs.ds_engine import ds_config, held
from gpumem.runs.training import batches, build, device_of_rank, reset_peak
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
        reset_peak(device)     # the previous stage's engine and model are garbage in cycles until collected
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
# all-gather of the parameters that are not on this rank, and the release back to a shard. Two
# methods of the stage-3 optimizer complete the picture: at ``step()`` it releases every
# parameter (``_partition_all_parameters``), and after the update it all-gathers the persistent
# ones directly, outside the coordinator (``_post_step``).
# Name-mangled private methods: the DeepSpeed version is pinned and tests check they exist.
_COORD = "deepspeed.runtime.zero.partitioned_param_coordinator"
_GATHER = "_PartitionedParameterCoordinator__all_gather_params_"
_RELEASE = "_PartitionedParameterCoordinator__release_param"
_STAGE3 = "deepspeed.runtime.zero.stage3"
_AT_STEP = ("_partition_all_parameters", "_post_step")

# DeepSpeed's defaults measured against one Llama-3-70B layer (856 M parameters).
DEFAULTS_70B = {"stage3_param_persistence_threshold": 1e5, "stage3_max_reuse_distance": 1e9,
                "stage3_prefetch_bucket_size": 5e7, "stage3_max_live_parameters": 1e9}


def scaled_zero3_config(cfg) -> dict:
    """DeepSpeed's stage-3 thresholds scaled from a 70B layer to this model's layer size, so that
    a small model's reuse window, prefetch bucket and live-parameter limit span the same share of
    a layer as the defaults do in Llama-3-70B."""
    ratio = cfg.layer_params() / models.get("llama-3-70b").layer_params()
    scaled = {k: max(int(v * ratio), 1) for k, v in DEFAULTS_70B.items()}
    scaled["stage3_param_persistence_threshold"] = max(scaled["stage3_param_persistence_threshold"],
                                                       cfg.d_model + 1)   # norms stay whole, as in 70B
    return scaled


def _param_event(step: int, event: str, phase: str, params, names: dict) -> dict:
    named = sorted((names.get(id(p), "?"), p.ds_numel * p.element_size()) for p in params)
    return {"step": step, "event": event, "phase": phase, "params": [n for n, _ in named],
            "bytes": sum(b for _, b in named), "param_bytes": [b for _, b in named]}


def gather_trace(rank: int, world: int, model: str = "mini", steps: int = 2, seq: int = 32,
                 batch_per_rank: int = 1, seed: int = 0, scaled: bool = True) -> dict:
    """Every parameter fetch, all-gather and release of ZeRO-3, for each training step; each
    all-gather says which phase its bytes serve."""
    import importlib

    import deepspeed

    from gpumem.runs.zero3_schedule import attribute
    Coord = importlib.import_module(_COORD).PartitionedParameterCoordinator
    Stage3 = importlib.import_module(_STAGE3).DeepSpeedZeroOptimizer_Stage3
    net = build(model, seed)
    names = {id(p): n for n, p in net.named_parameters()}
    modules = {id(m): n or "model" for n, m in net.named_modules()}
    events: list[dict] = []
    state = {"step": 0, "phase": "forward"}
    originals = [(Coord, "fetch_sub_module"), (Coord, _GATHER), (Coord, _RELEASE)] + [(Stage3, n) for n in _AT_STEP]
    orig = {name: getattr(cls, name) for cls, name in originals}

    def fetch(self, module, forward):
        state["phase"] = "forward" if forward else "backward"
        events.append({"step": state["step"], "event": "fetch", "phase": state["phase"],
                       "module": modules.get(id(module), "?")})
        return orig["fetch_sub_module"](self, module, forward)

    def gather(self, params, forward, quantize=False):
        todo = [p for p in params if p.ds_status.name == "NOT_AVAILABLE"]
        if todo:
            events.append(_param_event(state["step"], "all-gather", "forward" if forward else "backward", todo, names))
        return orig[_GATHER](self, params, forward, quantize)

    def release(self, param, free_data=True):
        if param.ds_status.name == "AVAILABLE" and not param.ds_active_sub_modules:
            events.append(_param_event(state["step"], "release", state["phase"], [param], names))
        return orig[_RELEASE](self, param, free_data)

    def partition_all(self):
        state["phase"] = "step"
        return orig["_partition_all_parameters"](self)

    def post_step(self, timer_names):
        todo = [p for p in self.persistent_parameters if p.ds_status.name == "NOT_AVAILABLE"]
        if todo:
            events.append(_param_event(state["step"], "all-gather", "step", todo, names))
        return orig["_post_step"](self, timer_names)

    mine = {"fetch_sub_module": fetch, _GATHER: gather, _RELEASE: release,
            "_partition_all_parameters": partition_all, "_post_step": post_step}
    for cls, name in originals:
        setattr(cls, name, mine[name])
    zero = scaled_zero3_config(net.cfg) if scaled else {}
    try:
        data = batches(net.cfg, steps, world * batch_per_rank, seq, seed)
        with contextlib.redirect_stdout(io.StringIO()):
            engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                              config=ds_config(3, batch_per_rank, zero))
        persistent = sorted(n for n, p in net.named_parameters() if p.ds_persist)
        for step in range(steps):
            state["step"] = step
            mine_ = data[step, rank * batch_per_rank:(rank + 1) * batch_per_rank].to(engine.device)
            loss = engine(mine_[:, :-1], mine_[:, 1:])
            engine.backward(loss)
            engine.step()
        engine.destroy()
    finally:
        for cls, name in originals:
            setattr(cls, name, orig[name])
    events = attribute(events)
    owners = sorted({n.rsplit(".", 1)[0] for n, p in net.named_parameters() if n not in persistent})
    return {"rank": rank, "events": events, "persistent": persistent, "config": zero, "owners": owners,
            "n_layers": net.cfg.n_layers, "counts": gather_counts(events, set(owners))}


def gather_counts(events: list[dict], owners: set[str]) -> dict:
    """Per step: fetches of modules that own sharded parameters; all-gather calls by the phase that
    issues them; parameters and bytes gathered by the per-module fetching (``bytes_gathered``)
    and by the phase they serve (``gathered_for``); the persistent parameters' all-gather after
    the optimizer step; releases (``releases_at_step``: those of the optimizer step)."""
    out: dict = {}
    for e in events:
        row = out.setdefault(f"step{e['step']}", {
            "forward_fetches": 0, "backward_fetches": 0, "forward_all_gathers": 0, "backward_all_gathers": 0,
            "params_gathered": 0, "bytes_gathered": 0, "releases": 0,
            "gathered_for": {"forward": 0, "backward": 0}, "all_gathers_for": {"forward": 0, "backward": 0},
            "after_step_all_gathers": 0, "after_step_params": 0, "after_step_bytes": 0, "releases_at_step": 0})
        if e["event"] == "fetch":
            if e["module"] in owners:
                row[f"{e['phase']}_fetches"] += 1
        elif e["event"] == "all-gather" and e["phase"] == "step":
            row["after_step_all_gathers"] += 1
            row["after_step_params"] += len(e["params"])
            row["after_step_bytes"] += e["bytes"]
        elif e["event"] == "all-gather":
            row[f"{e['phase']}_all_gathers"] += 1
            row["params_gathered"] += len(e["params"])
            row["bytes_gathered"] += e["bytes"]
            for ph in ("forward", "backward"):
                row["gathered_for"][ph] += e["serves"][ph]
            row["all_gathers_for"][max(("backward", "forward"), key=lambda ph: e["serves"][ph])] += 1
        else:
            row["releases"] += 1
            row["releases_at_step"] += e["phase"] == "step"
    return out


def sharded_bytes(events: list[dict]) -> int:
    """Bytes of all parameters DeepSpeed partitions (each counted once), from a trace's releases."""
    seen: dict[str, int] = {}
    for e in events:
        if e["event"] == "release":
            seen[e["params"][0]] = e["bytes"]
    return sum(seen.values())
