"""Evaluate one given layout: its bytes and seconds, whether it fits, and where the search ranks it.

A learner asks "what about the layout I run today?", and the validation against published runs
asks the same of each run's layout. ``plan ... --layout tp=8,pp=16,dp=64,zero=1,ckpt=selective,mb=1``
is :func:`parse_layout` + :func:`evaluate`: the layout is priced by exactly the functions that
price the search's candidates (``memory.per_gpu``, ``search.price``: ``cost.step_seconds``), and
its rank is its place among every fitting plan the search found under the ranking's own key
(``ranking.rank_of``), so a layout that is the search's top plan has rank 1.

Keys (``key=value``, comma-separated): ``tp``, ``pp``, ``dp`` (required; tp x pp x dp = the GPU
count), ``zero`` (0-3, required), ``ckpt`` (a checkpoint policy, default none), ``mb``
(micro-batch, default 1; dp x mb must divide the global batch: the rest is gradient
accumulation), ``attn`` (default flash), ``recipe`` (mixed or pure-bf16, default mixed),
``offload`` (none, optimizer, optimizer+params; default none) and ``device`` (cpu or nvme, default
cpu), ``vp`` (model chunks per pipeline rank: interleaved 1F1B, default 1) and ``cp`` (context
parallelism, default 1; tp x cp x pp x dp = the GPU count), ``engine`` (auto, or megatron-core to
run a tensor or pipeline layout under Megatron-Core; default auto). A layout with ``vp`` or ``cp``
above 1, or ``engine=megatron-core``, is Megatron-Core's (``Layout.framework``) and follows its rules: ``cp`` needs flash attention and a
sequence divisible by 2 cp (the load-balanced causal split), ``vp`` needs pp > 1, micro-batches a
multiple of pp and the layers a multiple of pp x vp; ZeRO 0 or 1 (the distributed optimizer), no
offload. A layout DeepSpeed would refuse
(``search.allowed``) or that cannot be placed (tp not dividing the heads or larger than a node, pp
above the layer count) is a :class:`~gpumem.errors.UsageError`, one line.

Expert parallelism (:mod:`.moe`): ``ep`` (default 1) for a mixture of experts, dividing its
experts and dp, with tp = pp = cp = 1 and ZeRO 0-2 (what the search plans); anything else is a
one-line UsageError naming what is accepted.

Hybrid sharding (:mod:`.hybrid`): ``hybrid`` (none, hsdp, hpz; default none) with ``group`` (the
ranks of one shard group, required with a hybrid): ZeRO-3 only, the group a divisor of dp x cp
strictly between 1 and dp x cp, and whatever else ``hybrid.allowed_hybrid`` refuses (offload
with hsdp, parameter offload or tp > 1 with hpz), each a one-line UsageError naming what is
accepted.
"""

from dataclasses import dataclass

from ..errors import UsageError, positive_int
from ..memory import accounting, gpus as gpu_table, models
from ..memory.models import ModelConfig
from ..timing.offload_time import datasheet_links
from ..memory.policies import KERNELS, POLICIES
from .cost import GPUS_PER_NODE
from .hybrid import HYBRIDS, allowed_hybrid
from .memory import Layout, per_gpu
from . import moe, rules
from .question import Question
from .ranking import rank_of
from .search import PLANNABLE_RECIPES, Plan, Result, allowed, plan, price

KEYS = ("tp", "pp", "dp", "zero", "ckpt", "mb", "attn", "recipe", "offload", "device", "vp", "cp", "engine", "hybrid",
        "group", "ep")
REQUIRED = ("tp", "pp", "dp", "zero")
ENGINES = ("auto", "megatron-core")   # auto: the framework the layout's shape implies (Layout.framework)
DEFAULTS = {"engine": "auto", "ckpt": "none", "mb": "1", "attn": "flash", "recipe": "mixed", "offload": "none", "device": "cpu",
            "vp": "1", "cp": "1", "hybrid": "none", "ep": "1"}
CHOICES = {"zero": ("0", "1", "2", "3"), "ckpt": POLICIES, "attn": KERNELS, "recipe": PLANNABLE_RECIPES,
           "offload": ("none", "optimizer", "optimizer+params"), "device": ("cpu", "nvme"), "hybrid": HYBRIDS,
           "engine": ENGINES}


