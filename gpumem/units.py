"""Bytes in, bytes out; GB (10^9) and GiB (2^30) only at display time, always labelled."""

import re

from .errors import UsageError

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

UNITS = {"B": 1, "KB": KB, "MB": MB, "GB": GB, "TB": TB,
         "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)


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
        raise UsageError(f"{name} {text!r} is not a size; write a number with a unit, "
                         f"one of {', '.join(UNITS)} (e.g. 80GB or 80GiB)")
    number, unit = float(match.group(1)), match.group(2) or "GB"
    canonical = {u.lower(): u for u in UNITS}[unit.lower()]
    value = int(round(number * UNITS[canonical]))
    if value <= 0:
        raise UsageError(f"{name} must be larger than zero, got {text!r}")
    return value
