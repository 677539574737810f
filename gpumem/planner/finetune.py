"""The planner's fine-tuning layouts (``plan`` with chapter 08's options: ``--adapter``,
``--lora-rank``, ``--lora-targets``, ``--base-dtype``, ``--optimizer``). Torch-free.

What is searched: data parallelism over every GPU (tp = pp = 1, as peft and the Hugging Face
Trainer run LoRA and QLoRA: DDP, DeepSpeed ZeRO or FSDP), ZeRO stage 0-2 (DeepSpeed) or 3 (FSDP2,
one unit per block, :mod:`gpumem.memory.finetune_fsdp`), the frozen base on the CPU (FSDP2's
``CPUOffloadPolicy``, adapters only), checkpointing none or full (``gradient_checkpointing``), and
the micro-batch. Not searched (stated in the result): tensor and pipeline parallelism (Megatron
Bridge's LoRA runs them; a base too big for data parallelism alone is out of this search), NVMe.

Bytes are the engine's: ``finetune.finetune_states`` by role (ZeRO's shards), ``finetune_fsdp``
(FSDP's working set, the base on the CPU), ``finetune.finetune_activation_bytes`` (what a frozen
base saves), against the usable bytes (``gpus.usable``; one GPU reserves no NCCL buffers, as chapter
08 counts). Seconds: compute from ``finetune_time.step_flops`` (a frozen matmul's backward is one
matmul) at the planner's compute share, NF4 dequantisation per micro-batch, the data-parallel
collectives (``placement``, exposed as ``timing.overlap`` says for DeepSpeed's stage or FSDP2),
PCIe for a base on the CPU (exposed as FSDP2's ``offload_copies``), and the optimizer step (HBM-bound
on the GPU; on the CPU at the published CPU Adam rate). Ranked as the planner ranks: step time, ties
within ``ranking.TIE`` going roomy first, then fewer host bytes, then fewer bytes.
"""

from dataclasses import asdict, dataclass, field, replace

from ..memory import finetune as F, finetune_fsdp, gpus as gpu_table
from ..timing import compute, finetune_time, offload_time, overlap
from . import placement, ranking
from .finetune_config import configs
from .memory import DS_BUCKET
from .question import GPUS_PER_NODE, HOST_PER_NODE, MICRO_BATCHES

# Global batch when none is asked: the QLoRA paper's 65B run, per-device batch 1 x gradient
# accumulation 16 (github.com/artidoro/qlora scripts/finetune_guanaco_65b.sh); an assumption.
FT_GLOBAL_BATCH = 16
CHECKPOINTS = ("none", "full")


@dataclass(frozen=True)
class FtLayout:
    """One fine-tuning layout: ZeRO stage (3: FSDP2), checkpointing, micro-batch, data-parallel
    degree, micro-batches a step, and whether the base lives on the CPU."""
    zero: int
    checkpoint: str
    micro_batch: int
    dp: int
    n_micro: int
    base_on_cpu: bool = False

    @property
    def framework(self) -> str:
        """Who runs it: ``fsdp`` (stage 3: FSDP2, FSDP1 for a 4-bit base), ``deepspeed`` (stages 0-2 over
        several GPUs), ``torch`` (one GPU)."""
        return "fsdp" if self.zero == 3 else "torch" if self.dp == 1 else "deepspeed"

    def label(self) -> str:
        """A short name: ``FSDP (ZeRO-3) dp8 mb1 x2 ckpt full base->cpu``."""
        z = "FSDP (ZeRO-3)" if self.zero == 3 else f"ZeRO-{self.zero}"
        where = "one GPU" if self.dp == 1 and self.zero < 3 else f"{z} dp{self.dp}"
        return (f"{where} mb{self.micro_batch} x{self.n_micro} ckpt {self.checkpoint}"
                + (" base->cpu" if self.base_on_cpu else ""))


