"""Chapter 08's quiz: how many parameters LoRA trains on a GQA model, what switching LoRA to QLoRA
frees (which states change), what switching AdamW to 8-bit frees (which roles change), how
long the NF4 base takes to dequantise per step (how many passes), and how many bytes cross PCIe
a step with the base on the CPU (what multiplies with accumulation). Each attempt draws a model, rank, targets, GPU or checkpointing; every
expected value is computed by the library (:mod:`gpumem.memory.finetune`, :mod:`.scale`)."""

from gpumem.course.quiz import Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick
from gpumem.memory import finetune as F, finetune_fsdp, gpus, models

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
    n = _dims(model_numbers(pick(rng, LLAMAS))) | {"rank": pick(rng, (16, 64))}
    return n | {"quantised": _quantised(n)}


def _states(n: dict, **kw) -> int:
    roles = F.finetune_states(models.get(n["model_name"]), F.Finetune(adapter="lora", lora_rank=n["rank"], **kw))
    return sum(roles.values()) - roles["dequant_buffer"]


def _qlora_saving_gb(n: dict) -> float:
    """LoRA's states minus QLoRA's (same adapters): only the quantised weights change."""
    return (_states(n) - _states(n, base_dtype="nf4")) / GB


def _quantised(n: dict) -> int:
    return sum(F.quantised_tensors(models.get(n["model_name"])))


def _adapters(n: dict) -> int:
    return F.lora_params(models.get(n["model_name"]), n["rank"])


def _full8(rng) -> dict:
    return model_numbers(pick(rng, LLAMAS))


def _full8_saving_gb(n: dict) -> float:
    """The mixed recipe's states minus the same with 8-bit AdamW (the master kept)."""
    cfg = models.get(n["model_name"])
    return (sum(F.finetune_states(cfg, F.Finetune()).values())
            - sum(F.finetune_states(cfg, F.Finetune(optimizer="adamw-8bit")).values())) / GB


def _dequant(rng) -> dict:
    n = _dims(model_numbers(pick(rng, LLAMAS))) | gpu_numbers(pick(rng, TRAINING_GPUS))
    n["ckpt"] = pick(rng, (True, False))
    n["ckpt_words"] = ("every layer is checkpointed (its forward runs again in backward)" if n["ckpt"] else
                       "nothing is checkpointed")
    n["passes_words"] = ("and the checkpointed re-run once more: three passes" if n["ckpt"] else
                         "two passes (nothing is re-run)")
    n["hbm_tb"] = gpus.get(n["gpu_name"]).hbm / 1e12
    n["quantised"] = _quantised(n)
    return n


def _dequant_ms(n: dict, passes: int | None = None) -> float:
    cfg = models.get(n["model_name"])
    if passes is None:
        return 1e3 * scale.dequant_seconds(cfg, n["hbm_tb"] * 1e12, n["ckpt"])
    return 1e3 * passes * n["quantised"] * (F.nf4_bytes_per_param() + 2) / (n["hbm_tb"] * 1e12)


def _offload(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS))
    nf4 = pick(rng, (True, False))
    ft = F.Finetune(adapter="lora", base_dtype="nf4" if nf4 else "bf16")
    o = finetune_fsdp.fsdp_states(models.get(n["model_name"]), ft, 1, base_on_cpu=True)
    return n | {"recipe": "QLoRA (4-bit codes stored in bf16)" if nf4 else "LoRA (a bf16 base)",
                "n_micro": pick(rng, (4, 8, 16)), "blocks_gb": o["streamed"] / GB, "root_gb": o["root_streamed"] / GB,
                "o": o}


