"""The planner's search: every way to lay a model's training out on a set of GPUs, what fits,
ranked by time.

``plan(model, gpus, gpu=..., seq=..., global_batch=...)`` (or ``plan(question)``, a
:class:`~.question.Question`) enumerates precision recipe x ZeRO stage x hybrid sharding x
checkpoint policy x attention kernel x offload x micro-batch x tensor-, context- and
pipeline-parallel degree x virtual pipeline stages, and keeps a layout when its per-GPU bytes
(``planner.memory``) fit the GPU's capacity minus a stated :class:`~gpumem.memory.gpus.Reserve`,
its host-side bytes fit the node's host memory and its NVMe bytes the node's drives. What fits
is priced by ``planner.cost`` and ordered by ``planner.ranking`` (step time, ties within 0.5 %
of the fastest broken by headroom, recipe, offloaded bytes). Each plan carries its memory and
time breakdowns, framework (``Layout.framework``), DeepSpeed config, FSDP equivalent and, for
Megatron layouts, their arguments (``planner.config``).

The rules every layout keeps are ``planner.rules``' (DeepSpeed's, Megatron-Core's and hybrid
sharding's); a layout no framework runs is not a plan. Tensor parallelism stays inside a node and
divides the key/value heads; context parallelism (cp) and virtual stages (vp) are Megatron-Core's.
Every plan runs exactly the global batch asked for: dp x micro-batch x accumulation = global
batch, so a layout whose dp does not divide it is not a plan; when no layout's does, :func:`plan`
names the nearest global batches that run (``planner.advice.nearest_batches``). Pipeline stages
that do not divide the layers are split as ``stage_split`` says, and the fullest stage is
counted. When nothing fits, :func:`plan` says how many bytes the closest layout misses by and the
smallest change of each kind that fits (``planner.advice``).
"""

from ..errors import UsageError, one_of, positive_int
from ..memory import bf16_rounding, gpus as gpu_table, models
from ..memory.models import ModelConfig
from ..timing.offload_time import datasheet_links
from . import moe, ranking, rules
from .advice import advise as _advise, check_capacity, nearest_batches
from .answer import Answer, Plan, Result  # noqa: F401 (re-exported)
from .config import deepspeed_config, fsdp_equivalent, megatron_args, model_code
from .cost import assumptions, step_seconds
from .memory import Layout, middle_stage, per_gpu, stage_layers, states_part
from .placement import node_for, per_gpu_network
from .question import (DEFAULT_TOKENS, GPUS_PER_NODE, HOST_PER_NODE, MICRO_BATCHES,  # noqa: F401
                       NVME_PER_NODE, OFFLOAD_CHOICES, PLANNABLE_RECIPES, RECIPES, Question)
from .rules import allowed  # noqa: F401 (re-exported)
from .swap_buffers import offload_buffers

TIE = ranking.TIE


def _divisors(n: int, most: int | None = None) -> list[int]:
    """The divisors of ``n`` up to ``most`` (all when None), ascending, in O(sqrt(n)) steps."""
    small, large, d = [], [], 1
    while d * d <= n and (most is None or d <= most):
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return [x for x in small + large[::-1] if most is None or x <= most]


