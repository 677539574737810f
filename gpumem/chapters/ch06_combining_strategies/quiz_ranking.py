"""Chapter 06's prediction question: on a cluster the chapter has not shown (model, GPU, node count
and network drawn per attempt), which family of data-parallel layout does the planner rank first?
The right option is the planner's own answer for the drawn cluster (``planner.plan`` with tensor,
pipeline and context parallelism off, asked once per cluster), and the explanation reads the top
plan against the best plan of the runner-up family term by term (:func:`gpumem.planner.explain.versus`).

Every drawn cluster is one where the winning family is at least :data:`MARGIN` faster than the best
plan of every other family (checked by the chapter's tests), so that a prediction can be right by
reasoning rather than by a tie-break."""

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from gpumem import planner
from gpumem.course.quiz import Choice
from gpumem.course.quiz_draws import gpu_numbers, model_numbers, pick
from gpumem.planner import explain

MARGIN = 0.03
# (model, GPU, GPUs, network words, bytes/s per GPU between nodes): clusters the chapter does not show
NETWORKS = {"ib": ("one 400 Gb/s InfiniBand NIC per GPU (50 GB/s each way)", 50e9),
            "eth100": ("one 100 Gb/s Ethernet port per node, shared by its 8 GPUs", 12.5e9 / 8),
            "eth25": ("one 25 Gb/s Ethernet port per node, shared by its 8 GPUs", 3.125e9 / 8)}
CASES = (("llama-3-8b", "h100-80gb", 128, "eth100"), ("llama-3-70b", "h100-80gb", 32, "ib"),
         ("llama-3-70b", "h100-80gb", 128, "ib"), ("llama-3-70b", "h200", 128, "eth25"))
OPTIONS = ["Plain ZeRO-3 over every GPU, all model states kept in GPU memory",
           "Hybrid sharding (hpZ or HSDP): ZeRO-3 with a shard group inside each node",
           "ZeRO-3 over every GPU with model states offloaded to host memory",
           "ZeRO-1 or ZeRO-2 over every GPU, whole bf16 weights on each GPU"]
WHY = {"zero3": "ZeRO-3's gathers and reduce-scatters, three per micro-batch, hide behind compute on "
                 "this network, and states divided by every GPU leave the most room for activations.",
       "hsdp": "plain ZeRO-3 sends its three collectives per micro-batch through the NICs; HSDP keeps "
               "them on NVLink inside the node and crosses nodes once a step, all-reducing its group's "
               "share of the gradients. Its price, model states divided by 8 GPUs instead of all, fits.",
       "hpz": "hpZ keeps a second copy of the weights sharded inside the node, so backward's gather, "
              "one of ZeRO-3's three collectives per micro-batch, stays on NVLink; forward's gather and "
              "the reduce-scatter still cross nodes. Its price, the second copy, fits.",
       "offload": "the offloaded states free GPU memory for activations (fewer re-runs, or longer "
                  "micro-batches and so fewer ZeRO-3 passes a step); CPU Adam's seconds cost less than "
                  "what that saves.",
       "zero12": "ZeRO-1/2 never gather weights and move gradients once a step (ZeRO-2: per micro-batch); "
                 "on this network that beats ZeRO-3's three collectives per micro-batch."}


def family(lay) -> int:
    """Which of :data:`OPTIONS` a data-parallel layout belongs to."""
    if lay.zero == 3 and lay.hybrid != "none":
        return 1
    if lay.offload != "none":
        return 2
    return 0 if lay.zero == 3 else 3


@lru_cache(maxsize=len(CASES))
def asked(case: tuple) -> planner.Result:
    """The planner's answer for one of :data:`CASES` (data parallelism only)."""
    model, gpu, gpus, net = case
    return planner.plan(model, gpus, gpu, seq=4096, inter_node=NETWORKS[net][1], tp=(1,), pp=(1,), cp=(1,),
                        advise=False)


def best_by_family(result: planner.Result) -> dict:
    """The first plan of each family in the planner's order."""
    out: dict = {}
    for p in result.plans:
        out.setdefault(family(p.layout), p)
    return out


def _draw(rng) -> dict:
    case = pick(rng, CASES)
    model, gpu, gpus, net = case
    return model_numbers(model) | gpu_numbers(gpu) | {"case": case, "gpus": gpus, "nodes": gpus // 8,
                                                      "network": NETWORKS[net][0]}


def _explained(n: dict) -> str:
    r = asked(n["case"])
    best = best_by_family(r)
    top = r.best
    win = family(top.layout)
    others = sorted((p.time["total"], f) for f, p in best.items() if f != win)
    parts = [f"({f}) {best[f].time['total']:.1f} s" for _, f in others]
    missing = [f"({f})" for f in range(len(OPTIONS)) if f not in best]
    text = (f"The planner ranks {top.layout.label()} first, {top.time['total']:.2f} s a step. Best of "
            f"each other option: " + "; ".join(parts) + (f"; {', '.join(missing)} nothing fits" if missing
                                                          else "") + ".")
    if others:
        second = best[others[0][1]]
        v = explain.versus(top, second)
        moves = [f"{k} {d:+.2f} s" for k, _, _, d in v.rows if abs(d) >= 0.005][:3]
        text += (f" Against ({others[0][1]})'s best, term by term (theirs minus the top's): "
                 + (", ".join(moves) or "no term differs by 0.01 s")
                 + f"; per GPU {second.memory['total'] / 1e9:.1f} GB against {top.memory['total'] / 1e9:.1f} GB.")
    why = top.layout.hybrid if win == 1 else ("zero3", None, "offload", "zero12")[win]
    return text + " Why: " + WHY[why]


@dataclass
class PredictChoice(Choice):
    """A multiple choice whose cluster is drawn per attempt (``draw``) and whose right option is the
    family of the planner's top plan for it, set at each draw (``answer=0`` is a placeholder)."""
    draw: Callable | None = None

    def redraw(self, rng) -> None:
        super().redraw(rng)
        self.answer = family(asked(self.numbers["case"]).best.layout)


QUESTION = PredictChoice(
    "predict-sharding",
    "A team trains {model} ({n_params:,} parameters) with data parallelism only (FSDP2 or DeepSpeed "
    "ZeRO: no tensor, pipeline or context parallelism) on {gpus} {gpu} GPUs, {nodes} nodes of 8 joined "
    "by NVLink inside a node and, between nodes, {network}. Sequences of 4,096 tokens, 4M tokens a step, "
    "standard mixed precision, CPU Adam at the ZeRO-Offload paper's rate. Before asking the planner, "
    "predict: which family does its top plan belong to?",
    OPTIONS, answer=0, explanation=_explained, draw=_draw,
    hint="Count what crosses the NICs per step in each family: ZeRO-3 gathers the weights twice and "
         "reduce-scatters the gradients once per micro-batch; hybrid sharding sends less: with hpZ the "
         "backward all-gather stays inside the node (forward's gather and the reduce-scatter still "
         "cross), with HSDP only a once-a-step all-reduce of a 1/group shard of the gradients crosses "
         "nodes; ZeRO-1/2 keep whole weights. Set that against the "
         "compute a micro-batch offers on this GPU, then check what each family needs to fit in memory "
         "(and what checkpointing it is then forced into).")