@dataclass
class FtPlan:
    """One fine-tuning layout that fits: its bytes, seconds, tokens/s and switches."""
    layout: FtLayout
    memory: dict
    time: dict
    tokens_per_s: float
    configs: dict

    def as_dict(self) -> dict:
        """JSON-ready: the layout, its breakdowns and its switches (peft, bitsandbytes, trainer, ...)."""
        return {"label": self.layout.label(), "framework": self.layout.framework, "layout": asdict(self.layout),
                "memory": self.memory, "time": self.time, "tokens_per_s": self.tokens_per_s} | self.configs


@dataclass
class FtResult:
    """What :func:`plan` found: the question, the fitting plans ranked, the closest miss."""
    question: dict
    plans: list
    considered: int
    closest: dict | None = None
    assumptions: list = field(default_factory=list)

    @property
    def best(self):
        """The top plan, or None."""
        return self.plans[0] if self.plans else None

    def distinct(self, top: int = 10) -> list:
        """The best plan of each (ZeRO stage, base placement, checkpointing), ranked, at most ``top``."""
        seen, out = set(), []
        for p in self.plans:
            key = (p.layout.zero, p.layout.base_on_cpu, p.layout.checkpoint)
            if key not in seen:
                seen.add(key)
                out.append(p)
        return out[:top]

    def as_dict(self, top: int = 10) -> dict:
        """JSON-ready, with the ``top`` distinct plans (all fitting plans are counted)."""
        return {"question": self.question, "considered": self.considered, "fitting": len(self.plans),
                "plans": [p.as_dict() for p in self.distinct(top)], "closest": self.closest,
                "assumptions": self.assumptions}


def memory(cfg, ft: F.Finetune, lay: FtLayout, seq: int) -> dict:
    """Per-GPU bytes of ``lay``: ``states`` (roles summed, FSDP's gathered units apart),
    ``working`` (FSDP: the root and two blocks whole), ``buffers`` (DeepSpeed's ZeRO-1/2 buckets),
    ``activations`` (peak), ``total``, ``host`` (per GPU), and ``roles``."""
    acts = F.finetune_activation_bytes(cfg, compute_setup(ft, lay), seq, lay.micro_batch,
                                       checkpoint=lay.checkpoint)["peak"]
    buffers = working = host = 0
    if lay.zero == 3:
        o = finetune_fsdp.fsdp_states(cfg, ft, lay.dp, lay.base_on_cpu)
        roles, working, host = o["roles"], o["working"], o["host"]
        states = o["gpu"] - working
    else:
        roles = F.finetune_states(cfg, ft, gpus=lay.dp, zero=lay.zero)
        states = sum(roles.values())
        if lay.zero in (1, 2):       # reduce + all-gather buckets, as the planner's DeepSpeed configs set them
            n_t, e = trainable(cfg, ft)
            buffers = 2 * e * min(DS_BUCKET, n_t)
    return {"states": states, "working": working, "buffers": buffers, "activations": acts,
            "total": states + working + buffers + acts, "host": host, "roles": roles}


def compute_setup(ft: F.Finetune, lay: FtLayout) -> F.Finetune:
    """The setup as the step computes it: DeepSpeed's bf16 engine (ZeRO over several GPUs) and FSDP's
    ``MixedPrecisionPolicy(param_dtype=bf16)`` run the adapters in bf16, so peft makes no per-adapter
    copy of the input (its fp32 adapters under autocast do: one GPU with the Trainer's bf16=True)."""
    return replace(ft, adapter_dtype="bf16") if ft.lora and (lay.dp > 1 or lay.zero == 3) else ft


def trainable(cfg, ft: F.Finetune) -> tuple[int, int]:
    """(trained elements, bytes of one of their gradients): the adapters (fp32 by default) or,
    with full fine-tuning, every weight (bf16 gradients)."""
    if ft.lora:
        return F.lora_params(cfg, ft.lora_rank, ft.lora_targets), 4 if ft.adapter_dtype == "fp32" else 2
    return cfg.n_params(), 2


