"""Chapter 03's quiz: what recomputation costs in FLOPs and seconds, where to put checkpoints,
and what the finer kinds of recomputation buy. Each attempt draws a model, sequence length or
GPU; every expected value is computed by the library (``gpumem.memory.recompute_cost``,
``gpumem.timing.compute``) for the numbers drawn."""

import math

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick
from gpumem.memory import gpus, models, recompute_cost
from gpumem.timing import compute
from gpumem.memory.activations import layer_parts
from gpumem.memory.recompute_plans import from_segments

SEQS = (2048, 4096, 8192, 16384)


def _dims(model: str) -> dict:
    cfg = models.get(model)
    return model_numbers(model) | {"ffn": cfg.ffn, "vocab": cfg.vocab, "kv_dim": cfg.kv_dim}


def _overhead(rng) -> dict:
    n = _dims(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS)}
    cfg = models.get(n["model_name"])
    f = recompute_cost.step_flops(cfg, n["seq"], 1, "full", "scratch")
    lay = recompute_cost.layer_flops(cfg, n["seq"])
    return n | {"fwd_t": f["forward"] / 1e12, "bwd_t": f["backward"] / 1e12, "rec_t": f["recompute"] / 1e12,
                "core_share": 100 * lay["core"] / lay["total"],
                "torch_pct": 100 * recompute_cost.step_flops(cfg, n["seq"], 1, "full", "torch")["overhead"]}


def _overhead_pct(n: dict) -> float:
    return 100 * recompute_cost.step_flops(models.get(n["model_name"]), n["seq"], 1, "full", "scratch")["overhead"]


def _spacing(rng) -> dict:
    base = models.get(pick(rng, LLAMAS))
    cfg = models.with_layers(base, pick(rng, (24, 48, 60, 96, 112, 140, 160)))
    n = model_numbers(base.name) | {"layers": cfg.n_layers, "seq": pick(rng, (4096, 8192))}
    T, h = n["seq"], cfg.d_model
    layer = sum(layer_parts(cfg, n["seq"], 1, "flash", 2).values())
    return n | {"interior": layer / (T * h), "sqrt_n": round(math.sqrt(cfg.n_layers)),
                "best": recompute_cost.best_segment_length(cfg, n["seq"])}


def _sum(n: dict, k: int) -> float:
    """The prompt's sum for segments of k layers, in units of s*b*h."""
    return math.ceil(n["layers"] / k) * 2 + k * n["interior"]


def _seconds(rng) -> dict:
    n = _dims(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, TRAINING_GPUS)) | {"seq": pick(rng, (4096, 8192))}
    g = gpus.get(n["gpu_name"])
    cfg = models.get(n["model_name"])
    f = recompute_cost.step_flops(cfg, n["seq"], 1, "full", "scratch")
    return n | {"tflops": g.bf16_flops / 1e12, "mfu_pct": round(100 * compute.MFU),
                "rec_t": f["recompute"] / 1e12,
                "step_s": compute.seconds(f["forward"] + f["backward"], g)}


def _recompute_seconds(n: dict) -> float:
    cfg = models.get(n["model_name"])
    return compute.seconds(recompute_cost.step_flops(cfg, n["seq"], 1, "full", "scratch")["recompute"],
                         n["gpu_name"])


