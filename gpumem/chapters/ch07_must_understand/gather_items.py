"""Checklist item 2: why ZeRO-3 all-gathers in forward (and again in backward), and when those
gathers hide behind compute.

Numbers drawn per attempt: model, GPU, group shape (one node over NVLink, whole nodes, one GPU per
node, a PCIe-only node), GPU count and tokens per GPU. Bytes each GPU moves per pass, the rate its
share moves at on the group's placement (latency aside) and the seconds of compute come from
``gpumem.timing.zero3_cost.zero3_step_time`` (DeepSpeed's gather schedule replayed by
``gpumem.memory.zero3_schedule``, each collective timed by ``gpumem.timing.collectives``, FLOPs
at ``gpumem.timing.compute.KERNEL_SHARE`` of the peak, the planner's compute term).
"""

from gpumem.course.checklist import Item
from gpumem.course.quiz import Choice, Numeric
from gpumem.course.quiz_draws import LLAMAS, gpu_numbers, model_numbers, pick
from gpumem.timing import zero3_cost
from gpumem.memory import gpus
from gpumem.timing import compute
from gpumem.units import GB

from . import pointers as P

SHAPES = {"nvlink": (8,), "full-nodes": (16, 64), "rank-per-node": (8, 16, 64), "pcie": (8,)}


def link_words(gpu: str, n_gpus: int, link: str) -> str:
    """The group's placement in words, with the node's links (``gpumem.timing.hardware``)."""
    node = zero3_cost.node_of(gpu)
    nic = f"{node.nic_bw * 8 / GB:.0f} Gb/s"
    return {"nvlink": f"NVLink inside one {node.label}",
            "full-nodes": f"NVLink inside each of {n_gpus // node.gpus_per_node} {node.label} nodes and "
                          f"each node's {node.nics} {nic} NICs between them",
            "rank-per-node": f"a {nic} NIC each, one GPU in each of {n_gpus} {node.label} nodes",
            "pcie": f"PCIe only, in one {node.label}"}[link]


def _timed(model: str, n_gpus: int, gpu: str, link: str, tokens: int) -> dict:
    """ZeRO-3's per-pass bytes and seconds for these numbers (the time engine, latency aside)."""
    return zero3_cost.zero3_step_time(model, n_gpus, gpu, link, tokens_per_gpu=tokens, latency=False)


def _setting(rng, links=tuple(SHAPES)) -> dict:
    while True:       # SXM boards have NVLink; the PCIe-only L4 box trains 8B; ZeRO-3's 16 B fit
        link = pick(rng, links)
        gpu = "l4" if link == "pcie" else pick(rng, ("a100-80gb", "h100-80gb", "h200"))
        model = "llama-3-8b" if link == "pcie" else pick(rng, LLAMAS)
        n = model_numbers(model) | gpu_numbers(gpu) | {"gpus": pick(rng, SHAPES[link]), "link": link}
        if 16 * n["n_params"] / n["gpus"] < n["usable"]:
            break
    g = gpus.get(gpu)
    t = _timed(n["model_name"], n["gpus"], gpu, link, 4096)
    return n | {"link_words": link_words(gpu, n["gpus"], link), "bw_gb": t["link_bytes_per_s"] / GB,
                "binding": t["binding"], "tflops": g.bf16_flops / 1e12,
                "mfu_pct": round(100 * compute.KERNEL_SHARE)}


def _break_even(rng) -> dict:
    n = _setting(rng)
    t = _timed(n["model_name"], n["gpus"], n["gpu_name"], n["link"], 4096)
    f, b = t["phases"]["forward"], t["phases"]["backward"]
    return n | {"fwd_gb": f["bytes_moved"] / GB, "bwd_gb": b["bytes_moved"] / GB,
                "fwd_s": f["comm_s"], "tok_ms": 1e3 * f["compute_s"] / 4096,
                "fwd_tokens": 4096 * f["comm_s"] / f["compute_s"],
                "bwd_tokens": 4096 * b["comm_s"] / b["compute_s"]}


