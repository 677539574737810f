"""Checklist item 3: activation checkpointing's idea (keep a segment's input, re-run the segment
in backward) and what it costs in compute.

Numbers drawn per attempt: model, sequence length, micro-batch, segment length and plan. Bytes
come from ``gpumem.memory.recompute_cost.activation_bytes`` (flash attention, fused RMSNorm,
bf16), FLOPs from ``recompute_cost.layer_flops`` and ``step_flops`` (counted as PyTorch's
FlopCounterMode counts them; a re-run repeats whole segments).
"""

from gpumem.course.checklist import Item
from gpumem.course.quiz import Choice, Numeric
from gpumem.course.quiz_draws import LLAMAS, model_numbers, pick
from gpumem.memory import models, recompute_cost
from gpumem.memory.recompute_plans import plan
from gpumem.units import GB

from . import pointers as P

SEQS = (2048, 4096, 8192)
PLANS = {"full": "every layer checkpointed on its own",
         "every-2": "every layer checkpointed, in segments of two consecutive layers",
         "every-other": "layers 0, 2, 4, ... checkpointed, each on its own; the odd layers keep "
                        "their activations (torchtitan's every-other-layer option)"}


def _bytes(model: str, seq: int, mb: int, p) -> dict:
    return recompute_cost.activation_bytes(models.get(model), seq, mb, p)


def _kept(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS), "mb": pick(rng, (1, 2, 4))}
    none, full = (_bytes(n["model_name"], n["seq"], n["mb"], p) for p in ("none", "full"))
    return n | {"layer_gb": none["per_layer"] / GB, "ckpt_gb": full["checkpoint"] / GB,
                "kept_gb": full["layers"] / GB, "all_gb": none["layers"] / GB,
                "ratio": none["layers"] / full["layers"], "peak_gb": full["recompute_peak"] / GB}


def _peak(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS), "mb": 1}
    n["k"] = pick(rng, [k for k in range(2, 9) if n["layers"] % k == 0])
    b = _bytes(n["model_name"], n["seq"], n["mb"], f"every-{n['k']}")
    return n | {"segs": n["layers"] // n["k"], "layer_gb": b["per_layer"] / GB, "ckpt_gb": b["checkpoint"] / GB,
                "peak_gb": b["recompute_peak"] / GB, "full_gb": _bytes(n["model_name"], n["seq"], 1,
                                                                       "full")["recompute_peak"] / GB}


def _peak_words(n: dict) -> str:
    """The worked peak, and whether these segments beat one-layer segments (whichever is lower)."""
    ratio = n["layer_gb"] / n["ckpt_gb"]
    best_k = (n["layers"] / ratio) ** 0.5
    lower = n["peak_gb"] < n["full_gb"]
    verdict = (f"lower than the {n['full_gb']:.2f} GB of one-layer segments: with {n['layers']} layers, "
               f"dropping inputs saves more than re-running {n['k']} layers at once costs"
               if lower else
               f"more than the {n['full_gb']:.2f} GB of one-layer segments: the {n['k']} layers held while "
               f"re-running cost more than the inputs dropped save")
    return (f"{n['segs']} inputs of {n['ckpt_gb']:.4f} GB plus {n['k']} re-run layers of "
            f"{n['layer_gb']:.3f} GB, less the input counted twice: {n['answer']} GB, {verdict}. The peak, "
            f"n/k inputs plus k layers, is lowest near k = sqrt(n x input / layer) = sqrt({n['layers']} / "
            f"{ratio:.0f}) = {best_k:.1f} layers per segment, since a layer keeps about {ratio:.0f} times "
            "its input.")


def _cost(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"seq": pick(rng, SEQS), "plan": pick(rng, tuple(PLANS))}
    cfg = models.get(n["model_name"])
    lay = recompute_cost.layer_flops(cfg, n["seq"])
    f = recompute_cost.step_flops(cfg, n["seq"], 1, n["plan"], "scratch")
    full = recompute_cost.step_flops(cfg, n["seq"], 1, "full", "scratch")
    return n | {"plan_words": PLANS[n["plan"]], "layer_t": lay["total"] / 1e12,
                "step_t": (f["forward"] + f["backward"]) / 1e12, "rerun": len(plan(n["plan"], cfg.n_layers).checkpointed()),
                "full_pct": 100 * full["overhead"]}


def _cost_pct(n: dict) -> float:
    return 100 * recompute_cost.step_flops(models.get(n["model_name"]), n["seq"], 1, n["plan"], "scratch")["overhead"]


