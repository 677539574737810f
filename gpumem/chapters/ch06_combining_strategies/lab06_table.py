"""Lab 06: a table of answers is not a search.

Review r26 harvested the planner's fastest layouts for the grader's own draws (about 100 winners from
50 seeds, in minutes, by running ``labcheck.cases`` and ``planner.plan`` offline) and wrote a
``choose_plan`` that prices only those layouts with the lab's pieces: it passed every row of 11 of 15
fresh checks (rebuilt for review r28: 11 of 15 again; drawing shipped Hugging Face models beside the
Llamas, or a memory fraction per case, still let 10 of 15 pass, since a family's winners repeat).
The layouts that win are few, so no draw defeats such a table; its size limits it. A search needs
the values of its levers, not the answers: the lab's own search holds 165 bytes of literal data (the
names of ``without`` among them) and 740 bytecode instructions, the harvested table 11,000 bytes.

:func:`problem` measures what ``choose_plan`` holds: the numbers and strings its code loads
(strings by their UTF-8 bytes; docstrings aside, unless some code reads ``__doc__``), the plain
values and default arguments it reads, through every function and class of the learner's it reaches
(decorated ones unwrapped), and the bytecode instructions of that code (a table written as a chain of
``if`` statements loads few distinct constants but many instructions). Over :data:`CHARS` or
:data:`INSTRUCTIONS` the check stops with a row saying so.

What it does not stop (review r29): the information, not the characters, sets a table's size, and
about 35 bits pack one layout. r29 packed all 115 winners into 292 Unicode characters (about 800
UTF-8 bytes: refused now); packed into printable ASCII the whole table needs about 740 bytes with its
decoder, but some 50 winners fit in the limit, and the 55 most frequent of r26's passed 3 of 11
fresh checks offline. An honest search with a few debug messages held 442 bytes (r29), so the limit
cannot go much lower. So a constraint is drawn per case instead: the levers the team's stack lacks
(:mod:`.lab06_levers`, the family "the stack lacks a lever"), whose winners are second choices that
change with the lack and the cluster: the winners of 10 seeds' members (20 layouts) pass 8 of 30
fresh members, of 100 seeds (107 layouts, about the rule's size packed) 23 of 30; a table must spend
its bytes on this family too (tests/test_lab06_adversarial.py, the lack family's tests).
"""

from gpumem.course.literal_size import measure  # noqa: F401 -- the lab's tests measure with it
from gpumem.course.literal_size import problem as _problem

CHARS = 500              # literal bytes; the lab's search holds 165, a table of 100 layouts ~11,000, packed ~600
INSTRUCTIONS = 2500      # bytecode instructions; the lab's search has 740
NAMES = 2000             # characters of the distinct names it uses; the lab's search 499 (review r33 of lab 01)


def problem(fn, ns: dict) -> str:
    """'' or why ``choose_plan`` holds more than a search needs."""
    return _problem(fn, ns, "choose_plan", (CHARS, INSTRUCTIONS, NAMES), (165, 740, 499), "a search")
