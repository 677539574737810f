"""DeepSpeed ZeRO-3's gather schedule, replayed without DeepSpeed: what one training step gathers.

Once DeepSpeed has recorded a step (step 0), every later step follows three rules of its
``PartitionedParameterCoordinator`` (DeepSpeed 0.19.8, ``partitioned_param_coordinator.py``):

* **fetch**: before a module runs, its own parameters are all-gathered unless already whole;
* **prefetch**: then the coordinator walks ahead in the recorded order and all-gathers
  parameters that are not whole until ``stage3_prefetch_bucket_size`` elements are in flight
  (and no more than ``stage3_max_live_parameters`` are whole); parameters it passes that are
  already whole are marked as "needed again at step k";
* **release**: after a module runs, its parameters are freed back to a shard unless they are
  persistent, or marked by the prefetcher as needed later, or used again by a module within the
  next ``stage3_max_reuse_distance`` elements of the recorded order.

At the optimizer step everything is released; persistent parameters (at most
``stage3_param_persistence_threshold`` elements) are all-gathered once after the step and stay
whole for the next forward and backward. :func:`simulate` applies these rules to a module
order; a test replays the order recorded from real DeepSpeed and must produce the recorded
all-gathers and releases exactly. :func:`step_volume` then answers the question a 4-layer model
cannot: what Llama-3-70B gathers per step with DeepSpeed's defaults.
"""

from bisect import bisect_left
from collections import defaultdict, deque

from . import models

DEFAULTS = {"stage3_prefetch_bucket_size": 5e7, "stage3_max_reuse_distance": 1e9,
            "stage3_max_live_parameters": 1e9, "stage3_param_persistence_threshold": 1e5}


def replays(cfg: models.ModelConfig) -> bool:
    """Whether :func:`llama_params` and :func:`fetch_order` are this model's own modules, so that
    :func:`simulate` replays it: the course's Llama layout (dense SwiGLU MLP, two RMSNorms a layer,
    separate q/k/v, RoPE, an untied head), biases allowed (they only add parameters to the same
    modules). Not: q/k norms (Qwen3: modules of their own in the fetch order), four norms a layer
    (Gemma 2), a tied head (one parameter in two modules), GPT-2's blocks, a mixture of experts."""
    return (cfg.mlp == "swiglu" and not cfg.moe and cfg.norm_kind == "rms" and cfg.norms_per_layer == 2
            and not (cfg.qk_norm or cfg.fused_qkv or cfg.tie_embeddings or cfg.positions))


