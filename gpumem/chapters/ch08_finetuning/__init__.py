"""Chapter 08, fine-tuning by shrinking the states: 8-bit AdamW, LoRA and QLoRA, counted by role,
run for real on the CPU, and priced at 8B / 70B / 405B.

- ``scale``     cards, recipes, per-GPU bytes by role, the note's RTX 3090 scenario, QLoRA's 65B
                claim, the dequantisation's time and a step's time at a stated MFU
- ``published`` Answer.AI's fsdp_qlora benchmarks beside the predictions (implied utilisation)
- ``claims``    the note's single-GPU rule and the QLoRA paper's figures in the ledger
- ``diagrams``  the idea (who holds what), the measured-vs-formula table, the at-scale table,
                the frameworks side by side
- ``plots``     per-GPU bytes by role as stacked bars against the cards
- ``QUIZ``      the chapter's quiz

Modules load on first use (``ch.diagrams``).
"""

from gpumem.course.registry import lazy_submodules

__all__ = ["claims", "diagrams", "plots", "published", "quiz", "scale", "QUIZ"]
__getattr__ = lazy_submodules(__name__, __all__)
