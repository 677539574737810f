"""Bytes in, bytes out; GB (10^9) and GiB (2^30) only at display time, always labelled.

Counts and sizes typed by a user are parsed here with a stated upper bound, checked on the text
(digits and exponent) before any arithmetic, so ``1e100000000`` is refused at once instead of
building a hundred-million-digit integer.
"""

import re

from .errors import UsageError

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

UNITS = {"B": 1, "KB": KB, "MB": MB, "GB": GB, "TB": TB,
         "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
# Largest size accepted: 1 PB (10^15 bytes), thousands of times the largest GPU's memory
# (H200: 141 GB) or a large server's RAM; larger is a typo, and float arithmetic stays exact enough.
MAX_SIZE = 10**15
MAX_SIZE_TEXT = "1000TB"      # MAX_SIZE as the parser reads it (it takes no PB)
# digits, a fraction, a decimal exponent, one suffix: 70B, 8.03B, 7.5e9, 4k (ASCII digits only)
_COUNT = re.compile(r"\s*([0-9]+)(?:\.([0-9]+))?(?:e([0-9]+))?\s*([A-Z]?)\s*", re.IGNORECASE)


def shown(text, most: int = 40) -> str:
    """``repr(text)`` cut to ``most`` characters (with the full length), for echoing a user's value."""
    r = repr(text)
    return r if len(r) <= most else f"{r[:most - 1]}...' ({len(str(text)):,} characters)"


def bound_text(most: int) -> str:
    """How an upper bound is written in help and errors: ``1,000,000`` or ``10^15``."""
    exp = len(str(most)) - 1
    return f"10^{exp}" if most == 10**exp and exp >= 9 else f"{most:,}"


def parse_count(text: str, scale: dict[str, int], most: int, exponent: bool = True) -> int | None:
    """A whole count from 1 to ``most`` written as digits, optionally with a fraction, a decimal
    exponent (when ``exponent``) and one suffix of ``scale`` (``{"": 1, "K": 1000, ...}``, each a
    power of ten up to 10^12 or 1024).

    Returns None if ``text`` is not such a count (zero, not whole, a bad suffix, over 100
    characters) and raises ``OverflowError`` if it is larger than ``most``. The size is judged from
    where the first digit stands before any arithmetic, so no integer much larger than ``most``
    is built. Exact: 8.03B is 8,030,000,000, not a float's nearest neighbour."""
    match = _COUNT.fullmatch(str(text)) if len(str(text)) <= 100 else None
    if not match or match.group(4).upper() not in scale or (match.group(3) is not None and not exponent):
        return None
    whole, frac = match.group(1).lstrip("0"), (match.group(2) or "").rstrip("0")
    exp, unit = int(match.group(3) or 0), scale[match.group(4).upper()]
    digits = (whole + frac).lstrip("0")
    if not digits:
        return None                                             # zero
    first = len(whole) if whole else len(frac.lstrip("0")) - len(frac)   # place of the first digit
    if first - 1 + exp > len(str(most)):                        # value >= 10^(first-1+exp) > most
        raise OverflowError(text)
    if len(frac) > exp + 12:                                    # x * 10^exp * unit is not whole
        return None
    value, rest = divmod(int(digits) * 10**exp * unit, 10 ** len(frac))
    if rest or value == 0:
        return None
    if value > most:
        raise OverflowError(text)
    return value


def fmt(nbytes: int | float, unit: str = "GB", digits: int = 1) -> str:
    """Format a byte count in one unit with its label, e.g. ``fmt(141e9) == '141.0 GB'``."""
    if unit not in UNITS:
        raise UsageError(f"unknown unit {unit!r}; accepted: {', '.join(UNITS)}")
    return f"{nbytes / UNITS[unit]:,.{digits}f} {unit}"


def fmt_both(nbytes: int | float, digits: int = 1) -> str:
    """GB and GiB side by side: ``'80.0 GB (74.5 GiB)'``. Use where the two are easily confused."""
    return f"{fmt(nbytes, 'GB', digits)} ({fmt(nbytes, 'GiB', digits)})"


def parse_size(text: str, name: str = "size") -> int:
    """Parse ``'80GB'``, ``'80 GiB'``, ``'141e9'``-free plain byte counts, into bytes.

    A bare number is read as GB (10^9 bytes). The name on a GPU's box is neither unit exactly: an
    "80 GB" H100 reports 81,559 MiB (85.5 x 10^9 bytes, 79.6 GiB); ``gpumem.memory.gpus`` holds
    what each GPU reports.
    """
    match = _SIZE.match(str(text))
    if not match:
        raise UsageError(f"{name} {shown(text)} is not a size; write a number with a unit, "
                         f"one of {', '.join(UNITS)} (e.g. 80GB or 80GiB), at most {MAX_SIZE_TEXT}")
    unit = match.group(2) or "GB"
    canonical = {u.lower(): u for u in UNITS}[unit.lower()]
    if len(match.group(1).split(".")[0].lstrip("0")) > 16:      # judged before float() (inf) or int()
        raise UsageError(f"{name} {shown(text)} is too large; accepted: at most {MAX_SIZE_TEXT} (10^15 bytes)")
    value = int(round(float(match.group(1)) * UNITS[canonical]))
    if value <= 0:
        raise UsageError(f"{name} must be larger than zero, got {shown(text)}")
    if value > MAX_SIZE:
        raise UsageError(f"{name} {shown(text)} is too large; accepted: at most {MAX_SIZE_TEXT} (10^15 bytes)")
    return value