def parse_layout(text: str) -> dict:
    """``"tp=8,pp=16,dp=64,zero=1"`` -> ``{"tp": 8, ..., "ckpt": "none", ...}`` (defaults filled in);
    an unknown key, a repeated key, a bad value or a missing required key is one-line UsageError."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"--layout needs key=value pairs, e.g. tp=8,pp=16,dp=8,zero=1; keys: {', '.join(KEYS)}")
    given: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not key or not value:
            raise UsageError(f"--layout part {part.strip()!r} is not key=value; keys: {', '.join(KEYS)}")
        if key not in KEYS:
            raise UsageError(f"unknown --layout key {key!r}; accepted: {', '.join(KEYS)}")
        if key in given:
            raise UsageError(f"--layout key {key!r} given twice")
        given[key] = value
    missing = [k for k in REQUIRED if k not in given]
    if missing:
        raise UsageError(f"--layout needs {', '.join(missing)} (required: {', '.join(REQUIRED)})")
    out: dict = {}
    for key in KEYS:
        value = given.get(key, DEFAULTS.get(key))
        if key == "group" and value is None:   # no shard group unless hybrid sharding is asked for
            out[key] = 0
        elif key in CHOICES:
            if value not in CHOICES[key]:
                raise UsageError(f"--layout {key}={value!r}; accepted: {', '.join(CHOICES[key])}")
            out[key] = int(value) if key == "zero" else value
        else:
            out[key] = positive_int(value, f"--layout {key}")
    return out


def to_layout(cfg: ModelConfig, fields: dict, gpus: int, global_batch: int,
              gpus_per_node: int = GPUS_PER_NODE, seq: int | None = None) -> Layout:
    """The :class:`Layout` of parsed ``fields`` for ``gpus`` GPUs and ``global_batch`` sequences,
    checked as the search checks its candidates (see the module)."""
    tp, pp, dp, mb, cp, vp = (fields[k] for k in ("tp", "pp", "dp", "mb", "cp", "vp"))
    if tp * cp * pp * dp != gpus:
        raise UsageError(f"--layout tp x cp x pp x dp = {tp} x {cp} x {pp} x {dp} = {tp * cp * pp * dp:,}, "
                         f"but --gpus is {gpus:,}; they must be equal")
    if cp > 1 or vp > 1 or fields.get("engine") == "megatron-core":
        _megatron_core(cfg, fields, global_batch, seq)
    if global_batch % (dp * mb):
        raise UsageError(f"global batch {global_batch:,} is not dp x mb x accumulation: {global_batch:,} / "
                         f"({dp} x {mb}) is not a whole number")
    if tp > gpus_per_node or cfg.n_heads % tp or cfg.n_kv_heads % tp:
        raise UsageError(f"--layout tp={tp}: tensor parallelism stays in a node of {gpus_per_node} GPUs and "
                         f"divides {cfg.name}'s {cfg.n_heads} heads and {cfg.n_kv_heads} key/value heads")
    if pp > cfg.n_layers:
        raise UsageError(f"--layout pp={pp}: more stages than {cfg.name}'s {cfg.n_layers} layers")
    device = fields["device"] if fields["offload"] != "none" else "cpu"
    if not allowed(fields["recipe"], fields["zero"], pp, fields["offload"], device, tp):
        raise UsageError(f"--layout {_refusal(fields['recipe'], fields['zero'], pp, tp, fields['offload'], device)}")
    lay = Layout(fields["recipe"], fields["zero"], fields["ckpt"], fields["attn"], fields["offload"], device,
                 mb, tp, pp, dp, global_batch // (dp * mb), cp, vp, fields.get("hybrid", "none"),
                 fields.get("group", 0), fields.get("engine") == "megatron-core" and cp == 1 and vp == 1,
                 fields.get("ep", 1))
    why = allowed_hybrid(lay) or moe.refusal(cfg, lay)
    if why:
        raise UsageError(f"--layout {why}")
    return lay


def _megatron_core(cfg: ModelConfig, f: dict, global_batch: int, seq: int | None) -> None:
    """Megatron-Core's own checks (``rules.megatron_core``), as one ``--layout`` line."""
    why = rules.megatron_core(cfg, seq or 2 * f["cp"], f["zero"], f["offload"], f["attn"], f["pp"], f["cp"], f["vp"],
                              global_batch // (f["dp"] * f["mb"]))
    if why:
        raise UsageError(f"--layout cp={f['cp']}, vp={f['vp']}, engine={f.get('engine', 'auto')}: {why}; "
                         "accepted: zero=0|1, offload=none, attn=flash with cp > 1")


def _refusal(recipe: str, zero: int, pp: int, tp: int, offload: str, device: str) -> str:
    """Why ``search.allowed`` refuses the combination, in one clause."""
    if pp > 1 and zero >= 2:
        return f"zero={zero} with pp={pp}: DeepSpeed refuses ZeRO-2/3 with pipeline parallelism; accepted: zero=0 or 1"
    if pp > 1 and tp > 1:
        return f"offload={offload} with tp={tp} x pp={pp}: 3-D layouts (Megatron-DeepSpeed) are planned without offload"
    if recipe == "pure-bf16" and zero == 0:
        return "recipe=pure-bf16 at zero=0: DeepSpeed's bf16 optimizer states need ZeRO 1-3"
    try:
        accounting.check_offload(zero, offload, device)
    except UsageError as err:
        return f"offload={offload} device={device} at zero={zero}: {err}"
    return "a combination DeepSpeed does not run"


@dataclass
class LayoutResult:
    """One given layout, priced: the plan (bytes, seconds, configs), whether it fits, its rank."""
    plan: Plan
    fits: bool
    why_not: list
    rank: int | None          # 1-based among the search's fitting plans; None when it does not fit
    fitting: int              # fitting plans the search found
    best: Plan | None

    def as_dict(self) -> dict:
        """JSON-ready: the ``layout_result`` object of ``plan --layout --json``."""
        p, b = self.plan.as_dict(), self.best
        return {"label": p["label"], "framework": p["framework"], "layout": p["layout"], "fits": self.fits,
                "why_not": self.why_not, "rank": self.rank, "fitting": self.fitting,
                "memory": p["memory"], "time": p["time"], "tokens_per_s": p["tokens_per_s"],
                "best": None if b is None else {"label": b.layout.label(), "time_s": b.time["total"],
                                                "tokens_per_s": b.tokens_per_s},
                "vs_best": None if b is None else p["time"]["total"] / b.time["total"],
                "deepspeed": p["deepspeed"], "megatron": p["megatron"], "fsdp": p["fsdp"]}


def evaluate(model: str | ModelConfig, gpus: int, layout: str | dict, gpu: str = "h100-80gb",
             seq: int = 4096, global_batch: int | None = None, result: Result | None = None,
             **plan_kwargs) -> LayoutResult:
    """Price ``layout`` (a ``--layout`` string or :func:`parse_layout`'s dict) for the question
    ``plan(model, gpus, gpu, seq=seq, global_batch=global_batch, **plan_kwargs)`` and rank it among
    that search's fitting plans; ``result``: the search's :class:`Result` when already computed."""
    cfg = models.get(model) if isinstance(model, str) else model
    fields = parse_layout(layout) if isinstance(layout, str) else layout
    result = result or plan(cfg, gpus, gpu, seq=seq, global_batch=global_batch, advise=False, **plan_kwargs)
    q = result.question
    asked = result.asked or Question.of(cfg, gpus, gpu, seq=seq, global_batch=global_batch, **plan_kwargs)
    c, opts = asked.cluster, asked.options()   # the search's own cluster: links, network, node limits
    gpn = c.gpus_per_node
    lay = to_layout(cfg, fields, q["gpus"], q["global_batch"], gpn, q["seq"])
    g = gpu_table.get(c.gpu)
    ranks = min(q["gpus"], gpn)
    links = c.links or datasheet_links(g.name, adam_rate=c.cpu_adam_rate, ranks_on_node=ranks)
    where: dict = {}
    mem = per_gpu(cfg, q["seq"], lay, where=where) | where
    p = price(cfg, q["seq"], lay, mem, g, q["usable"], q["mfu"], links, gpn, c.inter_node)
    why = []
    if p.memory["total"] > q["usable"]:
        why.append(f"needs {p.memory['total'] / 1e9:.1f} GB per GPU, usable {q['usable'] / 1e9:.1f} GB")
    for part, limit in (("host", opts["host_per_node"]), ("nvme", opts["nvme_per_node"])):
        if p.memory[part] * ranks > limit:
            why.append(f"{part} {p.memory[part] * ranks / 1e12:.2f} TB per node, limit {limit / 1e12:g} TB")
    rank = None
    if not why:
        rank = rank_of(result.plans, p)
    return LayoutResult(p, not why, why, rank, len(result.plans), result.best)