def _exposed(rng) -> dict:
    n = _setting(rng, ("rank-per-node", "pcie", "nvlink", "full-nodes", "rank-per-node"))
    n |= {"seq": pick(rng, (512, 1024, 2048, 4096)), "mb": pick(rng, (1, 2)), "accum": pick(rng, (4, 8, 16))}
    t = _timed(n["model_name"], n["gpus"], n["gpu_name"], n["link"], n["seq"] * n["mb"])
    f, b = t["phases"]["forward"], t["phases"]["backward"]
    return n | {"tokens": n["seq"] * n["mb"], "fwd_gb": f["bytes_moved"] / GB, "bwd_gb": b["bytes_moved"] / GB,
                "fc": f["comm_s"], "fw": f["compute_s"], "bc": b["comm_s"], "bw": b["compute_s"],
                "exposed": t["exposed_s"], "pooled": max(0.0, t["comm_s"] - t["compute_s"]),
                "all_comm": t["comm_s"], "even": (max(0.0, f["comm_s"] - (f["compute_s"] + b["compute_s"]) / 2)
                                                   + max(0.0, b["comm_s"] - (f["compute_s"] + b["compute_s"]) / 2))}


QUESTIONS = [
    Choice("gather-why",
           "Under ZeRO-3 on 8 GPUs, rank 0 is about to run one layer's query projection W_q on its "
           "own micro-batch. Why must it all-gather W_q first?",
           ["It holds an eighth of W_q's elements, and its tokens need every one",
            "Its copy of W_q is fp32 and the other ranks hold the bf16 version",
            "The other ranks need rank 0's activations to compute their gradients",
            "Each rank computes an eighth of the output columns, to be joined"],
           answer=0,
           hint="What does a rank keep of a weight between uses under stage 3, and what does a matmul "
                "of its own tokens read?",
           explanation="ZeRO-3 keeps only a 1/N shard of every weight on each rank. Each rank runs the "
                       "whole layer on its own data (data parallelism), so it needs the whole W_q for "
                       "the moment the module runs: it all-gathers the shards, computes, and frees the "
                       "other ranks' parts. Splitting the output columns is tensor parallelism, "
                       "another technique. Backward needs the weights again, so they are gathered "
                       "again."),
    Numeric("gather-break-even",
            "Under ZeRO-3, {model} ({n_params:,} parameters) trains on {gpus} {gpu}s linked by "
            "{link_words}: each GPU's share of a collective moves at {bw_gb:.1f} GB/s per direction "
            "(achieved, {binding} binds; latency aside). Each GPU receives {fwd_gb:.1f} GB of "
            "gathered weights per forward pass. Forward costs 2 FLOPs per parameter per token, run at "
            "{mfu_pct} % of {tflops:.0f} TFLOP/s. Prefetching can hide a gather behind the forward "
            "compute of the layers before it. From how many tokens per GPU per micro-batch does the "
            "forward pass compute at least as long as it gathers?",
            answer=lambda n: n["fwd_tokens"], unit="tokens", rel_tol=0.02,
            hint="The gather takes bytes / bandwidth seconds, whatever the tokens; forward takes "
                 "2 x parameters x tokens / (share x peak). Set them equal and solve for the tokens.",
            explanation="The gathers take {fwd_gb:.1f} GB / {bw_gb:.1f} GB/s = {fwd_s:.3f} s; each token "
                        "costs {tok_ms:.4f} ms of forward: {answer} tokens. Backward gathers again and "
                        "reduce-scatters ({bwd_gb:.1f} GB) against twice the compute: "
                        "{bwd_tokens:,.0f} tokens. Gathered bytes and FLOPs per token both grow in "
                        "proportion to the parameter count, so the break-even depends on the link and "
                        "the GPU's FLOP rate, not on the model size.",
            traps=((lambda n: n["fwd_tokens"] / 3, "that uses 6 FLOPs per parameter, the whole step. A "
                                                   "forward gather can only hide behind forward compute."),),
            draw=_break_even),
    Numeric("gather-exposed",
            "Under ZeRO-3, {model} ({n_params:,} parameters) trains on {gpus} {gpu}s linked by "
            "{link_words}: each GPU's share of a collective moves at {bw_gb:.1f} GB/s per direction "
            "(achieved, {binding} binds; latency aside), {tokens:,} tokens per GPU per micro-batch "
            "({mb} x {seq:,}), {accum} micro-batches per optimizer step. Per micro-batch each GPU's "
            "share of ZeRO-3's collectives is {fwd_gb:.1f} GB in forward and {bwd_gb:.1f} GB in "
            "backward. A training "
            "step costs 6 FLOPs per parameter per token, forward and backward together, run at "
            "{mfu_pct} % of {tflops:.0f} TFLOP/s. DeepSpeed prefetches the next modules' weights "
            "while the current ones compute. How many seconds per micro-batch do the transfers add "
            "to the step?",
            answer=lambda n: n["exposed"], unit="s", rel_tol=0.02, abs_tol=0.002,
            hint="Can a gather that forward needs wait behind backward's compute? Split the FLOPs "
                 "between the passes, then compare each pass's transfer with its own compute.",
            explanation="Forward: {fc:.3f} s of transfer against {fw:.3f} s of compute; backward: "
                        "{bc:.3f} s against {bw:.3f} s. What sticks out: {answer} s. Longer sequences or "
                        "larger micro-batches add compute, not transfer, and hide more.",
            traps=((lambda n: n["pooled"], "that pools both passes. The forward's gathers cannot hide "
                                           "behind backward compute, which has not started."),
                   (lambda n: n["all_comm"], "that counts every transfer as if nothing overlapped. "
                                             "Prefetching overlaps each pass's transfers with its "
                                             "compute."),
                   (lambda n: n["even"], "that splits the compute evenly between the passes; "
                                         "backward does twice forward's FLOPs."),
                   (lambda n: n["accum"] * n["expected"], "that is per optimizer step; the question "
                                                          "asks per micro-batch.")),
            draw=_exposed),
    Choice("gather-hide-more",
           "A 64-GPU cluster trains under ZeRO-3, and part of each step waits for gathers. On the "
           "same GPUs and links, which change hides a larger share of the gather time behind compute?",
           ["Train a larger model of the same family",
            "Add more GPUs to the data-parallel ring",
            "Lower stage3_max_reuse_distance",
            "Give each GPU more tokens per micro-batch"],
           answer=3,
           hint="Write the gather time and the compute time of one pass per GPU. Which of them grows "
                "with the model, which with the GPU count, which with the tokens?",
           explanation="Gathered bytes and compute both grow with the parameter count, so a larger "
                       "model changes nothing; more GPUs only move (N-1)/N closer to 1; a smaller "
                       "reuse distance releases more weights between forward and backward, so more "
                       "is gathered again. Compute grows with the tokens each GPU processes while the "
                       "gathered bytes do not."),
    Choice("gather-backward",
           "DeepSpeed's ZeRO-3 gathers Llama-3-70B's weights for forward and nearly all of them "
           "again for backward. Why gather twice?",
           ["Backward needs the fp32 master weights, forward the bf16 ones",
            "The gradient reduce-scatter overwrites the gathered weights",
            "A module's gathered weights are released after its forward",
            "Backward visits the layers in the reverse of the gather order"],
           answer=2,
           hint="What would a rank hold by the end of forward if it kept every gathered module?",
           explanation="If a rank kept every module it gathered, by the end of forward it would hold "
                       "the whole model, and the sharding would save nothing during the pass. So it "
                       "frees each module after use, unless the module is used again within "
                       "stage3_max_reuse_distance elements. For 70B the 1.05 billion-element head "
                       "runs between the last layer's forward and its backward and fills that window, "
                       "so every layer is gathered again. Backward's reverse order changes only which "
                       "module is prefetched next, and both passes use the bf16 weights."),
]

ITEM = Item("gather", "Why ZeRO-3 all-gathers in forward, and when the gathers overlap", QUESTIONS, {
    "gather-why": (P.WHO_HOLDS,),
    "gather-break-even": (P.ZERO3_TIME,),
    "gather-exposed": (P.ZERO3_TIME,),
    "gather-hide-more": (P.ZERO3_TIME, P.GATHER_TRACE),
    "gather-backward": (P.GATHER_TRACE,),
})