def seconds(cfg, ft: F.Finetune, lay: FtLayout, seq: int, g, mfu: float, node, cpu_adam_rate=None,
            pcie: float | None = None) -> dict:
    """One step's seconds by term (see the module), with ``total`` and ``bound``; ``*_moved_s``: the
    collectives' and the PCIe copies' seconds before overlap."""
    f = finetune_time.step_flops(cfg, ft, seq, lay.micro_batch, lay.checkpoint)     # the re-run: see there
    per_mb = f["forward"] + f["backward"] + f["recompute"]
    busy = compute.seconds(per_mb * lay.n_micro, g, mfu)
    fwd = busy * f["forward"] / per_mb
    windows = {"forward": fwd, "backward": busy - fwd, "last_backward": (busy - fwd) / lay.n_micro}
    ckpt = lay.checkpoint == "full"
    dequant = lay.n_micro * finetune_time.dequant_seconds(cfg, g.hbm, 2 + ckpt) if ft.base_dtype == "nf4" else 0.0
    n_t, e = trainable(cfg, ft)
    grp = placement.groups(node, 1, 1, lay.dp)["dp"]
    buckets = -(-n_t // DS_BUCKET)
    o = finetune_fsdp.fsdp_states(cfg, ft, lay.dp, lay.base_on_cpu) if lay.zero == 3 else None
    if o is not None:
        gathered = 2 * o["block"] * cfg.n_layers + o["root"]        # blocks forward and backward, the root once
        moved = lay.n_micro * (placement.seconds("all_gather", gathered, grp, 2 * cfg.n_layers + 1)
                               + placement.seconds("reduce_scatter", o["block_grads"] * cfg.n_layers, grp,
                                                   cfg.n_layers))
        dp_s = overlap.exposed("fsdp2", "zero3_gather", moved, windows)
    else:
        fw = f"deepspeed-zero{lay.zero}"
        reduce = placement.seconds("all_reduce", n_t * e, grp, buckets) * (lay.n_micro if lay.zero == 2 else 1)
        gather = placement.seconds("all_gather", n_t * e, grp, buckets) if lay.zero in (1, 2) else 0.0
        moved = reduce + gather
        dp_s = overlap.exposed(fw, "dp_grad_reduce", reduce, windows) + overlap.exposed(fw, "dp_param_gather",
                                                                                        gather, windows)
    offload_s = copies = 0.0
    if lay.base_on_cpu:     # a unit's H2D copy precedes its all-gather: both hide behind the same compute
        copies = finetune_fsdp.copied_up(o, lay.n_micro) / (pcie or g.pcie)
        offload_s = overlap.exposed("fsdp2", "offload_copies", copies + moved, windows) - dp_s
        optimizer = -(-n_t // lay.dp) / offload_time.cpu_adam_per_rank(cpu_adam_rate, min(lay.dp, GPUS_PER_NODE))
    else:
        optimizer = compute.optimizer_seconds(n_t, ft.recipe, g, lay.dp, lay.zero)
    terms = {"compute": busy, "dequantise": dequant, "data_parallel": dp_s, "offload": offload_s,
             "optimizer": optimizer}
    total = sum(terms.values())
    return terms | {"total": total, "bound": max(terms, key=terms.get), "data_parallel_moved_s": moved,
                    "offload_moved_s": copies}


def layouts(cfg, ft: F.Finetune, gpus: int, global_batch: int):
    """Every layout the search tries (see the module)."""
    if global_batch % gpus:
        return
    per = global_batch // gpus
    stage3 = ft.optimizer == "adamw"       # bitsandbytes' optimizers cannot step FSDP's sharded parameters
    for zero in ((0, 1, 2, 3) if gpus > 1 else (0, 3)) if stage3 else (0, 1, 2) if gpus > 1 else (0,):
        if zero < 3:
            places = (False,)
        elif gpus > 1:
            places = (False, True) if ft.lora else (False,)
        else:                                                  # ... but FSDP can keep its base on the CPU
            places = (True,) if ft.lora else ()
        for cpu in places:
            for ck in CHECKPOINTS:
                for mb in MICRO_BATCHES:
                    if per % mb == 0:
                        yield FtLayout(zero, ck, mb, gpus, per // mb, cpu)


def plan(model, ft: F.Finetune, gpus: int, gpu: str = "h100-80gb", *, gpu_mem: int | None = None, seq: int = 4096,
         global_batch: int | None = None, mfu: float = compute.KERNEL_SHARE, cpu_adam_rate=None,
         pcie: float | None = None) -> FtResult:
    """Every fine-tuning layout of ``model`` (a registry name or ModelConfig) with ``ft`` on ``gpus``
    GPUs that fits, ranked (see the module); ``pcie``: host-to-device bytes/s instead of the GPU's
    datasheet link (e.g. a measured rate)."""
    from ..memory import models
    cfg = models.get(model) if isinstance(model, str) else model
    F.validate(ft)
    F.finetune_states(cfg, ft)               # refuses models LoRA is not counted for, before the search
    g = gpu_table.get(gpu)
    capacity = gpu_mem or g.capacity
    reserve = gpu_table.Reserve(nccl=0) if gpus == 1 else gpu_table.DEFAULT_RESERVE
    usable = gpu_table.usable(capacity, reserve)
    batch = global_batch or FT_GLOBAL_BATCH * -(-gpus // FT_GLOBAL_BATCH)
    host_cap = HOST_PER_NODE // GPUS_PER_NODE
    node = placement.node_for(g, GPUS_PER_NODE)
    plans, closest, considered = [], None, 0
    for lay in layouts(cfg, ft, gpus, batch):
        considered += 1
        mem = memory(cfg, ft, lay, seq)
        if mem["total"] > usable or mem["host"] > host_cap:
            miss = max(mem["total"] - usable, 0)
            if mem["host"] <= host_cap and (closest is None or miss < closest["missing"]):
                closest = {"label": lay.label(), "missing": miss, "total": mem["total"]}
            continue
        room = usable - mem["total"]
        mem |= {"usable": usable, "headroom": room, "tight": ranking.tight(room, usable)}
        t = seconds(cfg, ft, lay, seq, g, mfu, node, cpu_adam_rate, pcie)
        plans.append(FtPlan(lay, mem, t, batch * seq / t["total"], configs(cfg, ft, lay)))
    question = {"model": cfg.name, "gpus": gpus, "gpu": g.name, "capacity": capacity, "usable": usable,
                "reserve": reserve.of(capacity), "seq": seq, "global_batch": batch, "finetune": asdict(ft),
                "tight_below": ranking.tight_limit(usable), "host_per_gpu": host_cap,
                "pcie": pcie or g.pcie}
    return FtResult(question, ranking.rank(plans, _tie_key), considered, closest, assumptions(global_batch is None, mfu, ft))


def _tie_key(p) -> tuple:
    """Inside a tie group (``ranking.rank``): roomy first, fewer host bytes, fewer bytes, the label."""
    return p.memory["tight"], p.memory["host"], p.memory["total"], p.layout.label()


def assumptions(default_batch: bool, mfu: float, ft: F.Finetune) -> list[str]:
    """The stated assumptions the answer rests on, with their effect."""
    out = [f"compute at {mfu:.0%} of the bf16 peak (the planner's compute share); NF4 dequantisation at the "
           "datasheet HBM bandwidth; PCIe at the link's peak (times scale as 1 / the share reached)",
           "data parallelism only (tp = pp = 1): tensor and pipeline parallelism for adapters "
           "(Megatron Bridge) are not searched"]
    if ft.optimizer != "adamw":
        out.append("bitsandbytes' optimizers do not step FSDP's sharded (DTensor) parameters (bitsandbytes issues "
                   "#1403, #1633, open): stage 3 is not searched with them")
    if ft.lora:
        out.append("with the base on the CPU, FSDP steps torch's AdamW on the CPU; priced at DeepSpeed CPU-Adam's "
                   "published rate (torch's is slower: the optimizer term grows)")
    if default_batch:
        out.insert(0, f"global batch {FT_GLOBAL_BATCH} sequences (the QLoRA paper's 65B run: 1 x 16 "
                      "accumulation), rounded up to a multiple of the GPUs; set it with --global-batch")
    return out
