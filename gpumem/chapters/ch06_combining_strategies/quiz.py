"""Chapter 06's quiz: what pipeline stages can and cannot save, whether ZeRO-3 alone fits, when
ZeRO-3's traffic hides, what a pipeline bubble costs, what a slow network changes, which family
of layout the planner ranks first on a drawn cluster (``quiz_ranking``), and
(``quiz_topology``) which link binds a collective on a group shape drawn per attempt. Numbers
are drawn per attempt; expected values come from the engine (``accounting``, ``planner.memory``,
``planner.cost``, ``planner``)."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick
from gpumem.memory import accounting, gpus, models
from gpumem import planner
from gpumem.planner import cost as planner_cost, memory as planner_memory
from gpumem.planner.memory import Layout
from gpumem.timing import compute

from .quiz_ranking import QUESTION as PREDICT_QUESTION
from .quiz_topology import QUESTIONS as TOPOLOGY_QUESTIONS

GB = 10**9


def _pp_floor(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"gpus": pick(rng, (8, 16, 32)), "pp": pick(rng, (2, 4, 8))}
    cfg = models.get(n["model_name"])
    n["dp"] = n["gpus"] // n["pp"]
    n["stage_params"] = planner_memory.local_params(cfg, 1, n["pp"])["params"]
    n["zero3_gb"] = accounting.model_states(cfg.n_params(), "mixed", n["gpus"], 3).total / GB
    return n


def _pp_floor_gb(n: dict) -> float:
    return accounting.model_states(n["stage_params"], "mixed", n["dp"], 1).total / GB


def _zero3(rng) -> dict:
    n = model_numbers(pick(rng, ("llama-3-70b", "llama-3.1-405b"))) | gpu_numbers(pick(rng, TRAINING_GPUS))
    cfg = models.get(n["model_name"])
    n["gpus"] = pick(rng, (8, 16) if n["model_name"] == "llama-3-70b" else (32, 64))
    n["largest"] = cfg.largest_layer_params()
    n["usable_gb"] = gpus.usable(n["gpu_name"]) / GB
    n["block"] = (cfg.n_params() - 2 * cfg.vocab * cfg.d_model - cfg.d_model) // cfg.n_layers  # one layer
    n["shards_gb"] = 8 * n["n_params"] / n["gpus"] / GB
    return n


def _zero3_gb(n: dict) -> float:
    states = accounting.model_states(n["n_params"], "pure-bf16", n["gpus"], 3).total
    # the prompt sets communication buffers aside: no prefetch bucket, no reduce bucket
    return (states + int(accounting.zero3_gathered(n["largest"], "pure-bf16", 0, 0))) / GB


def _hide(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, ("a100-80gb", "h100-80gb")))
    n |= {"gpus": pick(rng, (16, 32, 64)), "link_gb": pick(rng, (3.125, 12.5, 25.0, 50.0))}
    n["tflops"] = gpus.get(n["gpu_name"]).bf16_flops / 1e12
    n["hbm_tb"] = gpus.get(n["gpu_name"]).hbm / 1e12
    n["share_pct"] = round(100 * compute.KERNEL_SHARE)
    return n


def _hide_tokens(n: dict) -> float:
    """Tokens per GPU per micro-batch at which ZeRO-3's 3 psi of bf16 traffic equals 6 psi FLOPs
    per token at the planner's kernel share (``compute.KERNEL_SHARE``, the compute the traffic hides
    behind; stated in the prompt)."""
    psi, N = n["n_params"], n["gpus"]
    comm = 3 * psi * 2 * (N - 1) / N / (n["link_gb"] * GB)
    return comm * gpus.get(n["gpu_name"]).bf16_flops * compute.KERNEL_SHARE / (6 * psi)


BUBBLE_TARGET = 0.05      # the bubble share of the micro-batches' own time the question asks to stay under


def _bubble_layout(cfg, n: dict, m: int) -> Layout:
    return Layout(recipe="mixed", zero=1, checkpoint="full", attention="flash", offload="none", device="cpu",
                  micro_batch=1, tp=8, pp=n["pp"], dp=n["dp"], n_micro=m)


def _bubble(rng) -> dict:
    n = model_numbers(pick(rng, ("llama-3-70b", "llama-3.1-405b"))) | {
        "pp": pick(rng, (4, 8, 16)), "dp": pick(rng, (4, 8, 16))}
    cfg, h100 = models.get(n["model_name"]), gpus.get("h100-80gb")
    m = 1
    while True:   # the planner's cost model: the fewest micro-batches with bubble <= 5 % of their own time
        t = planner_cost.step_seconds(cfg, 4096, _bubble_layout(cfg, n, m), h100)
        own = t["compute"] + t["tensor_parallel"] + t["attention_scores"]   # the micro-batches' stage time
        if t["pipeline_bubble"] <= BUBBLE_TARGET * own * (1 + 1e-12):   # (pp-1)/m = 5 % exactly counts
            break
        m += 1
    acts = {k: planner_memory.stage_activations(cfg, 4096, _bubble_layout(cfg, n, k))["first"] / GB
            for k in (1, n["pp"], m)}
    return n | {"m": m, "batch": m * n["dp"], "acts_1": acts[1], "acts_pp": acts[n["pp"]], "acts_m": acts[m]}


def _slow(rng) -> dict:
    n = model_numbers("llama-3-8b") | gpu_numbers(pick(rng, ("a100-40gb", "a100-80gb", "h100-80gb")))
    n |= {"link_gb": pick(rng, (1.25, 2.5, 3.125)), "mb": pick(rng, (1, 2, 4)), "n_micro": 4}
    cfg = models.get("llama-3-8b")
    lay = Layout(recipe="mixed", zero=3, checkpoint="full", attention="flash", offload="none", device="cpu",
                 micro_batch=n["mb"], tp=1, pp=1, dp=16, n_micro=n["n_micro"])
    # one link per node, shared by its 8 GPUs: each GPU's share as the per-GPU line rate
    t = planner_cost.step_seconds(cfg, 4096, lay, gpus.get(n["gpu_name"]), inter_node=n["link_gb"] * GB / 8)
    n["nvlink_gb"] = gpus.get(n["gpu_name"]).nvlink / GB
    n |= {"psi": planner_memory.local_params(cfg, 1, 1)["params"], "compute_s": t["compute"],
          "moved_s": t["data_parallel_moved_s"], "exposed_s": t["data_parallel"]}
    return n


QUIZ = Quiz("06_combining_strategies", [
    Numeric("pp-floor",
            "{model} ({n_params:,} parameters) trains on {gpus} GPUs in {pp} pipeline stages with DeepSpeed, "
            "mixed precision (bf16 weights and gradients, fp32 master weights and AdamW moments: 16 bytes a "
            "parameter). The largest stage holds {stage_params:,} parameters. Using the deepest ZeRO stage "
            "DeepSpeed allows with pipeline parallelism, how many GB of model states does one GPU of that "
            "stage hold?",
            answer=_pp_floor_gb, unit="GB", rel_tol=0.01,
            hint="Which ZeRO stages does DeepSpeed's pipeline engine accept? With {pp} stages, how many "
                 "data-parallel replicas share each stage's optimizer states?",
            explanation="ZeRO-1 at most: weights and gradients of the stage stay whole (4 B x {stage_params:,}) "
                        "and only the 12 optimizer bytes split over the {dp} replicas: {answer} GB. ZeRO-3 "
                        "without stages would hold {zero3_gb:.1f} GB: pipelining never goes below 1/N.",
            traps=((lambda n: n["zero3_gb"], "that is ZeRO-3 over all {gpus} GPUs; DeepSpeed refuses ZeRO-3 "
                                             "with pipeline stages."),
                   (lambda n: 16 * n["stage_params"] / GB, "that keeps the optimizer whole too; ZeRO-1 "
                                                           "still shards it over the replicas.")),
            draw=_pp_floor),
    Numeric("zero3-alone",
            "{model} ({n_params:,} parameters; its largest module, the embedding, has {largest:,}, and "
            "one transformer layer {block:,}) trains with ZeRO-3 alone on {gpus} x {gpu} ({usable_gb:.1f} GB "
            "usable each), in pure bf16 (weights, gradients and both AdamW moments in bf16, nothing "
            "else). DeepSpeed gathers one module's weights at a time here (no prefetch) and frees them "
            "after use. Leaving activations and communication buffers aside, how many GB does one GPU "
            "hold for weights, gradients and optimizer states at the worst moment of backward?",
            answer=_zero3_gb, unit="GB", rel_tol=0.01,
            hint="What does every GPU keep all step, and what exists on it only while one module runs "
                 "its backward? Which module makes that largest?",
            explanation="8 B x {n_params:,} / {gpus} = {shards_gb:.1f} GB of shards, plus the largest "
                        "module gathered whole (2 B) and its full gradient before the reduce-scatter "
                        "(2 B): 4 B x {largest:,}, {answer} GB of the {usable_gb:.1f} GB usable; activations "
                        "(several GB even with checkpointing) come on top.",
            traps=((lambda n: n["shards_gb"], "that is the shards alone; a module's backward needs its "
                                              "weights whole and makes its full gradient."),
                   (lambda n: n["shards_gb"] + 2 * n["largest"] / GB,
                    "backward also makes the module's full gradient before it is reduce-scattered."),
                   (lambda n: n["shards_gb"] + 4 * n["block"] / GB,
                    "DeepSpeed gathers per module, not per layer: the largest module is the embedding."),
                   (lambda n: 2 * n["shards_gb"] + 4 * n["largest"] / GB,
                    "that is 16 B a parameter, mixed precision; here everything is bf16."),
                   (lambda n: n["shards_gb"] + 8 * n["largest"] / GB,
                    "the module's optimizer states stay sharded; only its weights and gradient are whole.")),
            draw=_zero3),
    Numeric("hide-zero3",
            "{model} ({n_params:,} parameters, bf16 weights and gradients) trains with ZeRO-3 on {gpus} "
            "x {gpu} ({tflops:.0f} TFLOP/s dense bf16, run at {share_pct} % while computing; HBM "
            "{hbm_tb:.2f} TB/s), one GPU per node, each GPU sending and receiving {link_gb} GB/s per "
            "direction between nodes. ZeRO-3's collectives are prefetched behind the compute of the "
            "same micro-batch. How many tokens per GPU must a micro-batch hold for its compute to take "
            "as long as its communication?",
            answer=_hide_tokens, unit="tokens", rel_tol=0.01,
            hint="Which collectives does ZeRO-3 run per micro-batch, in which passes, and how much of "
                 "each does a rank send? Then the FLOPs of training one token.",
            explanation="{answer} tokens: the traffic is 3 x 2 B x psi x (N-1)/N per micro-batch (two "
                        "all-gathers of the weights, forward and backward, one reduce-scatter of the "
                        "gradients) over {link_gb} GB/s, the compute 6 x psi x tokens at {share_pct} % of "
                        "{tflops:.0f} TFLOP/s; psi cancels. Below that ZeRO-3's traffic shows in the step "
                        "time. It depends on the link and the GPU, not on the model: a slow network needs "
                        "long micro-batches, which cost activation memory. HBM plays no part.",
            traps=((lambda n: 2 / 3 * _hide_tokens(n), "that counts 2 psi (one gather); ZeRO-3 gathers in "
                                                        "backward again."),
                   (lambda n: n["gpus"] / (n["gpus"] - 1) * _hide_tokens(n),
                    "a rank already holds 1/{gpus} of each tensor: it sends and receives (N-1)/N of it."),
                   (lambda n: 3 * _hide_tokens(n), "6 FLOPs per parameter per token is forward and "
                                                    "backward; that uses 2, forward alone."),
                   (lambda n: 4 / 3 * _hide_tokens(n), "the gradients are reduce-scattered, not all-reduced: "
                                                        "each rank keeps only its shard."),
                   (lambda n: 0.40 / compute.KERNEL_SHARE * _hide_tokens(n),
                    "the traffic hides behind the kernels' time, at {share_pct} %, not a whole-step MFU.")),
            draw=_hide),
    Numeric("bubble",
            "{model} trains with {pp} pipeline stages (1F1B schedule), tensor parallelism 8, {dp} "
            "data-parallel replicas, sequences of 4,096 and micro-batches of one sequence. How many "
            "micro-batches must each replica run per step for the pipeline bubble to cost at most 5 % of "
            "the micro-batches' own time (their compute and tensor-parallel collectives)?",
            answer=lambda n: n["m"], unit="micro-batches", rel_tol=0.0,
            hint="The bubble adds (stages - 1)/(micro-batches) of the micro-batches' own time. Then ask what the first "
                 "stage holds while the pipe is full: does it grow with every extra micro-batch?",
            explanation="(pp - 1)/m <= 0.05 needs m >= 20 (pp - 1): {answer} micro-batches, a global batch of "
                        "{batch} sequences. The memory price is small: under 1F1B the first stage holds at "
                        "most {pp} micro-batches in flight, so its activations grow from {acts_1:.1f} GB "
                        "(m = 1) to {acts_pp:.1f} GB at m = {pp} and stay there ({acts_m:.1f} GB at m = "
                        "{answer}). The real price is the batch size the optimizer must accept.",
            traps=((lambda n: n["pp"] - 1, "that makes the bubble as long as the compute; the bubble "
                                           "is (pp - 1)/m of it."),),
            draw=_bubble),
    Numeric("slow-network",
            "{model} ({psi:,} parameters) trains with ZeRO-3 over 16 {gpu}s in two nodes of 8, "
            "micro-batches of {mb} x 4,096 tokens, {n_micro} micro-batches a step. Inside a node the GPUs "
            "share NVLink ({nvlink_gb:.0f} GB/s per GPU per direction); each node has one {link_gb} GB/s "
            "link (per direction) to the other, which NCCL drives at 94 % of its rate, and NCCL's rings "
            "run over all 16 GPUs. The planner's cost model gives {compute_s:.2f} s of compute per step, "
            "behind which ZeRO-3's prefetched traffic can hide. How many seconds of that traffic per step "
            "are exposed (NCCL's per-call latency is under 1 % here)?",
            answer=lambda n: n["exposed_s"], unit="s", rel_tol=0.01,
            hint="Which collectives does ZeRO-3 run per micro-batch, and how many bytes of each does a "
                 "16-rank ring push through the one link between the nodes? Which link binds?",
            explanation="Per micro-batch ZeRO-3 gathers the bf16 weights twice and reduce-scatters the "
                        "bf16 gradients once; a ring crosses the node link once, so the link carries one "
                        "rank's share, 15/16 x 2 B x psi of each collective, at 94 % of {link_gb} GB/s. "
                        "The transfers take {moved_s:.2f} s against {compute_s:.2f} s of compute: {answer} s "
                        "exposed. On a slow link ZeRO-3 pays in every micro-batch, which is why the planner "
                        "then cuts the micro-batch count (longer micro-batches, checkpointed to fit), or a "
                        "layout shards inside a node and replicates across nodes.",
            traps=((lambda n: n["moved_s"], "that is all of the traffic; the part that runs while the GPU "
                                            "computes is hidden."),
                   (lambda n: max(0.0, 2 / 3 * n["moved_s"] - n["compute_s"]),
                    "ZeRO-3 gathers the weights again for backward: three collectives per micro-batch."),
                   (lambda n: max(0.0, n["moved_s"] / n["n_micro"] - n["compute_s"]),
                    "ZeRO-3 runs its collectives in every micro-batch, {n_micro} a step."),
                   (lambda n: max(0.0, 8 * n["moved_s"] - n["compute_s"]),
                    "a ring crosses the node link once: the link carries one rank's share, not each of "
                    "the 8 GPUs' own."),
                   (lambda n: max(0.0, 0.94 * n["moved_s"] - n["compute_s"]),
                    "NCCL drives the link at 94 % of its rate: the transfers take longer than at line rate.")),
            draw=_slow),
    PREDICT_QUESTION,
    *TOPOLOGY_QUESTIONS,
])