def parallel_degrees(cfg: ModelConfig, gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> list[tuple[int, int, int]]:
    """(tp, pp, dp) with tp * pp * dp = gpus; tp divides the key/value heads and fits a node; pp <= L."""
    out = []
    for tp in _divisors(gpus, gpus_per_node):
        if cfg.n_kv_heads % tp or cfg.n_heads % tp:
            continue
        for pp in _divisors(gpus // tp, cfg.n_layers):
            out.append((tp, pp, gpus // (tp * pp)))
    return out


def layouts_of(cfg: ModelConfig, gpus: int, seq: int, global_batch: int, opts: dict):
    """Yield ``(tp, cp, pp, vp, dp, replica, micro)`` for every placement of ``gpus`` the options
    allow: tp x cp x pp x dp = gpus, dp dividing the global batch (``replica`` sequences each),
    ``micro`` the micro-batches dividing the replica's share, cp dividing the sequence in 2 cp
    chunks, vp dividing each stage's layers (Megatron-Core's rules, ``planner.rules``)."""
    gpn = opts["gpus_per_node"]
    for tp, pp, rest in parallel_degrees(cfg, gpus, gpn):
        if opts.get("tp") and tp not in opts["tp"] or opts.get("pp") and pp not in opts["pp"]:
            continue
        for cp in opts.get("cp", (1,)):
            if rest % cp or cp > 1 and (seq % (2 * cp) or gpn % tp or (tp * cp) % gpn and gpn % (tp * cp)):
                continue   # ring attention's split, and its group placed evenly on nodes
            dp = rest // cp
            if global_batch % dp:
                continue   # dp x micro-batch x accumulation could not be the global batch
            replica = global_batch // dp
            micro = [m for m in opts["micro_batches"] if replica % m == 0]
            for vp in opts.get("vp", (1,)):
                if vp == 1 or pp > 1 and cfg.n_layers % (pp * vp) == 0:
                    yield tp, cp, pp, vp, dp, replica, micro


def _states_ok(cfg: ModelConfig, base: Layout, mid: bool, opts: dict, ranks_per_node: int) -> tuple | None:
    """(ends' states, middle's states) of ``base`` when its host and drive bytes fit a node, else None."""
    st = states_part(cfg, base)
    ms = states_part(cfg, base, "middle") if mid else st
    host = max(st["host"], ms["host"]) + sum(v for k, v in offload_buffers(cfg, base).items() if k.endswith("swap"))
    nvme = max(st["nvme"], ms["nvme"])
    if host * ranks_per_node > opts["host_per_node"] or nvme * ranks_per_node > opts["nvme_per_node"]:
        return None
    return st, ms


def candidates(cfg: ModelConfig, gpus: int, seq: int, global_batch: int, usable: int, opts: dict,
               closest: dict | None = None, count: dict | None = None):
    """Yield ``(layout, memory)`` for every layout that fits, lazily (a caller wanting one stops
    after the first); ``closest`` (a dict) is updated with the layout that misses by the fewest
    bytes; ``count`` (a dict) gets ``considered`` (every layout enumerated) and ``evaluated``
    (those whose bytes were computed)."""
    if getattr(candidates, "refusing", ""): raise RuntimeError(candidates.refusing)  # noqa: E701 (lab06_guard)
    count = {} if count is None else count
    count.setdefault("considered", 0)
    count.setdefault("evaluated", 0)
    gpn = opts["gpus_per_node"]
    ranks_per_node = min(gpus, gpn)
    for tp, cp, pp, vp, dp, replica, micro in layouts_of(cfg, gpus, seq, global_batch, opts):
        mcore = cp > 1 or vp > 1
        kernels = [k for k in opts["attentions"] if k == "flash" or cp == 1]
        mid = middle_stage(cfg, pp) is not None
        groups = _shard_groups(gpn // tp, dp) if pp == 1 and cp == 1 else []
        for recipe in opts["recipes"]:
            for zero in opts["zero"]:
                for hybrid, group in [("none", 0)] * ("none" in opts.get("hybrid", ("none",))) + [
                        (h, g) for h in opts.get("hybrid", ()) if h != "none" and zero == 3 for g in groups]:
                    for offload, device in opts["offloads"]:
                        engines = _engines(opts, tp, pp, cp, vp, zero, offload, hybrid)
                        eps = moe.degrees(cfg, tp, pp, cp, dp, zero, offload, hybrid, opts.get("ep"))   # 1 if dense
                        count["considered"] += len(engines) * len(opts["checkpoints"]) * len(opts["attentions"]) \
                            * len(micro) * len(eps)
                        if not rules.allowed(recipe, zero, pp, offload, device, tp):
                            continue
                        if mcore and (zero > 1 or offload != "none"):
                            continue   # Megatron-Core: distributed optimizer at most, no offload
                        if dp * cp == 1 and offload == "none" and zero > (1 if recipe == "pure-bf16" else 0):
                            continue   # nothing to shard over: the same bytes as the lowest stage
                        for core, ep in [(c, x) for c in engines for x in eps]:
                            base = Layout(recipe, zero, "none", "flash", offload, device, 1, tp, pp, dp, replica, cp,
                                          vp, hybrid, group, core, ep)
                            if hybrid != "none" and rules.hybrid(base):
                                continue
                            states = _states_ok(cfg, base, mid, opts, ranks_per_node)
                            if states is None:
                                continue
                            yield from _inner(cfg, seq, base, states, mid, micro, kernels, opts, usable, closest,
                                              count)


def _shard_groups(node_ranks: int, dp: int) -> list[int]:
    """Hybrid sharding's shard groups: the data-parallel ranks of one node, two, four, ... nodes,
    as long as the group divides dp and leaves at least two replicas (a 70B model's 16 B a
    parameter do not fit one node's eight GPUs, so larger groups are tried)."""
    out, g = [], max(node_ranks, 2)
    while 2 * g <= dp:
        if dp % g == 0:
            out.append(g)
        g *= 2
    return out


def _engines(opts: dict, tp: int, pp: int, cp: int, vp: int, zero: int, offload: str, hybrid: str) -> tuple:
    """``mcore`` values to try: a tensor- or pipeline-parallel layout that Megatron-Core could run
    (ZeRO 0/1, no offload, no hybrid sharding) is tried under DeepSpeed (or Megatron-DeepSpeed) and
    under Megatron-Core; layouts with cp or vp are Megatron-Core's anyway."""
    if opts.get("mcore", True) and cp == 1 and vp == 1 and (tp > 1 or pp > 1) and zero <= 1 \
            and offload == "none" and hybrid == "none":
        return (False, True)
    return (False,)


def _inner(cfg: ModelConfig, seq: int, base: Layout, states: tuple, mid: bool, micro: list, kernels: list,
           opts: dict, usable: int, closest: dict | None, count: dict):
    """The checkpoint x kernel x micro-batch loop of one ``base`` layout (see :func:`candidates`);
    the micro-batch loop stops at the first size that does not fit."""
    if getattr(_inner, "refusing", ""): raise RuntimeError(_inner.refusing)  # noqa: E701 (lab06_guard)
    b = base
    for policy in opts["checkpoints"]:
        for kernel in kernels:
            for mb in micro:
                if b.vp > 1 and (b.n_micro // mb) % b.pp:
                    continue   # interleaving needs micro-batches a multiple of pp
                lay = Layout(b.recipe, b.zero, policy, kernel, b.offload, b.device, mb, b.tp, b.pp, b.dp,
                             b.n_micro // mb, b.cp, b.vp, b.hybrid, b.group, b.mcore, b.ep)
                mem = per_gpu(cfg, seq, lay, states[0], states[1] if mid else None, where := {}) | where
                count["evaluated"] += 1
                if mem["total"] > usable:
                    if closest is not None and (not closest or mem["total"] < closest["total"]):
                        closest.clear()
                        closest.update(mem, label=lay.label(), missing=mem["total"] - usable)
                    break
                yield lay, mem


def plan(model, gpus: int | None = None, gpu: str = "h100-80gb", **keywords) -> Result:
    """Every layout of ``model`` on ``gpus`` GPUs that fits, ranked (``planner.ranking``).

    ``model`` may be a :class:`~.question.Question` (then nothing else is passed), or a registry
    name / ``ModelConfig`` with ``gpus``, ``gpu`` and the keywords of :meth:`Question.of`:
    ``gpu_mem`` (bytes), ``seq``, ``global_batch`` (sequences per step; default 4M tokens' worth),
    the levers (``recipes`` -- mixed only unless pure-bf16 is asked --, ``zero``, ``offloads``,
    ``checkpoints``, ``attentions``, ``micro_batches``, ``tp``, ``pp``, ``cp``, ``vp``, ``hybrid``, ``ep``),
    the cluster (``gpus_per_node``, ``inter_node`` in bytes/s per GPU, ``host_per_node``,
    ``nvme_per_node``, ``links``, ``cpu_adam_rate`` in parameters/s per node), ``reserve``,
    ``mfu`` and ``advise``."""
    if getattr(plan, "refusing", ""): raise RuntimeError(plan.refusing)  # noqa: E701 (lab06_guard)
    q = model if isinstance(model, Question) else Question.of(model, gpus, gpu, **keywords)
    return answer(q)


def answer(q: Question) -> Result:
    """:func:`plan` for a :class:`~.question.Question`."""
    c = q.cluster
    cfg = models.get(q.model) if isinstance(q.model, str) else q.model
    gpus, seq = positive_int(q.gpus, "GPU count"), positive_int(q.seq, "sequence length")
    for r in q.levers.recipes:
        one_of(r, PLANNABLE_RECIPES, "planner recipe")
    g = gpu_table.get(c.gpu)
    if not g.bf16_flops:
        raise UsageError(f"{g.name} has no bf16 tensor cores and the planner's recipes train in bf16; accepted: "
                         + ", ".join(n for n, x in gpu_table.REGISTRY.items() if x.bf16_flops))
    capacity = g.capacity if c.gpu_mem is None else positive_int(c.gpu_mem, "GPU memory")
    global_batch = positive_int(q.global_batch, "global batch") if q.global_batch is not None \
        else max(1, DEFAULT_TOKENS // seq)
    usable = gpu_table.usable(capacity, q.reserve)
    check_capacity(capacity, q.reserve)
    ranks_on_node = min(gpus, c.gpus_per_node)
    links = c.links or datasheet_links(g.name, adam_rate=c.cpu_adam_rate, ranks_on_node=ranks_on_node)
    node = node_for(g, c.gpus_per_node, None if c.inter_node is None else float(c.inter_node))
    opts = q.options()
    closest: dict = {}
    plans, count = [], {}
    for lay, mem in candidates(cfg, gpus, seq, global_batch, usable, opts, closest, count=count):
        plans.append(price(cfg, seq, lay, mem, g, usable, q.mfu, links, c.gpus_per_node, c.inter_node))
    question = {"model": cfg.name, "n_params": cfg.n_params(), "gpus": gpus, "gpu": g.name,
                "capacity": capacity, "usable": usable, "reserve": q.reserve.of(capacity),
                "seq": seq, "global_batch": global_batch, "mfu": q.mfu, "inter_node": per_gpu_network(node),
                "node": node.label, "recipes": list(q.levers.recipes), "cpu_adam_per_rank": links.cpu_adam,
                "tight_below": ranking.tight_limit(usable)}
    notes = [bf16_rounding.risk_line()] if "pure-bf16" in q.levers.recipes else []
    result = Result(question, ranking.rank(plans), count["considered"], closest or None,
                    assumptions=assumptions(g, q.reserve, q.mfu, links, node, opts) + moe.assumptions(cfg),
                    evaluated=count["evaluated"],
                    notes=notes, asked=q)
    if not plans and q.advise:   # no layout's dp divides the batch: the batches that run; else what to change
        result.advice = nearest_batches(cfg, gpus, capacity, seq, global_batch, q.reserve, opts, fits_any,
                                        parallel_degrees) or _advise(cfg, gpus, g, capacity, seq, global_batch,
                                                                     q.reserve, opts, closest, fits_any, OFFLOAD_CHOICES)
    return result


def price(cfg: ModelConfig, seq: int, lay: Layout, mem: dict, g: gpu_table.GPU, usable: int, mfu: float,
          links, gpus_per_node: int, inter_node: float | None) -> Plan:
    """The :class:`Plan` of ``lay`` whose per-GPU bytes are ``mem`` (``per_gpu``): its step time,
    host buffers, headroom against ``usable`` (``tight`` below ``ranking.tight_limit``) and the
    switches that set it up."""
    t = step_seconds(cfg, seq, lay, g, mfu, links, gpus_per_node, inter_node)
    tokens = lay.micro_batch * lay.n_micro * lay.dp * seq   # = global_batch x seq (see candidates)
    buf = offload_buffers(cfg, lay)
    swap = buf["param_swap"] + buf["optimizer_swap"]
    room = usable - mem["total"]
    mem = mem | {"usable": usable, "headroom": room, "tight": ranking.tight(room, usable), "host_states": mem["host"],
                 "host_buffers": swap, "host": mem["host"] + swap}
    return Plan(lay, mem, t, tokens / t["total"], deepspeed_config(cfg, lay), fsdp_equivalent(lay),
                model_code(lay), megatron_args(cfg, lay), stage_layers(cfg, lay.pp))


def fits_any(cfg: ModelConfig, gpus: int, capacity: int, seq: int, global_batch: int,
             reserve: gpu_table.Reserve, opts: dict) -> Layout | None:
    """The first layout that fits (no ranking), or None: what the advice searches with."""
    usable = gpu_table.usable(capacity, reserve)
    for lay, _ in candidates(cfg, gpus, seq, global_batch, usable, opts):
        return lay
    return None
