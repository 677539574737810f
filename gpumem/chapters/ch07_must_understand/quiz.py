"""Chapter 07's checklist: the note's six "must understand" items, each a group of questions
(drawn afresh per attempt, every expected value computed by the engine), asked as one quiz.

``CHECKLIST`` (a :class:`gpumem.course.checklist.Checklist`) shows one item at a time, ticks an
item once all its questions were answered correctly, and says what to revisit; ``QUIZ`` is its
quiz, the chapter's entry in ``gpumem.chapters.quizzes()``.
"""

from gpumem.course.checklist import Checklist

from . import ckpt_items, combine_items, flash_items, gather_items, offload_items, zero_items

ITEMS = [zero_items.ITEM, gather_items.ITEM, ckpt_items.ITEM, flash_items.ITEM, offload_items.ITEM,
         combine_items.ITEM]
CHECKLIST = Checklist("07_must_understand", ITEMS)
QUIZ = CHECKLIST.quiz
