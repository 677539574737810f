"""Chapter 08's quiz: how many parameters LoRA trains on a GQA model, what a QLoRA step's states
weigh, what full fine-tuning with 8-bit AdamW keeps, and how long the NF4 base takes to
dequantise per step. Each attempt draws a model, rank, targets, GPU or checkpointing; every
expected value is computed by the library (:mod:`gpumem.memory.finetune`, :mod:`.scale`)."""

from gpumem.course.quiz import Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick
from gpumem.memory import finetune as F, gpus, models

from . import scale

GB = 1e9
TARGET_SETS = {"q and v": ("q", "v"), "q, k, v and o": ("q", "k", "v", "o"),
               "all seven projections (q, k, v, o, gate, up, down)": F.FT_TARGETS,
               "k, v, gate and up": ("k", "v", "gate", "up")}


def _dims(n: dict) -> dict:
    cfg = models.get(n["model_name"])
    return n | {"kv_dim": cfg.kv_dim, "ffn": cfg.ffn, "vocab": cfg.vocab}


def _lora(rng) -> dict:
    n = _dims(model_numbers(pick(rng, LLAMAS)))
    words = pick(rng, tuple(TARGET_SETS))
    return n | {"rank": pick(rng, (8, 16, 32, 64)), "targets_words": words, "targets": TARGET_SETS[words]}


def _trainable(n: dict) -> float:
    return F.lora_params(models.get(n["model_name"]), n["rank"], n["targets"])


def _per_matrix(n: dict, dims) -> int:
    """r (in + out) summed over the drawn targets with the given (in, out) per target."""
    return sum(n["rank"] * (dims[t][0] + dims[t][1]) for t in n["targets"]) * n["layers"]


def _no_gqa(n: dict) -> float:
    h = n["d_model"]
    return _per_matrix(n, {t: (h, h) if t in ("q", "k", "v", "o") else ((n["ffn"], h) if t == "down" else (h, n["ffn"]))
                           for t in n["targets"]})


def _qlora(rng) -> dict:
    return _dims(model_numbers(pick(rng, LLAMAS))) | {"rank": pick(rng, (16, 64))}


def _qlora_gb(n: dict) -> float:
    roles = F.finetune_states(models.get(n["model_name"]), F.Finetune(adapter="lora", lora_rank=n["rank"],
                                                                       base_dtype="nf4"))
    return (sum(roles.values()) - roles["dequant_buffer"]) / GB


def _quantised(n: dict) -> int:
    return sum(F.quantised_tensors(models.get(n["model_name"])))


def _adapters(n: dict) -> int:
    return F.lora_params(models.get(n["model_name"]), n["rank"])


def _full8(rng) -> dict:
    return model_numbers(pick(rng, LLAMAS))


def _full8_gb(n: dict) -> float:
    return sum(F.finetune_states(models.get(n["model_name"]), F.Finetune(optimizer="adamw-8bit")).values()) / GB


def _dequant(rng) -> dict:
    n = _dims(model_numbers(pick(rng, LLAMAS))) | gpu_numbers(pick(rng, TRAINING_GPUS))
    n["ckpt"] = pick(rng, (True, False))
    n["ckpt_words"] = ("every layer is checkpointed (its forward runs again in backward)" if n["ckpt"] else
                       "nothing is checkpointed")
    n["hbm_tb"] = gpus.get(n["gpu_name"]).hbm / 1e12
    n["quantised"] = _quantised(n)
    return n


def _dequant_ms(n: dict, passes: int | None = None) -> float:
    cfg = models.get(n["model_name"])
    if passes is None:
        return 1e3 * scale.dequant_seconds(cfg, n["hbm_tb"] * 1e12, n["ckpt"])
    return 1e3 * passes * n["quantised"] * (F.nf4_bytes_per_param() + 2) / (n["hbm_tb"] * 1e12)