def _copied_gb(n: dict) -> float:
    return finetune_fsdp.copied_up(n["o"], n["n_micro"]) / GB


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
    Numeric("qlora-saving",
            "LoRA of rank {rank} on all seven projections of {model} ({n_params:,} parameters) runs on one GPU: "
            "a bf16 base, fp32 adapters (peft's default) trained by torch AdamW. You switch it to QLoRA, "
            "with the same adapters: the blocks' {quantised:,} linear weights are stored in NF4 with double "
            "quantisation (a 4-bit code per weight, an 8-bit absmax per 64 weights, an fp32 scale per 256 "
            "absmaxes). How many GB (10^9 B) of model states (weights and their constants, adapters, their "
            "gradients and optimizer states) does the GPU hold fewer? Leave out activations and the "
            "dequantised buffer.",
            answer=_qlora_saving_gb, unit="GB", rel_tol=0.005, draw=_qlora,
            hint="Which of the states change between the two setups, and which stay the same? For what "
                 "changes: bytes per weight before, and after with its constants.",
            explanation="Only the quantised weights change: 2 B each before, 4 + 8/64 + 32/16384 bits = "
                        "0.5159 B after, so {quantised:,} x 1.4841 B = {answer} GB. The embedding, head and "
                        "norms stay bf16, and the adapters with their gradients and moments are the same in "
                        "both.",
            traps=((lambda n: 1.5 * n["n_params"] / GB,
                    "that quantises every parameter; the embedding, output head and norms stay bf16."),
                   (lambda n: 1.5 * n["quantised"] / GB,
                    "that counts 4 bits a weight; each block of 64 also stores its absmax, and those "
                    "absmaxes their own scales."),
                   (lambda n: 2 * n["quantised"] / GB,
                    "that removes the base weights altogether; the packed codes stay on the GPU."),
                   (lambda n: _qlora_saving_gb(n) + 16 * _adapters(n) / GB,
                    "that also removes the adapters' states; QLoRA keeps the same adapters as LoRA."))),
    Numeric("8bit-saving",
            "Full fine-tuning of {model} ({n_params:,} parameters) on one GPU with the mixed recipe: bf16 "
            "weights and gradients, an fp32 master copy, torch AdamW's two fp32 moments. You replace the "
            "optimizer with bitsandbytes' 8-bit AdamW (each moment one byte per element, an fp32 absmax "
            "per block of 256) and keep the master. How many GB (10^9 B) of model states does that free?",
            answer=_full8_saving_gb, unit="GB", rel_tol=0.01, draw=_full8,
            hint="Which of the five roles (weight, gradient, master, two moments) does the optimizer's "
                 "storage change, and what does each of them cost per parameter after?",
            explanation="Only the moments change: 8 B per parameter before, 2 x (1 + 4/256) = 2.03 B after, "
                        "so about 5.97 B per parameter: {answer} GB (bitsandbytes keeps fp32 moments only for "
                        "tensors under 4,096 elements, which these models' tensors never are). The master "
                        "stays: the states go "
                        "from 16 to about 10 B per parameter.",
            traps=((lambda n: 12 * n["n_params"] / GB,
                    "that drops the fp32 master as well; this setup keeps it, only the moments shrink."),
                   (lambda n: 4 * n["n_params"] / GB,
                    "that halves the moments (bf16); 8-bit keeps one byte per element each."),
                   (lambda n: 10.03 * n["n_params"] / GB,
                    "that is what the states weigh after the switch, not what it frees."),
                   (lambda n: 8 * n["n_params"] / GB,
                    "that frees the moments entirely; 8-bit AdamW still stores one byte each."))),
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
                        "packed weight), {passes_words}: {answer} ms.",
            traps=((lambda n: _dequant_ms(n, 1), "that dequantises in forward only; backward needs W for the "
                                                 "input's gradient and dequantises again."),
                   (lambda n: _dequant_ms(n, 2) if n["ckpt"] else -1.0,
                    "checkpointing re-runs the forward in backward: one more pass."),
                   (lambda n: _dequant_ms(n) * 2 / (F.nf4_bytes_per_param() + 2),
                    "that counts only the bf16 writes; the packed codes are read too."))),
    Numeric("offload-copies",
            "{recipe} of {model} on one GPU, every parameter in host memory (FSDP's CPU offload, one unit "
            "per decoder block, every layer checkpointed). The blocks' weights with their adapters total "
            "{blocks_gb:.2f} GB; the root unit (embedding, head, final norm) {root_gb:.2f} GB, which FSDP keeps "
            "gathered from its forward to its backward. A step runs {n_micro} micro-batches (gradient "
            "accumulation). How many GB (10^9 B) cross PCIe from host to GPU in one step?",
            answer=_copied_gb, unit="GB", rel_tol=0.005, draw=_offload,
            hint="When is a block needed on the GPU, and is it still there the next time? Does accumulating "
                 "gradients over micro-batches keep the weights on the GPU?",
            explanation="Each micro-batch gathers every block for its forward and again for its backward (the "
                        "checkpointed re-run happens inside that backward gather), and the root once: "
                        "{n_micro} x (2 x {blocks_gb:.2f} + {root_gb:.2f}) = {answer} GB. Accumulation saves "
                        "the optimizer step, not the copies.",
            traps=((lambda n: (2 * n["o"]["streamed"] + n["o"]["root_streamed"]) / GB,
                    "that is one micro-batch; each of the {n_micro} gathers the base again."),
                   (lambda n: n["n_micro"] * 2 * n["o"]["streamed"] / GB,
                    "the root unit (embedding and head) is copied up once a micro-batch too."),
                   (lambda n: n["n_micro"] * (n["o"]["streamed"] + n["o"]["root_streamed"]) / GB,
                    "a block freed after its forward is copied up again for its backward."),
                   (lambda n: n["n_micro"] * (3 * n["o"]["streamed"] + n["o"]["root_streamed"]) / GB,
                    "the checkpointed re-run runs inside the backward's gather: no third copy."))),
])
