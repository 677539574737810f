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


def _forward_parts(cfg, seq: int) -> dict:
    """One forward pass's FLOPs by part, TFLOP (PyTorch's count: the core in full)."""
    lay = recompute_cost.layer_flops(cfg, seq)
    return {"mm_t": cfg.n_layers * lay["matmuls"] / 1e12, "core_t": cfg.n_layers * lay["core"] / 1e12,
            "head_t": 2 * seq * cfg.d_model * cfg.vocab / 1e12}


def _overhead(rng) -> dict:
    n = _dims(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS)}
    cfg = models.get(n["model_name"])
    f = recompute_cost.step_flops(cfg, n["seq"], 1, "full", "scratch")
    lay = recompute_cost.layer_flops(cfg, n["seq"])
    return n | _forward_parts(cfg, n["seq"]) | {
        "fwd_t": f["forward"] / 1e12, "bwd_t": f["backward"] / 1e12, "rec_t": f["recompute"] / 1e12,
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
    w = 2 * (2 * h * h + 2 * h * cfg.kv_dim + 3 * h * cfg.ffn)       # one layer's bf16 weights
    return n | {"interior": layer / (T * h), "sqrt_n": round(math.sqrt(cfg.n_layers)), "w_gb": w / 1e9,
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
    cfg = models.get(n["model_name"])
    f = recompute_cost.step_flops(cfg, n["seq"], 1, "selective")
    return n | _forward_parts(cfg, n["seq"]) | {"step_t": (f["forward"] + f["backward"]) / 1e12,
                                                "rec_t": f["recompute"] / 1e12, "sel_pct": 100 * f["overhead"]}


def _all_params_seconds(n: dict) -> float:
    return 2 * n["n_params"] * n["seq"] / (n["tflops"] * 1e12 * compute.MFU)


QUIZ = Quiz("03_activation_checkpointing", [
    Numeric("full-overhead",
            "{model} ({n_params:,} parameters, {layers} layers) trains on sequences of {seq:,} tokens, "
            "micro-batch 1, flash attention, every layer checkpointed by a checkpoint that re-runs whole "
            "segments (the whole-segment re-run). PyTorch's FlopCounterMode, run over one forward pass "
            "without checkpointing, reports {mm_t:,.3f} TFLOP in the layers' matmuls, {core_t:,.3f} TFLOP "
            "in attention's core (QK^T and PV) and {head_t:,.3f} TFLOP in the output head; the embedding "
            "is a lookup. It counts a matmul's backward as twice its forward and the flash core's backward "
            "as 2.5 times its forward. Recomputation adds what percentage to the forward + backward FLOPs?",
            answer=_overhead_pct, unit="%", rel_tol=0.004,     # 2N/6N's 33.3 % can be 0.9 % away
            hint="Which of the three forward figures does a checkpointed layer run again in backward, and "
                 "what do forward and backward of the whole step cost?",
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
                                              "matmul; this one re-runs whole segments."),
                   (lambda n: 100 * (n["rec_t"] + n["head_t"]) / (n["fwd_t"] + n["bwd_t"]),
                    "the checkpoints wrap the layers; the output head runs once, its activations kept."),
                   (lambda n: 100 * n["rec_t"] / n["fwd_t"],
                    "that compares with the forward alone; the question asks against forward + backward."),
                   (lambda n: 100 * n["rec_t"] / (n["fwd_t"] + n["bwd_t"] + n["rec_t"]),
                    "that divides by the step with the re-run included; compare with the step without it.")),
            draw=_overhead),
    Numeric("segment-length",
            "A deeper variant of {model} has {layers} layers. At sequence {seq:,}, micro-batch 1, flash "
            "attention, bf16, one layer keeps {interior:.1f} x s*b*h bytes for backward, its input is "
            "2 x s*b*h, and its weights take {w_gb:.2f} GB. You checkpoint it in segments of k consecutive "
            "layers: forward keeps only each segment's input, and backward re-runs one segment at a time "
            "before going through it. Which whole k gives the layers' activations their lowest peak "
            "during backward?",
            answer=lambda n: n["best"], unit="layers", rel_tol=0.0,
            hint="While backward re-runs one segment, what is held: which inputs, and which layers' "
                 "activations? Write that in units of s*b*h as a function of k and try k = 1, 2, 3, ...",
            explanation="k = {answer}: backward holds about ceil({layers}/k) checkpoints of 2 s*b*h plus "
                        "the k layers being re-run, {interior:.1f} s*b*h each; each extra layer in a "
                        "segment costs {interior:.1f} s*b*h while it saves only 2 s*b*h per checkpoint "
                        "dropped. Chen's sqrt(n) = {sqrt_n} assumes a layer keeps no more than its input; "
                        "a transformer layer keeps about twenty times more, so the best segments are "
                        "short. The weights do not depend on k.",
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
            hint="Which tensors of a layer does its backward read? Its last operations' outputs may not be "
                 "among them. Then count, per segment, what is never re-run.",
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
            "{model} ({n_params:,} parameters, {layers} layers) trains on sequences of {seq:,} tokens, "
            "micro-batch 1, with Megatron's selective activation recomputation. Counted as PyTorch's "
            "FlopCounterMode counts (attention's core in full, the causal half not subtracted), one "
            "forward pass costs {mm_t:,.2f} TFLOP in the layers' matmuls, {core_t:,.2f} TFLOP in "
            "attention's core (QK^T, softmax, PV) and {head_t:,.2f} TFLOP in the output head; forward + "
            "backward together, without any recomputation, {step_t:,.1f} TFLOP. What percentage does the "
            "selective recomputation add?",
            answer=lambda n: n["sel_pct"], unit="%", rel_tol=0.01,
            hint="Which part of each layer does selective recomputation drop in forward and rebuild in "
                 "backward, and which does it keep?",
            explanation="Selective recomputation re-runs attention's core only: {layers} x 4 x {seq:,}^2 "
                        "x {d_model:,} = {core_t:,.2f} TFLOP over {step_t:,.1f} TFLOP: {answer} %. It "
                        "grows with s. With a flash kernel this buys no memory: the kernel keeps no "
                        "scores and already recomputes them in its own backward.",
            traps=((lambda n: n["sel_pct"] / 2, "that counts the causal half only; the prompt counts "
                                                "the core in full."),
                   (lambda n: 100 * (n["mm_t"] + n["core_t"]) / n["step_t"],
                    "that re-runs the whole layer, full recomputation; selective keeps the matmuls' "
                    "outputs."),
                   (lambda n: 100 * n["core_t"] * 2.5 / n["step_t"],
                    "the re-run repeats the core's forward; its backward runs anyway.")),
            draw=_selective),
])