QUIZ = Quiz("08_finetuning", [
    Numeric("lora-trainable",
            "{model} has {layers} layers, hidden size {d_model:,}, {heads} query heads and {kv_heads} key/value "
            "heads (so k and v project to {kv_dim:,}), and an MLP of width {ffn:,}. peft's LoRA of rank "
            "{rank} is put on {targets_words} of every layer, no bias. How many parameters does it train?",
            answer=_trainable, unit="params", rel_tol=0.001, draw=_lora,
            hint="Each adapted matrix W (out x in) gets A (r x in) and B (out x r). What are in and out for "
                 "k and v under grouped-query attention, and for down?",
            explanation="r (in + out) per adapted matrix, summed over the targets, times {layers} layers: "
                        "{answer}. k and v map {d_model:,} to {kv_dim:,}; down maps {ffn:,} to {d_model:,}.",
            traps=((lambda n: _no_gqa(n) if _no_gqa(n) != _trainable(n) else -1.0,
                    "that gives k and v a {d_model:,}-wide output; with grouped-query attention they "
                    "project to {kv_dim:,}."),
                   (lambda n: _trainable(n) / n["layers"], "that is one layer; every layer has its adapters."),
                   (lambda n: _trainable(n) / 2,
                    "that counts A or B alone, or half of each; both are trained."))),
    Numeric("qlora-states",
            "QLoRA on {model} ({n_params:,} parameters): every linear layer of the blocks stored in NF4 "
            "(4-bit codes, one 8-bit absmax per 64 weights, one fp32 scale per 256 absmaxes), the "
            "embedding, output head and norms kept in bf16, LoRA rank {rank} on all seven projections "
            "with fp32 adapters (peft's default) trained by torch AdamW. How many GB (10^9 B) of model "
            "states does the GPU hold: weights and their constants, adapters, their gradients and "
            "optimizer states? Leave out activations and the dequantised buffer.",
            answer=_qlora_gb, unit="GB", rel_tol=0.01, draw=_qlora,
            hint="Which weights are quantised, and how many bits does one cost with its constants? "
                 "Then: what does each trainable adapter element cost in fp32 with AdamW?",
            explanation="{answer} GB: the quantised weights at 4 + 8/64 + 32/16384 bits, the rest at 2 B, "
                        "and 16 B per adapter element (4 weight, 4 gradient, 8 for m and v).",
            traps=((lambda n: (0.5 * n["n_params"] + 16 * _adapters(n)) / GB,
                    "that quantises every parameter to exactly 4 bits; the embedding and head stay bf16 "
                    "and each block of 64 carries its absmax."),
                   (lambda n: (2 * n["n_params"] + 16 * _adapters(n)) / GB,
                    "that keeps a bf16 base: that is LoRA, not QLoRA."),
                   (lambda n: _qlora_gb(n) - 12 * _adapters(n) / GB,
                    "that counts the adapters' weights alone; their gradients and AdamW moments live "
                    "on the GPU too."))),
    Numeric("full-8bit",
            "Full fine-tuning of {model} ({n_params:,} parameters) on one GPU: bf16 weights and gradients, "
            "an fp32 master copy, and bitsandbytes' 8-bit AdamW (each moment one byte per element, with an "
            "fp32 absmax per block of 256). How many GB (10^9 B) of model states?",
            answer=_full8_gb, unit="GB", rel_tol=0.01, draw=_full8,
            hint="List the bytes per parameter: weight, gradient, master, two moments, and the moments' "
                 "block scales.",
            explanation="2 + 2 + 4 + 2 x (1 + 4/256) = 10.03 bytes per parameter: {answer} GB (the norms' "
                        "small tensors keep fp32 moments, a rounding error here).",
            traps=((lambda n: 16 * n["n_params"] / GB, "that keeps fp32 moments: the mixed recipe without "
                                                       "the 8-bit optimizer."),
                   (lambda n: 6 * n["n_params"] / GB, "that leaves out the fp32 master copy this setup keeps."),
                   (lambda n: 12 * n["n_params"] / GB, "that counts 8-bit moments as 4 bytes in all."))),
    Numeric("dequant-time",
            "QLoRA on one {gpu} ({hbm_tb:.2f} TB/s memory bandwidth): {model}'s {quantised:,} quantised "
            "weights are turned into bf16 each time a matmul needs them, as bitsandbytes does; each "
            "time reads the packed codes with their constants ({nf4:.4f} B per weight) and writes 2 B "
            "per weight. One step, {ckpt_words}. How many milliseconds does dequantisation take, at "
            "the full bandwidth?",
            answer=_dequant_ms, unit="ms", rel_tol=0.02,
            draw=lambda rng: _dequant(rng) | {"nf4": F.nf4_bytes_per_param()},
            hint="In which passes of a step does each base matmul run, and does backward keep the bf16 "
                 "weight from forward?",
            explanation="Forward dequantises each matrix once; backward again (MatMul4Bit keeps only the "
                        "packed weight); a checkpointed re-run once more: {answer} ms.",
            traps=((lambda n: _dequant_ms(n, 1), "that dequantises in forward only; backward needs W for the "
                                                 "input's gradient and dequantises again."),
                   (lambda n: _dequant_ms(n, 2) if n["ckpt"] else -1.0,
                    "checkpointing re-runs the forward in backward: one more pass."),
                   (lambda n: _dequant_ms(n) * 2 / (F.nf4_bytes_per_param() + 2),
                    "that counts only the bf16 writes; the packed codes are read too."))),
])
