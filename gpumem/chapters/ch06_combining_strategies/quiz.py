"""Chapter 06's quiz: what pipeline stages can and cannot save, whether ZeRO-3 alone fits, when
ZeRO-3's traffic hides, what a pipeline bubble costs, and what a slow network changes. Numbers
are drawn per attempt; expected values come from the engine (``accounting``, ``planner_memory``,
``planner_cost``, ``planner``)."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick
from gpumem.memory import accounting, gpus, models, planner, planner_cost, planner_memory
from gpumem.memory.planner_memory import Layout

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
    return n


def _zero3_gb(n: dict) -> float:
    states = accounting.model_states(n["n_params"], "pure-bf16", n["gpus"], 3).total
    return (states + int(accounting.zero3_gathered(n["largest"], "pure-bf16", 0))) / GB


def _hide(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, ("a100-80gb", "h100-80gb")))
    n |= {"gpus": pick(rng, (16, 32, 64)), "link_gb": pick(rng, (3.125, 12.5, 25.0, 50.0))}
    n["tflops"] = gpus.get(n["gpu_name"]).bf16_flops / 1e12
    return n


def _hide_tokens(n: dict) -> float:
    """Tokens per GPU per micro-batch at which ZeRO-3's 3 psi of bf16 traffic equals 6 psi FLOPs
    per token at 40 % MFU (the planner's cost model)."""
    psi, N = n["n_params"], n["gpus"]
    comm = 3 * psi * 2 * (N - 1) / N / (n["link_gb"] * GB)
    return comm * gpus.get(n["gpu_name"]).bf16_flops * planner_cost.speed.MFU / (6 * psi)


def _bubble(rng) -> dict:
    n = model_numbers(pick(rng, ("llama-3-70b", "llama-3.1-405b"))) | {
        "pp": pick(rng, (4, 8, 16)), "dp": pick(rng, (4, 8, 16)), "mb": pick(rng, (1, 2)),
        "batch": pick(rng, (256, 512, 1024))}
    n["m"] = n["batch"] // (n["dp"] * n["mb"])
    return n


def _bubble_pct(n: dict) -> float:
    cfg = models.get(n["model_name"])
    lay = Layout("mixed", 1, "full", "flash", "none", "cpu", n["mb"], 8, n["pp"], n["dp"], n["m"])
    t = planner_cost.step_seconds(cfg, 4096, lay, gpus.get("h100-80gb"))
    return 100 * t["pipeline_bubble"] / t["compute"]


def slow_network_stage() -> int:
    """The ZeRO stage of the planner's best plan for Llama-3-8B on 16 A100 40GB (two nodes), batch
    64, on 10 Gb/s Ethernet between nodes, data parallelism only."""
    r = planner.plan("llama-3-8b", 16, "a100-40gb", seq=4096, global_batch=64, recipes=("mixed",),
                     tp=(1,), pp=(1,), inter_node=1.25e9)
    return r.best.layout.zero


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
            "{model} ({n_params:,} parameters; its largest module, the embedding, has {largest:,}) trains "
            "with ZeRO-3 alone on {gpus} x {gpu}, in pure bf16 (weights, gradients and both AdamW moments in "
            "bf16, nothing else). How many GB does a GPU hold for its model-state shards plus ZeRO-3's "
            "working set (the largest module gathered and its full gradient, both bf16), before any "
            "activation? (Its usable memory is {usable_gb:.1f} GB.)",
            answer=_zero3_gb, unit="GB", rel_tol=0.01,
            hint="Shards: 8 bytes a parameter over {gpus} GPUs. Working set: 2 + 2 bytes per element of "
                 "the largest module.",
            explanation="8 B x {n_params:,} / {gpus} plus 4 B x {largest:,} = {answer} GB of the "
                        "{usable_gb:.1f} GB usable; activations (several GB even with checkpointing) come "
                        "on top.",
            traps=((lambda n: 8 * n["n_params"] / n["gpus"] / GB, "that is the shards alone; add the "
                                                                   "gathered module and its gradient."),),
            draw=_zero3),
    Numeric("hide-zero3",
            "{model} ({n_params:,} parameters) trains with ZeRO-3 on {gpus} x {gpu} ({tflops:.0f} TFLOP/s "
            "dense bf16, run at 40 %), each GPU sending and receiving {link_gb} GB/s per direction between "
            "nodes. Per micro-batch ZeRO-3 gathers the bf16 weights twice (forward, backward) and "
            "reduce-scatters the bf16 gradients once, each rank moving (N-1)/N of each collective. Compute "
            "is 6 FLOPs per parameter per token. How many tokens per GPU must a micro-batch hold for the "
            "compute to take as long as the communication?",
            answer=_hide_tokens, unit="tokens", rel_tol=0.02,
            hint="Communication: 3 x 2 bytes x psi x (N-1)/N over the link. Compute: 6 x psi x tokens over "
                 "0.4 x peak. The parameter count cancels.",
            explanation="{answer} tokens: below that ZeRO-3's traffic shows in the step time. It depends on "
                        "the link and the GPU, not on the model: a slow network needs long micro-batches, "
                        "which cost activation memory.",
            traps=((lambda n: 2 / 3 * _hide_tokens(n), "that counts 2 psi (one gather); ZeRO-3 gathers in "
                                                        "backward again."),),
            draw=_hide),
    Numeric("bubble",
            "{model} trains with {pp} pipeline stages (1F1B schedule), {dp} data-parallel replicas, a "
            "global batch of {batch} sequences and micro-batches of {mb}. What percentage of the "
            "compute time does the pipeline bubble add?",
            answer=_bubble_pct, unit="%", rel_tol=0.01,
            hint="How many micro-batches does each replica run per step? The bubble is (stages - 1) "
                 "micro-batch slots.",
            explanation="{m} micro-batches per replica: (pp - 1)/m = {answer} %. More micro-batches (a "
                        "larger batch or smaller micro-batches) shrink it.",
            traps=((lambda n: 100 * (n["pp"] - 1) / n["pp"], "that divides by the stages; the bubble "
                                                             "shrinks with the micro-batch count."),),
            draw=_bubble),
    Choice("slow-network",
           "Llama-3-8B trains on 16 A100 40GB in two nodes of 8, global batch 64, sequence 4096, data "
           "parallelism only (no tensor or pipeline stages). Between the nodes the only link is 10 Gb/s "
           "Ethernet (1.25 GB/s per GPU). Which ZeRO stage does the planner's fastest layout use?",
           options=["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"], answer=slow_network_stage(),
           hint="Per micro-batch, which stage moves the parameters over the network, and how long does "
                "16 GB take at 1.25 GB/s?",
           explanation="ZeRO-3 moves 3 psi every micro-batch; on 1.25 GB/s that dwarfs the compute. The "
                       "planner keeps the parameters whole and pays in recomputation or offload instead, "
                       "communicating gradients once per step: the note's rule, prefer checkpointing "
                       "when bandwidth is scarce."),
])
