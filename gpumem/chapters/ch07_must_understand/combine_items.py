"""Checklist item 6: which combination of techniques for an 8B, a 70B and a 405B model.

Numbers drawn per attempt: model, GPU, GPU count and sequence length. Per-GPU bytes (model
states, activations with checkpointing, ZeRO-3's working set, offload) come from
``gpumem.memory.estimate``; the slow-link layouts' seconds from the time engine
(``gpumem.timing.zero_layouts``: each collective on its group's placement).
The layout questions (a slow interconnect, 405B on 1,024 GPUs) quote the chapter 06 planner
(``gpumem.planner.plan``), asked when the explanation is shown.
"""

from functools import lru_cache

from gpumem.course.checklist import Item
from gpumem.course.quiz import Choice, Numeric
from gpumem.course.quiz_draws import gpu_numbers, model_numbers, pick
from gpumem.timing import hardware, zero_layouts
from gpumem.memory import estimate, gpus
from gpumem import planner
from gpumem.units import GB

from . import pointers as P

BIG = ("llama-3-70b", "llama-3.1-405b")
GPUS = ("a100-80gb", "h100-80gb", "h200")
SLOW_NODES = 8           # plan-slow-link: 8 nodes of zero_layouts.ETHERNET_25G (one 25 Gb/s port each)
SLOW_MICRO_BATCHES = 8   # micro-batches of 4,096 tokens per GPU per optimizer step
BIG_LINK = 50e9          # one 400 Gb/s InfiniBand port per GPU, bytes/s per direction


WIDE = tuple(range(2, 129))   # every pipeline degree the planner may try


@lru_cache(maxsize=16)
def ranked(model: str, n_gpus: int, inter_node: float, tp: tuple | None = None, pp: tuple | None = None,
           zero: tuple = (0, 1, 2, 3)):
    """The chapter 06 planner's best plan (H100 80GB, sequence 4,096; None when nothing fits),
    asked when an explanation is shown so that it never disagrees with the planner; ``tp``,
    ``pp``, ``zero`` restrict the degrees and stages it tries."""
    return planner.plan(model, n_gpus, "h100-80gb", inter_node=inter_node, tp=tp, pp=pp, zero=zero,
                        advise=False).best


def _seconds(p) -> str:
    return f"{p.layout.label()}, {p.time['total']:.1f} s per step" if p else "no layout the planner accepts"


# plan-3d's options: a layout family each, as the planner's arguments and a test on a Layout
FAMILIES = [
    ("ZeRO-3 data parallelism alone over all 1,024 GPUs",
     {"tp": (1,), "pp": (1,), "zero": (3,)}, lambda lay: lay.tp == lay.pp == 1 and lay.zero == 3),
    ("Tensor parallel in each node, pipeline across nodes, ZeRO-1",
     {"tp": (2, 4, 8), "pp": WIDE, "zero": (0, 1)}, lambda lay: lay.tp > 1 and lay.pp > 1),
    ("Pipeline stages across nodes with ZeRO-1, no tensor parallelism",
     {"tp": (1,), "pp": WIDE, "zero": (0, 1)}, lambda lay: lay.tp == 1 and lay.pp > 1),
    ("ZeRO-3 with DeepSpeed's AutoTP tensor parallelism inside each node",
     {"tp": (2, 4, 8), "pp": (1,), "zero": (3,)}, lambda lay: lay.tp > 1 and lay.pp == 1 and lay.zero == 3),
]


def family_of(lay) -> int:
    """Which of :data:`FAMILIES` a layout belongs to (ValueError if none: the question is stale)."""
    for i, (_, _, test) in enumerate(FAMILIES):
        if test(lay):
            return i
    raise ValueError(f"plan-3d offers no option for the planner's best layout {lay.label()}")


def _three_d(_ctx) -> str:
    best = ranked("llama-3.1-405b", 1024, BIG_LINK)
    parts = [f"{words}: {_seconds(ranked('llama-3.1-405b', 1024, BIG_LINK, **kw))}"
             for words, kw, _ in FAMILIES]
    return (f"The chapter 06 planner ranks {_seconds(best)} first. The best of each option: "
            + "; ".join(parts) + ". ZeRO-3 alone gathers every weight over the 50 GB/s links in "
            "each micro-batch; tensor parallelism talks inside every layer, so it stays on a node's "
            "NVLink; a pipeline sends only activations between stages, and DeepSpeed's pipeline "
            "engine refuses ZeRO-2 and ZeRO-3. DeepSpeed's AutoTP cannot be combined with a "
            "pipeline (its device mesh is data x tensor only), so the 3-D layout runs in "
            "Megatron-DeepSpeed: Megatron's tensor and sequence parallelism in each node, "
            "DeepSpeed's pipeline engine and ZeRO-1 across nodes, as 405B-class models are trained.")


