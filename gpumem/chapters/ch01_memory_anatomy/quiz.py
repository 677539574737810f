"""Chapter 01's quiz. Numeric answers are computed by the library when the question is shown."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.memory import accounting, models
from gpumem.units import GB


def _zero1_note_recipe_gb() -> float:
    return accounting.model_states(models.get("llama-3-70b").n_params(), "pure-bf16", 8, 1).total / GB


QUIZ = Quiz("01_memory_anatomy", [
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