def _mixed(rng) -> dict:
    n = _dims(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS), "k": pick(rng, (2, 3, 4))}
    cfg = models.get(n["model_name"])
    n["segs"] = pick(rng, range(2, cfg.n_layers // (2 * n["k"]) + 1))
    n["c"] = n["segs"] * n["k"]
    segments = [list(range(i * n["k"], (i + 1) * n["k"])) for i in range(n["segs"])]
    lay = recompute_cost.layer_flops(cfg, n["seq"])
    return n | {"rec_t": _tflop(cfg, n["seq"], from_segments(segments, cfg.n_layers, "mixed"), "scratch"),
                "layer_t": lay["total"] / 1e12, "down_t": lay["down"] / 1e12,
                "early_t": _tflop(cfg, n["seq"], from_segments(segments, cfg.n_layers, "mixed"), "torch")}


def _tflop(cfg, seq: int, plan, impl: str) -> float:
    return recompute_cost.step_flops(cfg, seq, 1, plan, impl)["recompute"] / 1e12


def _selective(rng) -> dict:
    n = _dims(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS + (32768,))}
    f = recompute_cost.step_flops(models.get(n["model_name"]), n["seq"], 1, "selective")
    return n | {"step_t": (f["forward"] + f["backward"]) / 1e12, "core_t": f["recompute"] / 1e12,
                "sel_pct": 100 * f["overhead"]}


def _all_params_seconds(n: dict) -> float:
    return 2 * n["n_params"] * n["seq"] / (n["tflops"] * 1e12 * compute.MFU)


QUIZ = Quiz("03_activation_checkpointing", [
    Numeric("full-overhead",
            "{model} ({layers} layers, d_model {d_model:,}, {heads} query and {kv_heads} key/value heads "
            "of 128, FFN {ffn:,}, vocabulary {vocab:,}, untied head) trains on sequences of {seq:,} "
            "tokens, micro-batch 1, with every layer checkpointed by a checkpoint that re-runs whole "
            "segments (the whole-segment re-run). Count FLOPs as PyTorch's FlopCounterMode does: a matmul of T tokens through a "
            "d_in x d_out weight is 2*T*d_in*d_out forward and twice that backward; attention's core "
            "is 4*s^2*d_model forward and 10*s^2*d_model backward per layer; nothing else counts. "
            "Recomputation adds what percentage to the forward + backward FLOPs?",
            answer=_overhead_pct, unit="%", rel_tol=0.01,
            hint="Recomputation is each layer's forward once more, and nothing outside the layers. Add "
                 "up the layers' forward (seven matmuls and the core, times {layers}), then forward and "
                 "backward of the whole step, with the head.",
            explanation="Forward {fwd_t:,.1f} TFLOP, backward {bwd_t:,.1f} TFLOP; the layers' forward "
                        "again is {rec_t:,.1f} TFLOP: {answer} %. Not 33 %: the head is not re-run, and "
                        "attention's backward is 2.5x its forward, not 2x (the core is {core_share:.0f} % "
                        "of a layer's forward here). The early-stop re-run (PyTorch's "
                        "non-reentrant checkpoint) adds {torch_pct:.1f} %: it skips each segment's "
                        "final W_down.",
            traps=((lambda n: 100 / 3, "that is 2N/6N: it re-runs the output head too and counts "
                                        "attention's backward as twice its forward."),
                   (lambda n: n["torch_pct"], "that is the early-stop re-run (PyTorch's non-reentrant "
                                              "checkpoint), which stops before each segment's last "
                                              "matmul; this one re-runs whole segments.")),
            draw=_overhead),
    Numeric("segment-length",
            "A deeper variant of {model} has {layers} layers. At sequence {seq:,} one layer keeps {interior:.1f} x s*b*h "
            "bytes for backward (flash attention, bf16), and its input, a checkpoint, 2 x s*b*h. With "
            "segments of k consecutive layers checkpointed, backward holds about ceil({layers}/k) "
            "checkpoints plus k layers being re-run. Which whole k makes that smallest?",
            answer=lambda n: n["best"], unit="layers", rel_tol=0.0,
            hint="Write the sum ceil({layers}/k) * 2 + k * {interior:.1f} (in units of s*b*h) and try "
                 "k = 1, 2, 3, ...",
            explanation="k = {answer}: each extra layer in a segment costs {interior:.1f} s*b*h while "
                        "it saves only 2 s*b*h per checkpoint dropped. Chen's sqrt(n) = {sqrt_n} "
                        "assumes a layer keeps no more than its input; a transformer layer keeps about "
                        "twenty times more, so the best segments are short.",
            traps=((lambda n: n["sqrt_n"], "that is sqrt(n), which assumes a layer keeps as much as "
                                           "its input. Compare the two sizes given."),),
            draw=_spacing),
    Numeric("recompute-seconds",
            "{model} ({n_params:,} parameters; {layers} layers, d_model {d_model:,}, FFN {ffn:,}, "
            "vocabulary {vocab:,}) trains at sequence {seq:,}, micro-batch 1 per GPU, on {gpu}s "
            "({tflops:.0f} TFLOP/s dense bf16), running every FLOP, re-runs included, at {mfu_pct} % of "
            "that peak, every layer checkpointed by a "
            "checkpoint that re-runs whole segments (the whole-segment re-run). How many seconds per sequence does the "
            "recomputation add on one GPU? Count attention's core as 4*s^2*d_model FLOPs a layer.",
            answer=_recompute_seconds, unit="s", rel_tol=0.02,
            hint="Re-running the layers costs their forward FLOPs: 2 x the layers' matmul parameters "
                 "x tokens, plus the core. Leave out the embedding and the head.",
            explanation="{rec_t:,.1f} TFLOP at {mfu_pct} % of {tflops:.0f} TFLOP/s: {answer} s, on a step "
                        "of {step_s:.2f} s without recomputation.",
            traps=((_all_params_seconds, "2 x all parameters x tokens counts the embedding and the head, "
                                         "which are not re-run, and leaves out attention's core."),),
            draw=_seconds),
    Numeric("mixed-plan-flops",
            "{model} ({layers} layers, d_model {d_model:,}, {heads} query and {kv_heads} key/value heads "
            "of 128, FFN {ffn:,}) trains on sequences of {seq:,} tokens, micro-batch 1. Its first {c} "
            "layers are checkpointed in segments of {k} consecutive layers, each re-run whole in "
            "backward; the other layers keep their activations. Count a matmul of T tokens through a "
            "d_in x d_out weight as 2*T*d_in*d_out and attention's core as 4*s^2*d_model a layer. How "
            "many TFLOP does the recomputation add per sequence?",
            answer=lambda n: n["rec_t"], unit="TFLOP", rel_tol=0.01,
            hint="Which layers run their forward twice? Does the segment length change how many?",
            explanation="{c} layers run their forward twice, {layer_t:,.3f} TFLOP each: {answer} TFLOP. "
                        "The segment length moves memory (fewer checkpoints, {k} layers re-run at "
                        "once), not FLOPs.",
            traps=((lambda n: n["rec_t"] / n["k"], "that divides by the segment length: every layer "
                                                   "inside a segment is re-run, not only one per segment."),
                   (lambda n: n["layers"] * n["layer_t"], "that re-runs every layer; the layers after "
                                                           "the first {c} keep their activations.")),
            draw=_mixed),
    Numeric("early-stop-flops",
            "{model} ({layers} layers, d_model {d_model:,}, {heads} query and {kv_heads} key/value heads "
            "of 128, FFN {ffn:,}) trains on sequences of {seq:,} tokens, micro-batch 1. Its first {c} "
            "layers are checkpointed in segments of {k} layers with PyTorch's non-reentrant "
            "torch.utils.checkpoint, which stops each re-run once the last tensor backward reads "
            "exists (the early-stop re-run); the other layers keep their activations. Count a matmul of T tokens through a "
            "d_in x d_out weight as 2*T*d_in*d_out and attention's core as 4*s^2*d_model a layer. How "
            "many TFLOP does the recomputation add per sequence?",
            answer=lambda n: n["early_t"], unit="TFLOP", rel_tol=0.005,
            hint="The layer's last operation is W_down followed by the residual sum. Does the layer's "
                 "backward read W_down's output? Then count, per segment, what is never re-run.",
            explanation="The whole-segment re-run would cost {rec_t:,.3f} TFLOP. Backward needs W_down's "
                        "input and weight, not its output, so the last W_down of each of the {segs} "
                        "segments ({down_t:,.3f} TFLOP each) is skipped: the early-stop re-run, {answer} TFLOP.",
            traps=((lambda n: n["rec_t"], "that re-runs every segment whole; the early stop skips the "
                                          "segment's final W_down."),
                   (lambda n: n["rec_t"] - n["c"] * n["down_t"], "that skips W_down in every layer; "
                                                                 "only the segment's last layer has "
                                                                 "nothing after it that backward reads.")),
            draw=_mixed),
    Numeric("selective-core",
            "{model} ({layers} layers, d_model {d_model:,}, {heads} query and {kv_heads} key/value heads "
            "of 128, FFN {ffn:,}) trains on sequences of {seq:,} tokens, micro-batch 1. It uses "
            "Megatron's selective recomputation: attention's core (QK^T and PV, 4*s^2*d_model FLOPs a "
            "layer, the causal half not subtracted) is re-run in backward; nothing else is. The "
            "forward + backward of the step without it is {step_t:,.1f} TFLOP. What percentage does "
            "the re-run add?",
            answer=lambda n: n["sel_pct"], unit="%", rel_tol=0.01,
            hint="The re-run is attention's core once more in each of the {layers} layers.",
            explanation="{layers} x 4 x {seq:,}^2 x {d_model:,} = {core_t:,.2f} TFLOP over {step_t:,.1f} "
                        "TFLOP: {answer} %. It grows with s. With a flash kernel this buys no memory: the "
                        "kernel keeps no scores and already recomputes them in its own backward.",
            traps=((lambda n: n["sel_pct"] / 2, "that counts the causal half only; the prompt counts "
                                                "the core in full."),),
            draw=_selective),
])
