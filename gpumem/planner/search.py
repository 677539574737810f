"""The planner: every way to lay a model's training out on a set of GPUs, what fits, ranked by time.

``plan(model, gpus, gpu=..., seq=..., global_batch=...)`` enumerates precision recipe x ZeRO
stage x checkpoint policy x attention kernel x offload x micro-batch x tensor-parallel and
pipeline-parallel degree, and keeps a layout when its per-GPU bytes (``planner.memory``) fit
the GPU's capacity minus a stated :class:`~gpumem.memory.gpus.Reserve`, its host-side bytes fit
:data:`HOST_PER_NODE` and its NVMe bytes :data:`NVME_PER_NODE`. What fits is ranked by the
estimated step time of ``planner.cost`` (compute at a stated MFU, communication at the GPU
table's link bandwidths, offload traffic from ``offload_time``). Each plan carries its memory
breakdown, time breakdown, framework (``Layout.framework``), DeepSpeed config, FSDP equivalent
and, for 3-D layouts, Megatron-DeepSpeed's arguments (``planner.config``).

Rules the enumeration keeps (DeepSpeed 0.19.8): ZeRO-2 and 3 are refused with pipeline
parallelism (``pipe/engine.py``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
parallelism"); DeepSpeed's AutoTP is not combined with pipeline stages (its mesh is 2-D, data x
tensor: ``utils/groups.py`` ``_init_tp_mesh_device``), so tensor x pipeline layouts are planned as
Megatron-DeepSpeed's 3-D parallelism (``Layout.framework``: Megatron tensor parallelism with
sequence parallelism in a node, DeepSpeed's pipeline engine across nodes, ZeRO-0/1 over data
parallelism, no offload), the way 405B-class models are trained; pure bf16 (``bf16_optimizer_states``) needs ZeRO 1-3; offload follows
``accounting.check_offload``; tensor parallelism stays inside a node and divides the key/value
heads. Every plan runs exactly the global batch asked for: dp x micro-batch x accumulation =
global batch, so a layout whose dp does not divide it is not a plan; when no layout's does,
:func:`plan` names the nearest global batches that run (``planner.advice.nearest_batches``).
Pipeline stages that do not divide the layers are split as ``stage_split`` says, and the fullest
stage is counted. When nothing fits, :func:`plan` says how many bytes the closest layout misses
by and the smallest change of each kind that fits (``planner.advice``).
"""

import math
from dataclasses import asdict, dataclass, field

from ..errors import UsageError, positive_int
from ..memory import accounting, gpus as gpu_table, models
from ..memory.models import ModelConfig
from ..timing import compute
from ..timing.offload_time import Links, datasheet_links
from ..memory.policies import KERNELS, POLICIES
from .advice import advise as _advise, check_capacity, nearest_batches
from .config import deepspeed_config, fsdp_equivalent, megatron_args, model_code
from .cost import GPUS_PER_NODE, assumptions, step_seconds
from .placement import node_for, per_gpu_network
from .memory import Layout, middle_stage, per_gpu, stage_layers, states_part
from .swap_buffers import offload_buffers

TB = 10**12
HOST_PER_NODE = 2 * TB      # DGX H100: 2 TB of system memory per 8 GPUs (stated)
NVME_PER_NODE = 30 * TB     # DGX H100: 8 x 3.84 TB U.2 NVMe data drives (stated)
RECIPES = ("mixed", "pure-bf16")
OFFLOAD_CHOICES = (("none", "cpu"), ("optimizer", "cpu"), ("optimizer", "nvme"),
                   ("optimizer+params", "cpu"), ("optimizer+params", "nvme"))
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
DEFAULT_TOKENS = 4 * 2**20   # Llama 3's first-stage batch: 4M tokens (1,024 x 4,096; arXiv:2407.21783)


