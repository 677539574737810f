"""Chapter 07's checklist: the note's six "must understand" items, each a group of questions
(drawn afresh per attempt, every expected value computed by the engine), asked as one quiz.

``CHECKLIST`` (a :class:`gpumem.course.checklist.Checklist`) shows one item at a time, ticks an
item once all its questions were answered correctly, and says what to revisit; ``QUIZ`` is its
quiz, the chapter's entry in ``gpumem.chapters.quizzes()``.

Item 5's pointers come from ``pointers.OFFLOAD_SEE`` (chapter 05's notebook), over those its
module names; item 6 ends with chapter 08's question (``finetune_items``); a question missing from both fails at import (``Checklist`` requires a pointer).
"""

from gpumem.course.checklist import Checklist, Item

from . import ckpt_items, combine_items, finetune_items, flash_items, gather_items, offload_items, zero_items
from . import pointers as P


def _offload_item() -> Item:
    """The offload item with chapter 05's sections as pointers."""
    o = offload_items.ITEM
    ids = {q.id for q in o.questions}
    return Item(o.key, o.title, o.questions,
                {**o.see, **{qid: where for qid, where in P.OFFLOAD_SEE.items() if qid in ids}})


def _combine_item() -> Item:
    """Item 6 with chapter 08's question (fine-tuning 70B on one GPU) after its own."""
    c = combine_items.ITEM
    return Item(c.key, c.title, [*c.questions, finetune_items.QUESTION], {**c.see, **finetune_items.SEE})


ITEMS = [zero_items.ITEM, gather_items.ITEM, ckpt_items.ITEM, flash_items.ITEM, _offload_item(),
         _combine_item()]
CHECKLIST = Checklist("07_must_understand", ITEMS)
QUIZ = CHECKLIST.quiz
