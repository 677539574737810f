"""Reading a learner's numeric answer: a number, with or without a unit, in the question's unit.

A learner writes what they computed the way they computed it: ``16``, ``"16 B"``,
``"3.75 bytes/param"``, ``"317.5 GB"``, ``"74.5 GiB"``, ``"1,129 GB"``. The answer is converted
to the question's unit (a GB answer to a GiB question is converted, not refused); a unit from
another family or no family at all is a :class:`~gpumem.errors.UsageError` with one line saying
what the question accepts, never a traceback.

Families: bytes (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; GB = 10^9, GiB = 2^30), time (s, ms,
us, min, h), percent (%), and counts (GPUs, fetches, ...: the question's own word or nothing).
"""

import math
import re

from ..errors import UsageError
from ..units import GB, GiB, KB, KiB, MB, MiB, TB, TiB

BYTES = {"b": 1, "byte": 1, "bytes": 1, "kb": KB, "mb": MB, "gb": GB, "tb": TB,
         "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB}
SECONDS = {"s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6,
           "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0}
PERCENT = {"%": 1.0, "percent": 1.0}
FAMILIES = {"bytes": BYTES, "time": SECONDS, "percent": PERCENT}
LISTED = {"bytes": "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB", "time": "s, ms, us, min, h", "percent": "%"}

_NUMBER = re.compile(r"""^\s*[~≈]?\s*
    (?P<num>[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:e[+-]?\d+)?|[+-]?\.\d+(?:e[+-]?\d+)?)
    \s*(?P<unit>.*?)\s*$""", re.IGNORECASE | re.VERBOSE)
# "/param", "per parameter", "/GPU", "per rank", "each": what the number is per, not its unit
_PER = re.compile(r"\s*(?:/|\bper\b|\beach\b)\s*(?:param(?:eter)?s?|gpus?|ranks?|steps?|layers?|tokens?)?\.?$",
                  re.IGNORECASE)


def family(unit: str) -> tuple[str, float]:
    """The family of a question's unit and its size in the family's base (bytes, seconds, ...);
    a unit of no family is a count (``"GPUs"``, ``"fetches"``, ``""``) of size 1."""
    key = unit.strip().lower()
    for name, table in FAMILIES.items():
        if key in table:
            return name, table[key]
    return "count", 1.0


def _count_words(unit: str) -> set[str]:
    word = unit.strip().lower()
    words = {"", word, word + "s", word.removesuffix("s"), word.removesuffix("es")}
    return words | ({"x", "×", "times"} if word in ("x", "×", "times") else set())


def describe(unit: str) -> str:
    """What a question accepts, for its prompt: ``'a number in GiB; other byte units are converted'``."""
    fam, _ = family(unit)
    if fam == "count":
        return f"a number{' of ' + unit if unit and unit not in ('x', '×') else ''}"
    return f"a number in {unit}; other {'byte' if fam == 'bytes' else fam} units are converted"


def fmt_number(x: float) -> str:
    """A number the way the course shows it: 4 significant digits, thousands separated."""
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or float(x).is_integer():
        return f"{x:,.0f}"
    digits = max(0, 3 - int(math.floor(math.log10(abs(x)))))
    return f"{x:,.{digits}f}"


def to_unit(value, unit: str) -> tuple[float, str]:
    """``value`` (a number, or text with an optional unit) in ``unit``, and a note when it was
    converted (``'85.52 GB read as 79.65 GiB'``); a :class:`UsageError` when it cannot be read."""
    if isinstance(value, bool):
        raise UsageError(f"{value!r} is not a number; answer with {describe(unit)}")
    try:
        return float(value), ""       # ints, floats, numpy scalars and the like
    except OverflowError:
        raise UsageError(f"that number is too large to be an answer; answer with {describe(unit)}") from None
    except (TypeError, ValueError):
        pass
    text = str(value)[:200]           # an answer is short; a huge one is cut before it is parsed
    match = _NUMBER.match(text)
    if not match:
        raise UsageError(f"{text!r} is not a number; answer with {describe(unit)}")
    number = float(match.group("num").replace(",", ""))
    written = _PER.sub("", match.group("unit")).strip()
    want, size = family(unit)
    if want == "count":
        if written.lower() in _count_words(unit):
            return number, ""
        raise UsageError(f"unit {written!r} in {text!r} does not fit this question; answer with "
                         f"{describe(unit)}, no other unit")
    if not written:
        return number, ""
    got, _ = family(written)
    if got != want:
        raise UsageError(f"unit {written!r} in {text!r} is not one of {LISTED[want]}; this question "
                         f"wants {unit}")
    converted = number * FAMILIES[want][written.lower()] / size
    if written.lower() == unit.strip().lower() or FAMILIES[want][written.lower()] == size:
        return converted, ""
    return converted, f"{fmt_number(number)} {written} read as {fmt_number(converted)} {unit}"