@dataclass
class Plan:
    """One layout that fits: memory and time per GPU, and the switches that set it up."""
    layout: Layout
    memory: dict
    time: dict
    tokens_per_s: float
    deepspeed: dict
    fsdp: dict | None
    model_code: dict
    megatron: list | None = None   # Megatron-DeepSpeed's command-line arguments (3-D layouts)
    stages: tuple = ()             # layers of each pipeline stage, first to last

    def as_dict(self) -> dict:
        """JSON-ready: the layout's fields, its breakdowns and configs."""
        return {"label": self.layout.label(), "framework": self.layout.framework,
                "layout": asdict(self.layout) | {"framework": self.layout.framework,
                                                 "sequence_parallel": self.layout.sequence_parallel,
                                                 "stage_layers": list(self.stages)},
                "memory": self.memory,
                "time": self.time, "tokens_per_s": self.tokens_per_s, "deepspeed": self.deepspeed,
                "fsdp": self.fsdp, "model_code": self.model_code, "megatron": self.megatron}


@dataclass
class Result:
    """What :func:`plan` found: the question, the ranked plans, and advice when none fits."""
    question: dict
    plans: list[Plan]
    considered: int          # every layout enumerated: rejected, pruned and fitting
    closest: dict | None = None
    advice: dict | None = None
    assumptions: list[str] = field(default_factory=list)
    evaluated: int = 0       # layouts whose bytes were computed (the rest pruned or refused first)

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None

    def distinct(self, top: int = 10) -> list[Plan]:
        """The best plan of each (recipe, ZeRO, tp, pp, offload) combination, ranked, at most ``top``."""
        seen, out = set(), []
        for p in self.plans:
            key = (p.layout.recipe, p.layout.zero, p.layout.tp, p.layout.pp, p.layout.offload, p.layout.device)
            if key not in seen:
                seen.add(key)
                out.append(p)
        return out[:top]

    def as_dict(self, top: int = 10) -> dict:
        """JSON-ready, with the ``top`` distinct plans (all fitting plans are counted)."""
        return {"question": self.question, "considered": self.considered, "evaluated": self.evaluated,
                "fitting": len(self.plans),
                "plans": [p.as_dict() for p in self.distinct(top)], "closest": self.closest,
                "advice": self.advice, "assumptions": self.assumptions}


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


def allowed(recipe: str, zero: int, pp: int, offload: str, device: str, tp: int = 1) -> bool:
    """Whether DeepSpeed accepts the combination (see the module docstring)."""
    if pp > 1 and zero >= 2:
        return False
    if pp > 1 and tp > 1 and offload != "none":
        return False   # Megatron-DeepSpeed 3-D layouts are planned without offload
    if recipe == "pure-bf16" and zero == 0:
        return False
    try:
        accounting.check_offload(zero, offload, device)
    except UsageError:
        return False
    return True


