"""Chapter 02's quiz. Numeric answers are computed by the library when the question is shown."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.memory import accounting, models

QUIZ = Quiz("02_zero", [
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