def _est(model: str, n_gpus: int, seq: int, **kw):
    kw = {"zero": 3, "recipe": "mixed", "checkpoint": "full"} | kw
    return estimate.estimate(model, gpus=n_gpus, seq=seq, **kw)


def fewest_zero3(model: str, gpu: str, seq: int) -> int:
    """Fewest GPUs on which ZeRO-3 + full checkpointing (mixed precision) fits usable memory."""
    usable, lo, hi = gpus.usable(gpu), 1, 1
    while _est(model, hi, seq).total > usable:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _est(model, mid, seq).total <= usable else (mid + 1, hi)
    return lo


def _setting(rng) -> dict:
    return (model_numbers(pick(rng, BIG)) | gpu_numbers(pick(rng, GPUS))
            | {"seq": pick(rng, (2048, 4096, 8192))})


def _fewest(rng) -> dict:
    n = _setting(rng)
    e = _est(n["model_name"], 8, n["seq"])
    fewest = fewest_zero3(n["model_name"], n["gpu_name"], n["seq"])
    everything = lambda k: (e.states.total + e.activation_bytes + int(e.gathered)) * 8 / k   # all sharded
    return n | {"acts": e.activation_bytes, "ws": int(e.gathered), "states8": e.states.total,
                "all_sharded": next(k for k in range(1, 1 << 16) if everything(k) <= n["usable"]),
                "states_gb": 16 * n["n_params"] / GB, "fewest": fewest,
                "left_gb": (n["usable"] - e.activation_bytes - int(e.gathered)) / GB,
                "bare": -(-16 * n["n_params"] // n["usable"])}


def _offloaded(rng) -> dict:
    n = _setting(rng) | {"gpus": pick(rng, (8, 16, 32))}
    e = _est(n["model_name"], n["gpus"], n["seq"], offload="optimizer")
    plain = _est(n["model_name"], n["gpus"], n["seq"])
    total = e.total
    return n | {"acts_gb": e.activation_bytes / GB, "ws_gb": int(e.gathered) / GB, "total_gb": total / GB,
                "p_gb": e.states.params / GB, "g_gb": e.states.grads / GB, "plain_gb": plain.total / GB,
                "verdict": "fits" if total <= n["usable"] else "does not fit",
                "host_gb": e.states.host / GB}


def _eight_b(_ctx) -> str:
    usable = gpus.usable("h100-80gb")
    rows = [("plain, full checkpointing", _est("llama-3-8b", 1, 4096, zero=0)),
            ("pure bf16, no checkpointing", _est("llama-3-8b", 1, 4096, zero=0, recipe="pure-bf16",
                                                 checkpoint="none")),
            ("ZeRO + optimizer to CPU, full checkpointing", _est("llama-3-8b", 1, 4096, offload="optimizer"))]
    parts = [f"{name}: {e.total / GB:.1f} GB" for name, e in rows]
    return ("Per GPU against the " + f"{usable / GB:.1f} GB usable: " + "; ".join(parts) + ". On one GPU "
            "ZeRO has nothing to shard, so stages alone change nothing; sending the 12 optimizer bytes per "
            "parameter to host memory does.")


def slow_link_steps() -> dict:
    """plan-slow-link's four layouts, one optimizer step each (``zero_layouts.layout_step``)."""
    cluster = hardware.Cluster(zero_layouts.ETHERNET_25G, SLOW_NODES)
    return {lay: zero_layouts.layout_step(lay, "llama-3-8b", cluster, SLOW_MICRO_BATCHES)
            for lay in zero_layouts.LAYOUTS}


def _slow_link(_ctx) -> str:
    r = slow_link_steps()
    z3, hpz, mics, z1 = (r[k] for k in ("zero3", "hpz", "mics", "zero1"))
    gb = lambda x: f"{x['states_bytes'] / GB:.1f} GB"
    return (f"A ring crosses each node's port once per collective, whatever the GPUs per node, so a "
            f"node's port carries about one GPU's share. ZeRO-1 over all 64 sends the gradients "
            f"across once per step (a reduce-scatter, then the updated weights' all-gather): "
            f"{z1['comm_per_step_s']:.1f} s. Sharding inside each node and replicating across "
            f"nodes all-reduces each GPU's 1/8 gradient shard with its peers, 8 shards through the "
            f"one port: {mics['comm_per_step_s']:.1f} s, the same bytes; its gathers stay on NVLink "
            f"({mics['comm_per_micro_batch_s']:.2f} s per micro-batch, hidden). ZeRO-3 over all 64 "
            f"gathers and reduce-scatters across the port in every micro-batch: "
            f"{z3['comm_per_micro_batch_s']:.1f} s against {z3['compute_s'] / SLOW_MICRO_BATCHES:.2f} s "
            f"of compute, {z3['step_s']:.0f} s per step of {SLOW_MICRO_BATCHES} micro-batches against "
            f"{z1['step_s']:.1f} s (ZeRO-1) and {mics['step_s']:.1f} s (in-node sharding). States per "
            f"GPU: {gb(z3)} (ZeRO-3), {gb(z1)} (ZeRO-1), {gb(mics)} (in-node): all fit. Shard-in-node, "
            f"replicate-across is MiCS (DeepSpeed's mics_shard_size until DeepSpeed removed it; "
            f"0.19.8 refuses the key), FSDP's HYBRID_SHARD and FSDP2's HSDP. DeepSpeed's ZeRO++ hpZ "
            f"is another thing: a node-local second copy of the weights serves only backward's "
            f"gathers; forward's gathers and the reduce-scatter still cross the port each "
            f"micro-batch ({hpz['step_s']:.0f} s per step). NVMe only adds traffic. The network "
            f"figures are the time engine's (NCCL's alpha-beta model, the port at 47/50 of its line "
            f"rate); the once-per-step collectives are counted exposed.")


QUESTIONS = [
    Numeric("plan-fewest",
            "{model} ({n_params:,} parameters, {layers} layers) trains with standard mixed "
            "precision under ZeRO-3 with every layer checkpointed, sequences of {seq:,} tokens, "
            "micro-batch 1, on {gpu}s ({usable:,} bytes usable each). A memory plan drawn up for 8 "
            "GPUs lists, per GPU, {states8:,} bytes of model states, {acts:,} bytes of activations "
            "and {ws:,} bytes of ZeRO-3 working set (the gathered layers and buffers). What is the "
            "fewest GPUs on which it fits?",
            answer=lambda n: n["fewest"], unit="GPUs", rel_tol=0.0,
            hint="Which of the three figures would change with the GPU count, and which depend only "
                 "on one GPU's tokens and one layer at a time?",
            explanation="{states_gb:,.0f} GB of states must fit in {left_gb:.1f} GB per GPU: {answer} "
                        "GPUs, not the {bare} that the states alone suggest. In practice the count is "
                        "also a multiple of the node size, and more GPUs buy batch size and speed.",
            traps=((lambda n: n["bare"], "that counts the model states only; every GPU also holds its "
                                         "activations and the working set."),
                   (lambda n: n["all_sharded"], "that divides all three figures by the GPU count. "
                                                "Activations and the working set do not shrink with "
                                                "more GPUs.")),
            draw=_fewest),
    Numeric("plan-offload",
            "{model} ({n_params:,} parameters) trains with standard mixed precision under ZeRO-3 on "
            "{gpus} {gpu}s, every layer checkpointed, sequences of {seq:,}, micro-batch 1, with the "
            "optimizer states offloaded to CPU memory. Each GPU holds {acts_gb:.2f} GB of activations "
            "and a working set of {ws_gb:.2f} GB besides its model states. How many GB does each GPU "
            "hold in all?",
            answer=lambda n: n["total_gb"], unit="GB", rel_tol=0.01,
            hint="When DeepSpeed's ZeRO-3 offloads the optimizer, where does each rank's gradient "
                 "partition live? Count what is left on the GPU per parameter, then shard it.",
            explanation="bf16 weight shard {p_gb:.2f} GB (1/{gpus}) + activations + working set = {answer} "
                        "GB: only the bf16 weight shard stays on the GPU; with the optimizer offloaded, "
                        "ZeRO-3 keeps its gradient partition in host memory beside the optimizer "
                        "states. It {verdict} the {usable_gb:.1f} GB "
                        "usable (without offload: {plain_gb:.1f} GB). The price: {host_gb:.1f} GB per "
                        "GPU in host memory and a CPU Adam step.",
            traps=((lambda n: n["plain_gb"], "that keeps the optimizer states on the GPU."),
                   (lambda n: n["total_gb"] + 2 * n["p_gb"], "that keeps a bf16 gradient shard on the "
                                                            "GPU. Where does ZeRO-3 put it once the "
                                                            "optimizer is offloaded?")),
            draw=_offloaded),
    Choice("plan-8b-one-gpu",
           "Llama-3-8B must train on one H100 80GB, sequences of 4,096, micro-batch 1. Which set-up "
           "fits?",
           ["Standard mixed precision on the GPU alone, every layer checkpointed",
            "ZeRO (any stage) with optimizer offload, every layer checkpointed",
            "ZeRO-2 on its one GPU, no offload, every layer checkpointed",
            "Pure bf16 AdamW with no checkpointing at all"],
           answer=1,
           hint="Count 8 billion parameters at 16 (or 8) bytes first. What can ZeRO shard on a single "
                "GPU?",
           explanation=_eight_b),
    Choice("plan-pp-zero3",
           "A DeepSpeed plan for Llama-3-70B on 8 A100 80GB GPUs combines ZeRO-3, pipeline parallelism "
           "of 4 and activation checkpointing, and promises about 55 GB per GPU. What is wrong with it?",
           ["DeepSpeed refuses ZeRO-3 in a pipeline-parallel run",
            "ZeRO-3 needs at least 8 ranks in each data-parallel group",
            "DeepSpeed cannot checkpoint activations inside a pipeline",
            "A pipeline of 4 puts all the model states on 2 GPUs"],
           answer=0,
           hint="Check the plan twice: against the rules DeepSpeed applies when features are combined, "
                "and against the arithmetic of 1,129 GB of model states on 8 GPUs.",
           explanation="DeepSpeed's pipeline engine asserts that ZeRO-2 and ZeRO-3 are incompatible "
                       "with pipeline parallelism. ZeRO-3 has no minimum group size, the pipeline "
                       "engine checkpoints activations (activation_checkpoint_interval), and 4 stages "
                       "over 8 GPUs spread the states over all 8. And however 8 GPUs split 70B's 1,129 "
                       "GB of mixed-"
                       "precision states, one GPU holds at least 141 GB (70.5 GB in pure bf16). About "
                       "55 GB needs the optimizer states offloaded."),
    Choice("plan-slow-link",
           "Llama-3-8B trains on 64 H100s in 8 nodes with data parallelism only (no pipeline or "
           "tensor parallelism), 8 micro-batches of 4,096 tokens per GPU per optimizer step. Inside "
           "a node the GPUs share NVLink; between nodes there is one 25 Gb/s Ethernet port per node. "
           "Which statement about the layouts is right?",
           ["ZeRO-3 across all 64 GPUs is the fastest, holding the fewest bytes per GPU",
            "ZeRO-1 across all 64 sends every GPU's whole gradient through its node's port, 8x what "
            "shard-in-node, replicate-across sends",
            "ZeRO-1 across all 64 moves about as many bytes per step across nodes as "
            "shard-in-node, replicate-across",
            "DeepSpeed's ZeRO++ hpZ keeps every ZeRO-3 collective inside the node, off the port"],
           answer=2,
           hint="A ring crosses each node's port once per collective. Count how often per step each "
                "layout runs a collective that spans the nodes, and how many bytes it carries.",
           explanation=_slow_link),
    Choice("plan-3d",
           "With DeepSpeed (or Megatron-DeepSpeed on top of it), Llama-3.1-405B trains on 1,024 H100 80GB GPUs: 128 nodes of 8 joined by "
           "NVLink inside a node and 50 GB/s per GPU between nodes, sequences of 4,096, 4M tokens "
           "per step. Which layout trains fastest?",
           [words for words, _, _ in FAMILIES],
           answer=family_of(ranked("llama-3.1-405b", 1024, BIG_LINK).layout),
           hint="Which kind of parallelism talks inside every layer, which only at stage boundaries, "
                "which moves every weight per micro-batch, and which of them can be combined (and in "
                "which framework)? Match each to the link it can afford.",
           explanation=_three_d),
]

ITEM = Item("combine", "Which combination for 7B-8B, 70B and 400B-class models", QUESTIONS, {
    "plan-fewest": (P.SCENARIOS, P.WORKING_SET),
    "plan-offload": (P.SCENARIOS, P.OFFLOAD_PROBLEM),
    "plan-8b-one-gpu": (P.SCENARIOS,),
    "plan-pp-zero3": (P.PLAN_CLAIMS,),
    "plan-slow-link": (P.SELECTION, P.ZERO3_TIME),
    "plan-3d": (P.SCENARIOS, P.SELECTION),
})
