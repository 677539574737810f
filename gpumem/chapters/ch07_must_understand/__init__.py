"""Chapter 07, must understand: the note's six checklist items as graded questions, with
progress per item saved and a summary of what to revisit.

- ``zero_items``     1. what ZeRO-1, -2 and -3 save, and what they cost in communication
- ``gather_items``   2. why ZeRO-3 all-gathers, and when the gathers overlap with compute
- ``ckpt_items``     3. activation checkpointing's idea and its compute cost
- ``flash_items``    4. why FlashAttention saves memory
- ``offload_items``  5. CPU versus NVMe offload, and what can be offloaded
- ``combine_items``  6. which combination for 8B, 70B and 405B models
- ``finetune_items`` chapter 08's question in item 6: which fine-tuning recipe fits 70B on one GPU
- ``pointers``       the notebook sections each answer points to
- ``CHECKLIST``      the six items (``gpumem.course.checklist.Checklist``); ``QUIZ`` its quiz
"""

from . import pointers
from .quiz import CHECKLIST, ITEMS, QUIZ

__all__ = ["pointers", "CHECKLIST", "ITEMS", "QUIZ"]
