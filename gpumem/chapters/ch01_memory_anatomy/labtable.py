"""Lab 01: a table of fitted byte counts is not a count (review r29).

Review r29 measured the library's layer counts (``labwide.measure``, ``variants.measure``) at about
14 drawn shapes per (kernel, norm, mlp, bias), fitted integer coefficients of the terms a layer's
bytes are made of (T·d, T·q, T·F, b·a·s², ...) offline, and pasted them as two dict literals: 26 of
27 rows passed with no derivation. Those tables hold 191 and 1,321 bytes of literal data; the lab's
own counts hold 31 and 124 (an honest solution of the reviewer's, 25 and 121). So each of parts 2
and 3 is first measured by :mod:`gpumem.course.literal_size`, as lab 06's search is: over its limit,
the part gets one row saying so and none of its cases is graded. What the limits do not stop
(review r35): a fit packed one byte a coefficient (63 for part 2, 117 for part 3) with part 3's
chain steps packed three to a byte (104 bytes: 13 previous ops x 12 ops x 2 dtypes) holds 75 and
350 bytes and passed all 39 rows. The counts themselves are that small: a limit cannot tell a fit
from a derivation, only a table of answers by case from a count. So the chains now carry more
information than the limit allows (r36 #1): each drawn one holds a product with a tensor two or
three operations back, whose bytes depend on up to four operations (:mod:`.labcheck`'s docstring).
The affine terms of parts 2 and 3 can still be fitted (the lab's prompt says so).
"""

import inspect
import types

from gpumem.course.grading import Report, Row
from gpumem.course.literal_size import problem

# name -> (literal bytes, bytecode instructions, characters of distinct names) allowed; the lab's own
# counts hold (31, 161, 112) and (129, 432, 194; 124, 330, 153 before the chains' products). Names count since review r33: a table split into 620
# class attribute names of 24 characters, read back by dir(), held 9 bytes of literal data
LIMITS = {"layer_activation_bytes": (100, 1000, 450), "variant_layer": (400, 2000, 600)}
OWN = {"layer_activation_bytes": (30, 160, 110), "variant_layer": (130, 430, 190)}


def refused(report: Report, ns: dict, name: str) -> bool:
    """Add the row refusing ``ns[name]`` when it holds a table (module text); whether it did."""
    fn = ns.get(name)
    if name not in LIMITS or not isinstance(inspect.unwrap(fn), types.FunctionType):
        return False
    why = problem(fn, ns, name, LIMITS[name], OWN[name], "a count")
    if why:
        report.rows.append(Row(name, "a count, not a table of answers", "wrong", why))
    return bool(why)