QUESTIONS = [
    Numeric("ckpt-kept",
            "{model} ({layers} layers, d_model {d_model:,}) trains in bf16 on sequences of {seq:,} "
            "tokens, micro-batch {mb}, with flash attention. Without checkpointing each layer keeps "
            "{layer_gb:.3f} GB for backward. With every layer checkpointed on its own, how many GB do "
            "the {layers} layers together keep when the forward pass ends?",
            answer=lambda n: n["kept_gb"], unit="GB", rel_tol=0.01,
            hint="A checkpointed layer keeps one tensor for backward and drops the rest. Which one, "
                 "and what is its shape?",
            explanation="Each layer keeps only its input, micro-batch x sequence x d_model in bf16: "
                        "2 x {mb} x {seq:,} x {d_model:,} B = {ckpt_gb:.4f} GB, times {layers}: {answer} "
                        "GB, {ratio:.1f}x less than the {all_gb:.1f} GB kept without checkpoints. Backward "
                        "re-runs one layer at a time from its input, so the peak while re-running is "
                        "about {peak_gb:.2f} GB.",
            traps=((lambda n: n["all_gb"], "that is what the layers keep without checkpointing. A "
                                           "checkpoint keeps one tensor per layer."),
                   (lambda n: n["all_gb"] / 2, "checkpointing does not halve the activations: it keeps "
                                               "one input per layer and drops everything else.")),
            draw=_kept),
    Numeric("ckpt-segment-peak",
            "{model} ({layers} layers, d_model {d_model:,}) trains in bf16 on sequences of {seq:,} "
            "tokens, micro-batch 1, with flash attention; {heads} query heads, vocabulary 128,256. "
            "Without checkpointing one layer keeps {layer_gb:.3f} GB for backward, its own input "
            "among them. The run checkpoints all layers in {segs} segments of {k} consecutive layers, "
            "each re-run whole in backward. When backward re-runs the last segment, about how many "
            "GB of layer activations are held?",
            answer=lambda n: n["peak_gb"], unit="GB", rel_tol=0.004,
            hint="What does a checkpointed segment keep through forward, and how big is it? At that "
                 "moment which of those are still held, and what do the {k} layers just re-run hold? "
                 "Count no tensor twice.",
            explanation=_peak_words,
            traps=((lambda n: n["segs"] * n["ckpt_gb"], "that is only the inputs. The re-run segment's "
                                                        "{k} layers hold their activations again."),
                   (lambda n: n["segs"] * n["ckpt_gb"] + n["k"] * n["layer_gb"],
                    "close: the re-run's first layer keeps the segment input itself, so it is counted "
                    "once, not twice.")),
            draw=_peak),
    Numeric("ckpt-cost",
            "{model} ({layers} layers) trains on sequences of {seq:,} tokens, micro-batch 1, with "
            "{plan_words}. A checkpointed segment is re-run whole in backward. One layer's forward "
            "costs {layer_t:,.4f} TFLOP, and forward plus backward of the whole step (head included) "
            "{step_t:,.2f} TFLOP. What percentage does the recomputation add to the step's FLOPs?",
            answer=_cost_pct, unit="%", rel_tol=0.004,   # 2N/6N is 0.85 % off at 405B, seq 2,048
            hint="Which layers run their forward a second time in backward? Count them, whatever the "
                 "segment length.",
            explanation="{rerun} layers re-run their forward: {rerun} x {layer_t:,.4f} / {step_t:,.2f} = "
                        "{answer} %. Every layer checkpointed costs {full_pct:.1f} %, in segments of one "
                        "layer or of several: the segment length moves memory, not FLOPs. Only layers "
                        "left un-checkpointed save compute.",
            traps=((lambda n: n["full_pct"] / 2, "segments of two still re-run every layer: the segment "
                                                 "length does not change the FLOPs."),
                   (lambda n: 100 / 3, "that is 2N/6N, a rule of thumb; count the layers that are re-run "
                                       "with the FLOPs given.")),
            draw=_cost),
    Choice("ckpt-segments",
           "A run checkpoints every layer of a 32-layer model on its own. It switches to segments of "
           "4 consecutive layers, still re-running every segment in backward. What changes?",
           ["Fewer inputs are kept, at the same FLOPs",
            "Only one layer in four runs its forward twice",
            "Memory falls at every moment of the step",
            "Each layer is now re-run four times in backward"],
           answer=0,
           hint="What does a segment keep during forward, and what does backward hold while it "
                "re-runs one segment?",
           explanation="Eight inputs are kept instead of 32, but re-running a segment restores four "
                       "layers' activations at once; every layer still runs its forward twice. As a "
                       "Llama layer keeps about twenty times its input, the peak is lowest near "
                       "sqrt(32 / 20), about one layer per segment: here one-layer segments give the "
                       "lower peak."),
]

ITEM = Item("checkpoint", "Activation checkpointing: keep less, re-run in backward, and what it costs",
            QUESTIONS, {
                "ckpt-kept": (P.CKPT_IDEA, P.CKPT_MEASURED),
                "ckpt-segment-peak": (P.CKPT_IDEA, P.CKPT_SCALE),
                "ckpt-cost": (P.CKPT_MEASURED, P.CKPT_CLAIMS),
                "ckpt-segments": (P.CKPT_IDEA, P.CKPT_SCALE),
            })
