"""Every chapter's quiz, as data. Numeric answers are computed by the library."""

from .quiz import Choice, Numeric, Quiz
from . import accounting, models
from .units import GB, GiB

SETUP = Quiz("00_setup", [
    Numeric("gib-of-80gb",
            "An H100 is sold as '80 GB' (it holds 80 x 10^9 bytes of HBM, near enough). "
            "How many GiB is that?",
            answer=lambda: 80 * GB / GiB, unit="GiB", rel_tol=0.005,
            explanation="1 GiB = 2^30 = 1.074 x 10^9 bytes, so 80 GB = 74.5 GiB. PyTorch's memory "
                        "reports are in bytes; the course labels every figure GB or GiB."),
    Choice("cpu-real",
           "On a laptop with no GPU, what does this course run?",
           ["Nothing: every experiment needs CUDA",
            "Mocked DeepSpeed calls that print expected numbers",
            "Real DeepSpeed and PyTorch on CPU ranks, and exact traces of full-size steps on fake tensors"],
           answer=2,
           explanation="DeepSpeed runs for real on its CPU accelerator over gloo, and fake tensors let a "
                       "laptop trace a full Llama-3-70B step without allocating its memory."),
])


def _zero1_note_recipe_gb() -> float:
    return accounting.model_states(models.get("llama-3-70b").n_params(), "pure-bf16", 8, 1).total / GB


MEMORY_ANATOMY = Quiz("01_memory_anatomy", [
    Numeric("mixed-bytes",
            "How many bytes per parameter do model states take with standard mixed-precision AdamW "
            "(bf16 weights and gradients, fp32 master and moments)?",
            answer=lambda: accounting.recipe("mixed").total, unit="bytes", rel_tol=0.0,
            explanation="2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 4 + 4 (Adam m, v) = 16."),
    Choice("bf16-saving",
           "Moving a model from fp32 training to bf16 mixed precision shrinks its model states by:",
           ["50 %", "25 %", "0 %", "75 %"], answer=2,
           explanation="fp32 is 4 + 4 + 8 = 16 B/param; mixed keeps an fp32 master, so 2 + 2 + 12 = 16. "
                       "The saving is in activations and speed, not in model states."),
    Numeric("zero1-note",
            "With the note's own recipe (2 + 2 + 4 bytes per parameter), how many GB does ZeRO-1 leave "
            "on each of 8 GPUs for Llama-3-70B's model states?",
            answer=_zero1_note_recipe_gb, unit="GB", rel_tol=0.02,
            explanation="P + G + O/8 = 141 + 141 + 282/8 = 317.5 GB; the note's 215 GB is an arithmetic slip."),
    Choice("s-squared",
           "Which attention kernel keeps no (s x s) tensor for the backward pass?",
           ["naive (bf16 probabilities)", "eager (fp32 softmax + bf16 copy)", "flash (SDPA)"], answer=2,
           explanation="Flash attention keeps the output and one logsumexp per row and recomputes the "
                       "scores block by block in backward: O(s) memory per head."),
])


ZERO = Quiz("02_zero", [
    Numeric("zero2-mixed",
            "Standard mixed precision (16 B/param), 8 GPUs, ZeRO-2: how many bytes per parameter does "
            "each GPU keep for model states?",
            answer=lambda: accounting.model_states(8_000_000, "mixed", 8, 2).total / 8_000_000, unit="bytes",
            rel_tol=0.001, explanation="bf16 params stay whole (2); gradients (2) and optimizer states (12) "
                                       "are sharded: 2 + 14/8 = 3.75."),
    Choice("zero3-volume",
           "Per training step, ZeRO-3 moves how much data per rank compared with plain data parallelism?",
           ["the same (2 psi)", "1.5 x (3 psi vs 2 psi)", "N times more", "half"], answer=1,
           explanation="DDP all-reduces gradients (2 psi); ZeRO-3 all-gathers parameters in forward and "
                       "again in backward, and reduce-scatters gradients: 3 psi."),
    Choice("persistence",
           "Why are Llama's RMSNorm weights never all-gathered under DeepSpeed ZeRO-3 defaults?",
           ["they are not trained", "they are below stage3_param_persistence_threshold, so every rank "
            "keeps them whole", "DeepSpeed fuses them into the linear layers"], answer=1,
           explanation="8,192 elements is below the 100,000 threshold; tiny tensors are not worth a "
                       "collective, so they stay replicated."),
    Numeric("fetches-70b",
            "How many modules does ZeRO-3 fetch (gather parameters for) in one forward pass of "
            "Llama-3-70B (80 layers, untied embedding and head)?",
            answer=lambda: 7 * models.get("llama-3-70b").n_layers + 2, unit="fetches", rel_tol=0.0,
            explanation="7 linear modules per layer (q, k, v, o, gate, up, down) x 80, plus the embedding and "
                        "the head: 562; the note's 128 assumed 32 layers and 4 matrices."),
])