def candidates(cfg: ModelConfig, gpus: int, seq: int, global_batch: int, usable: int, opts: dict,
               closest: dict | None = None, first_only: bool = False, count: dict | None = None):
    """Yield ``(layout, memory)`` for every layout that fits; ``closest`` (a dict) is updated
    with the layout that misses by the fewest bytes; ``count`` (a dict) gets ``considered``
    (every layout enumerated) and ``evaluated`` (those whose bytes were computed). Only degrees
    whose dp divides ``global_batch``, and micro-batches dividing each replica's share, run it."""
    count = {} if count is None else count
    count.setdefault("considered", 0)
    count.setdefault("evaluated", 0)
    gpn = opts["gpus_per_node"]
    ranks_per_node = min(gpus, gpn)
    for tp, pp, dp in parallel_degrees(cfg, gpus, gpn):
        if opts.get("tp") and tp not in opts["tp"] or opts.get("pp") and pp not in opts["pp"]:
            continue
        if global_batch % dp:
            continue   # dp x micro-batch x accumulation could not be the global batch
        replica = global_batch // dp
        micro = [m for m in opts["micro_batches"] if replica % m == 0]
        inner = len(opts["checkpoints"]) * len(opts["attentions"]) * len(micro)
        mid = middle_stage(cfg, pp) is not None
        for recipe in opts["recipes"]:
            for zero in opts["zero"]:
                for offload, device in opts["offloads"]:
                    count["considered"] += inner
                    if not allowed(recipe, zero, pp, offload, device, tp):
                        continue
                    if dp == 1 and offload == "none" and zero > (1 if recipe == "pure-bf16" else 0):
                        continue   # nothing to shard over: the same bytes as the lowest stage
                    base = Layout(recipe, zero, "none", "flash", offload, device, 1, tp, pp, dp, replica)
                    st = states_part(cfg, base)
                    ms = states_part(cfg, base, "middle") if mid else st
                    host = max(st["host"], ms["host"]) + sum(v for k, v in offload_buffers(cfg, base).items()
                                                             if k.endswith("swap"))
                    nvme = max(st["nvme"], ms["nvme"])
                    if host * ranks_per_node > opts["host_per_node"] or nvme * ranks_per_node > opts["nvme_per_node"]:
                        continue
                    for policy in opts["checkpoints"]:
                        for kernel in opts["attentions"]:
                            for mb in micro:
                                lay = Layout(recipe, zero, policy, kernel, offload, device, mb, tp, pp, dp,
                                             replica // mb)
                                mem = per_gpu(cfg, seq, lay, st, ms if mid else None, where := {}) | where
                                count["evaluated"] += 1
                                if mem["total"] > usable:
                                    if closest is not None and (not closest or mem["total"] < closest["total"]):
                                        closest.clear()
                                        closest.update(mem, label=lay.label(), missing=mem["total"] - usable)
                                    break
                                yield lay, mem
                                if first_only:
                                    return


def _options(recipes, zero, offloads, checkpoints, attentions, micro_batches, tp, pp, gpus_per_node,
             host_per_node=None, nvme_per_node=None) -> dict:
    return {"host_per_node": host_per_node or HOST_PER_NODE, "nvme_per_node": nvme_per_node or NVME_PER_NODE, "recipes": tuple(recipes), "zero": tuple(zero), "offloads": tuple(offloads),
            "checkpoints": tuple(checkpoints), "attentions": tuple(attentions),
            "micro_batches": tuple(sorted(micro_batches)), "tp": tp, "pp": pp, "gpus_per_node": gpus_per_node}


def plan(model: str | ModelConfig, gpus: int, gpu: str = "h100-80gb", gpu_mem: int | None = None,
         seq: int = 4096, global_batch: int | None = None, recipes=RECIPES, zero=(0, 1, 2, 3),
         offloads=OFFLOAD_CHOICES, checkpoints=POLICIES, attentions=KERNELS, micro_batches=MICRO_BATCHES,
         tp: tuple | None = None, pp: tuple | None = None, reserve: gpu_table.Reserve = gpu_table.DEFAULT_RESERVE,
         mfu: float = compute.KERNEL_SHARE, links: Links | None = None, gpus_per_node: int = GPUS_PER_NODE,
         inter_node: float | None = None, advise: bool = True, host_per_node: int | None = None,
         nvme_per_node: int | None = None) -> Result:
    """Every layout of ``model`` on ``gpus`` GPUs that fits, ranked by estimated step time.

    ``gpu`` names the GPU table's entry for speeds (and capacity) and, through
    ``placement.node_for``, the node its collectives are priced on; ``gpu_mem`` (bytes) overrides
    the capacity. ``global_batch``: sequences per step (default 4M tokens' worth). ``tp``/``pp``
    restrict the degrees tried; the other sequences restrict their dimension. ``inter_node``:
    a line rate in bytes/s per GPU between nodes (one NIC per GPU) instead of the node's own
    network; ``host_per_node`` / ``nvme_per_node``: bytes per node (default DGX H100's)."""
    cfg = models.get(model) if isinstance(model, str) else model
    gpus, seq = positive_int(gpus, "GPU count"), positive_int(seq, "sequence length")
    g = gpu_table.get(gpu)
    if not g.bf16_flops:
        raise UsageError(f"{g.name} has no bf16 tensor cores and the planner's recipes train in bf16; accepted: "
                         + ", ".join(n for n, x in gpu_table.REGISTRY.items() if x.bf16_flops))
    capacity = g.capacity if gpu_mem is None else positive_int(gpu_mem, "GPU memory")
    global_batch = positive_int(global_batch, "global batch") if global_batch is not None \
        else max(1, DEFAULT_TOKENS // seq)
    usable = gpu_table.usable(capacity, reserve)
    check_capacity(capacity, reserve)
    links = links or datasheet_links(g.name)
    node = node_for(g, gpus_per_node, None if inter_node is None else float(inter_node))
    opts = _options(recipes, zero, offloads, checkpoints, attentions, micro_batches, tp, pp, gpus_per_node,
                    host_per_node, nvme_per_node)
    closest: dict = {}
    plans, count = [], {}
    for lay, mem in candidates(cfg, gpus, seq, global_batch, usable, opts, closest, count=count):
        plans.append(price(cfg, seq, lay, mem, g, usable, mfu, links, gpus_per_node, inter_node))
    plans.sort(key=rank_key)
    question = {"model": cfg.name, "n_params": cfg.n_params(), "gpus": gpus, "gpu": g.name,
                "capacity": capacity, "usable": usable, "reserve": reserve.of(capacity),
                "seq": seq, "global_batch": global_batch, "mfu": mfu, "inter_node": per_gpu_network(node),
                "node": node.label}
    result = Result(question, plans, count["considered"], closest or None,
                    assumptions=assumptions(g, reserve, mfu, links, node, opts), evaluated=count["evaluated"])
    if not plans and advise:   # no layout's dp divides the batch: the batches that run; else what to change
        result.advice = nearest_batches(cfg, gpus, capacity, seq, global_batch, reserve, opts, fits_any,
                                        parallel_degrees) or _advise(cfg, gpus, g, capacity, seq, global_batch,
                                                                     reserve, opts, closest, fits_any, OFFLOAD_CHOICES)
    return result


def price(cfg: ModelConfig, seq: int, lay: Layout, mem: dict, g: gpu_table.GPU, usable: int, mfu: float,
          links: Links, gpus_per_node: int, inter_node: float | None) -> Plan:
    """The :class:`Plan` of ``lay`` whose per-GPU bytes are ``mem`` (``per_gpu``): its step time,
    host buffers, headroom against ``usable`` and the switches that set it up."""
    t = step_seconds(cfg, seq, lay, g, mfu, links, gpus_per_node, inter_node)
    tokens = lay.micro_batch * lay.n_micro * lay.dp * seq   # = global_batch x seq (see candidates)
    buf = offload_buffers(cfg, lay)
    swap = buf["param_swap"] + buf["optimizer_swap"]
    mem = mem | {"usable": usable, "headroom": usable - mem["total"], "host_states": mem["host"],
                 "host_buffers": swap, "host": mem["host"] + swap}
    return Plan(lay, mem, t, tokens / t["total"], deepspeed_config(cfg, lay), fsdp_equivalent(lay),
                model_code(lay), megatron_args(cfg, lay), stage_layers(cfg, lay.pp))


def rank_key(p: Plan) -> tuple:
    """Ranking: step time in steps of :data:`TIE` (0.5 %: closer than the cost model can tell);
    within a step the mixed recipe (fp32 master weights: the safer numerics), then fewer
    offloaded bytes, then fewer bytes per GPU, then time."""
    return (tie_bucket(p.time["total"]), p.layout.recipe != "mixed", p.memory["host"] + p.memory["nvme"],
            p.memory["total"], p.time["total"])


TIE = 0.005


def tie_bucket(seconds: float) -> int:
    """The 0.5 % step of ``seconds`` (log scale): plans in the same step are a tie."""
    return math.floor(math.log(max(seconds, 1e-12)) / math.log1p(TIE))


def fits_any(cfg: ModelConfig, gpus: int, capacity: int, seq: int, global_batch: int,
             reserve: gpu_table.Reserve, opts: dict) -> Layout | None:
    """The first layout that fits (no ranking), or None: what the advice searches with."""
    usable = gpu_table.usable(capacity, reserve)
    for lay, _ in candidates(cfg, gpus, seq, global_batch, usable, opts, first_only=True):
        return lay
    return None