def llama_params(cfg: models.ModelConfig, tp: int = 1) -> dict[str, list[tuple[str, int]]]:
    """Module name -> its own parameters (name, elements), for the course's Llama; with ``tp``,
    one tensor-parallel rank's slice (Megatron splits every matrix and the vocabulary, not the norms).
    Biases (Qwen2's q/k/v) are parameters of their linear module, split as its output is (the
    row-parallel wo and down keep theirs whole)."""
    d, q, kv, f, v = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.ffn, cfg.vocab
    bias = {"attn.wq": q * cfg.qkv_bias, "attn.wk": kv * cfg.qkv_bias, "attn.wv": kv * cfg.qkv_bias,
            "attn.wo": d * cfg.o_bias, "mlp.gate": f * cfg.mlp_bias, "mlp.up": f * cfg.mlp_bias,
            "mlp.down": d * cfg.mlp_bias}
    out = {"model": [], "embed": [("embed.weight", -(-v * d // tp))], "norm": [("norm.weight", d)],
           "head": [("head.weight", -(-v * d // tp))]}
    for i in range(cfg.n_layers):
        L = f"layers.{i}"
        out |= {L: [], f"{L}.attn": [], f"{L}.mlp": [],
                f"{L}.attn_norm": [(f"{L}.attn_norm.weight", d)], f"{L}.mlp_norm": [(f"{L}.mlp_norm.weight", d)]}
        for name, n in (("attn.wq", d * q), ("attn.wk", d * kv), ("attn.wv", d * kv), ("attn.wo", q * d),
                        ("mlp.gate", d * f), ("mlp.up", d * f), ("mlp.down", f * d)):
            split = 1 if name in ("attn.wo", "mlp.down") else tp     # a row-parallel bias is whole
            out[f"{L}.{name}"] = [(f"{L}.{name}.weight", -(-n // tp))] + (
                [(f"{L}.{name}.bias", -(-bias[name] // split))] if bias[name] else [])
    return out


def fetch_order(cfg: models.ModelConfig) -> list[tuple[str, str]]:
    """(phase, module) in the order ZeRO-3 fetches modules in one training step of the course's
    Llama: containers too (they own nothing), forward then backward."""
    fwd, bwd = [("forward", "model"), ("forward", "embed")], [("backward", "model"), ("backward", "head"),
                                                              ("backward", "norm")]
    for i in range(cfg.n_layers):
        L = f"layers.{i}"
        fwd += [("forward", f"{L}{m}") for m in ("", ".attn_norm", ".attn", ".attn.wq", ".attn.wk", ".attn.wv",
                                                    ".attn.wo", ".mlp_norm", ".mlp", ".mlp.gate", ".mlp.up", ".mlp.down")]
    for i in reversed(range(cfg.n_layers)):
        L = f"layers.{i}"
        bwd += [("backward", f"{L}{m}") for m in ("", ".mlp", ".mlp.down", ".mlp.up", ".mlp.gate", ".mlp_norm",
                                                     ".attn", ".attn.wo", ".attn.wv", ".attn.wk", ".attn.wq", ".attn_norm")]
    return fwd + [("forward", "norm"), ("forward", "head")] + bwd + [("backward", "embed")]


def persistent(params: dict[str, list[tuple[str, int]]], threshold: float) -> set[str]:
    """Parameters DeepSpeed keeps whole: at most ``threshold`` elements."""
    return {p for own in params.values() for p, n in own if n <= threshold}


def owner(param: str) -> str:
    """The module a parameter belongs to (``layers.0.attn.wq.weight`` -> ``layers.0.attn.wq``)."""
    return param.rsplit(".", 1)[0]


def _reused(positions: list[int], start: int, walked: list[int], reuse: float) -> bool:
    """Whether the first use at or after ``start`` is reached while fewer than ``reuse`` elements
    of ``order[start:]`` have been walked (``walked``: prefix sums of elements)."""
    i = bisect_left(positions, start)
    return i < len(positions) and walked[positions[i]] - walked[start] < reuse


def simulate(order: list[tuple[str, str]], params: dict[str, list[tuple[str, int]]], config: dict | None = None,
             elem_bytes: int = 2, step: int = 1) -> list[dict]:
    """Fetches, all-gathers and releases of one step after the trace is recorded, as DeepSpeed
    issues them, in the trace's format (``event``, ``step``, ``phase``; ``module`` or ``params``,
    ``bytes``). An all-gather also says which phase each of its bytes ``serves``, read off the
    queue entry that caused it. The optimizer step's release of everything and the persistent
    parameters' gather follow with phase ``"step"``."""
    cfg = DEFAULTS | (config or {})
    bucket, reuse, live = (cfg["stage3_prefetch_bucket_size"], cfg["stage3_max_reuse_distance"],
                           cfg["stage3_max_live_parameters"])
    keep = persistent(params, cfg["stage3_param_persistence_threshold"])
    numel = {p: n for own in params.values() for p, n in own}
    whole = set(keep)                                  # gathered after the previous step
    queue = deque((p, k) for k, (_, m) in enumerate(order) for p, _ in sorted(params[m]))
    recent: dict[str, float] = defaultdict(lambda: -1e10)
    events: list[dict] = []
    state = {"live": 0}
    walked = [0]                                       # elements of order[:i], for every i
    uses: dict[str, list[int]] = defaultdict(list)     # parameter -> positions in order that use it
    for i, (_, m) in enumerate(order):
        walked.append(walked[-1] + sum(n for _, n in params[m]))
        for p, _ in params[m]:
            uses[p].append(i)

    def gather(todo: dict[str, str], phase: str) -> None:       # param -> phase it serves
        todo = {p: ph for p, ph in todo.items() if p not in whole}
        if todo:
            whole.update(todo)
            state["live"] += sum(numel[p] for p in todo)
            serves = {"forward": 0, "backward": 0}
            for p, ph in todo.items():
                serves[ph] += elem_bytes * numel[p]
            events.append({"event": "all-gather", "step": step, "phase": phase, "params": sorted(todo),
                           "bytes": elem_bytes * sum(numel[p] for p in todo), "serves": serves,
                           "param_bytes": [elem_bytes * numel[p] for p in sorted(todo)]})

    def release(p: str, phase: str) -> None:
        if p in whole:
            whole.discard(p)
            state["live"] -= numel[p]
            events.append({"event": "release", "step": step, "phase": phase, "params": [p],
                           "bytes": elem_bytes * numel[p]})

    for k, (phase, module) in enumerate(order):
        events.append({"event": "fetch", "step": step, "phase": phase, "module": module})
        own = [p for p, _ in params[module]]
        gather({p: phase for p in own}, phase)         # fetch what this module needs now
        due = {p for p in own if recent[p] < k}
        popped = set()
        while queue and len(popped) < len(due):        # this module's own entries leave the queue
            p, s = queue.popleft()
            recent[p] = s
            popped.add(p)
        if bucket > 0:                                 # prefetch ahead in the recorded order
            room, ahead, n = min(live - state["live"], bucket), {}, 0
            while queue and n < room:
                p, s = queue.popleft()
                if p not in whole and p not in ahead:
                    ahead[p] = order[s][0]             # the phase of the use it is fetched for
                    n += numel[p]
                recent[p] = max(recent[p], s)
            gather(ahead, phase)
        step_id = k + 1                                # the module has run: release what may go
        free = {p for p in own if p not in keep and recent[p] <= step_id}
        # kept for reuse: a parameter whose next use starts before max_reuse_distance elements of
        # the modules after this one have been walked (DeepSpeed walks them in order and stops once
        # that many are seen); prefix sums and each parameter's uses answer it without the walk
        free = {p for p in free if not _reused(uses[p], step_id, walked, reuse)}
        for p in own:
            if p in free:
                release(p, phase)
    for p in sorted(whole):                            # the optimizer step releases everything
        release(p, "step")
    gather({p: "forward" for p in sorted(keep)}, "step")   # persistent ones return for the next forward
    return events


def attribute(events: list[dict]) -> list[dict]:
    """Add ``serves`` to every all-gather of a recorded trace: per phase, the bytes whose next
    use is that phase's fetch of the owning module (a prefetch issued in forward for a module's
    backward serves backward). A gather after the optimizer step serves the next forward."""
    out = [dict(e) for e in events]
    for i, e in enumerate(out):
        if e["event"] != "all-gather":
            continue
        sizes = e.get("param_bytes") or [e["bytes"] // len(e["params"])] * len(e["params"])
        serves = {"forward": 0, "backward": 0}
        for p, b in zip(e["params"], sizes):
            nxt = next((f for f in out[i + 1:] if f["event"] == "fetch" and f["module"] == owner(p)), None)
            serves[nxt["phase"] if nxt else "forward"] += b
        e["serves"] = serves
    return out


def peak_gathered(events: list[dict], step: int, skip: set[str] = frozenset()) -> dict:
    """The most parameter bytes gathered but not yet released at any moment of ``step`` (real
    trace or replay), leaving out ``skip`` (the persistent parameters, whole throughout), the
    module being fetched at that moment and the parameters whole then."""
    live: dict[str, int] = {}
    best, where, current, whole = 0, None, None, []
    for e in events:
        if e["step"] != step:
            continue
        if e["event"] == "fetch":
            current = f"{e['phase']} {e['module']}"
        elif e["event"] == "all-gather" and e["phase"] != "step":
            live.update(zip(e["params"], e["param_bytes"]))
        elif e["event"] == "release":
            live.pop(e["params"][0], None)
        now = sum(b for p, b in live.items() if p not in skip)
        if now > best:
            best, where, whole = now, current, sorted(p for p in live if p not in skip)
    return {"bytes": best, "at": where, "whole": whole}


def steady_peak(model: str | models.ModelConfig, config: dict | None = None, elem_bytes: int = 2) -> dict:
    """The most gathered parameter bytes a rank holds at once in a steady step (prefetch and
    reuse at work), replayed with DeepSpeed's rules; step 0, which fetches on demand, peaks at
    the largest module instead. ``config``: DeepSpeed's stage-3 keys (default: theirs)."""
    cfg = models.get(model) if isinstance(model, str) else model
    params = llama_params(cfg)
    keys = DEFAULTS | (config or {})
    events = simulate(fetch_order(cfg), params, keys, elem_bytes=elem_bytes)
    return peak_gathered(events, 1, persistent(params, keys["stage3_param_persistence_threshold"]))


def gathered_by_moment(model: str | models.ModelConfig, config: dict | None = None, elem_bytes: int = 2,
                       tp: int = 1) -> dict[tuple[str, str], int]:
    """(phase, module) -> the most gathered parameter bytes (persistent ones left out) while that
    module runs in a steady step: its own parameters, what is prefetched for the modules after it,
    and what is kept whole for reuse. The largest value is :func:`steady_peak`'s."""
    cfg = models.get(model) if isinstance(model, str) else model
    params = llama_params(cfg, tp)
    keys = DEFAULTS | (config or {})
    skip = persistent(params, keys["stage3_param_persistence_threshold"])
    live: dict[str, int] = {}
    out: dict[tuple[str, str], int] = {}
    current = None
    for e in simulate(fetch_order(cfg), params, keys, elem_bytes=elem_bytes):
        if e["phase"] == "step":
            continue
        if e["event"] == "fetch":
            current = (e["phase"], e["module"])
        elif e["event"] == "all-gather":
            live.update((p, b) for p, b in zip(e["params"], e["param_bytes"]) if p not in skip)
        else:
            live.pop(e["params"][0], None)
        out[current] = max(out.get(current, 0), sum(live.values()))
    return out


def reuse_gap(model: str | models.ModelConfig, module: str) -> int:
    """Elements of the other modules' weights that the recorded order runs between ``module``'s
    forward and its backward: DeepSpeed keeps the module whole in between only if this is below
    ``stage3_max_reuse_distance`` (or a prefetch has already marked it)."""
    cfg = models.get(model) if isinstance(model, str) else model
    params, order = llama_params(cfg), fetch_order(cfg)
    start, end = order.index(("forward", module)), order.index(("backward", module))
    return sum(n for _, m in order[start + 1:end] if m != module for _, n in params[m])


def step_volume(model: str | models.ModelConfig, config: dict | None = None) -> dict:
    """Elements ZeRO-3 all-gathers in one steady-state step of the course's Llama, by the phase
    that issues them and by the phase they serve, in units of psi (the parameter count); the
    gradient reduce-scatter adds 1 psi. ``config``: DeepSpeed's stage-3 keys (default: theirs)."""
    cfg = models.get(model) if isinstance(model, str) else model
    params = llama_params(cfg)
    gathers = [e for e in simulate(fetch_order(cfg), params, config, elem_bytes=1) if e["event"] == "all-gather"]
    psi = cfg.n_params()
    issued = {ph: sum(e["bytes"] for e in gathers if e["phase"] == ph) for ph in ("forward", "backward", "step")}
    served = {ph: sum(e["serves"][ph] for e in gathers) for ph in ("forward", "backward")}
    total = sum(issued.values())
    return {"model": cfg.name, "n_params": psi, "gathered_elements": issued, "served_elements": served,
            "gathered_psi": total / psi, "for_forward_psi": served["forward"] / psi,
            "for_backward_psi": served["backward"] / psi, "reduce_scattered_psi": 1.0,
            "per_step_psi": total / psi + 1.0}
