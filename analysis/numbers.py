"""One formatter for every number a person reads: plan, search's tables, analyze, export, the Markdown and LaTeX
tables. Machine-read outputs (CSV, JSON, MLflow values) keep full precision and never pass through here.

Rules: 3 significant figures; counts (parameters, tokens, steps) with a k/M/B/T suffix (51.6k, 8.21B); FLOPs in
e-notation without a plus sign (2.15e19); losses to 3 decimals; durations in the largest units that keep them
short (45 s, 3 min 20 s, 2.4 h); a range as ``low-high`` with the smaller end first, both in the same format.
Every line a terminal shows fits ``COLUMNS``: longer prose wraps (``wrap``).
"""

from __future__ import annotations

import math
import textwrap
from typing import Callable

DIGITS = 3
COUNT_SUFFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))
COLUMNS = 120  # a terminal line; longer prose wraps, continued two spaces in


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def sig(value: float | None, digits: int = DIGITS) -> str:
    """``digits`` significant figures, trailing zeros kept (0.500, 12.0, 1.23e-5; 1.23e3 past 999); "" for a
    missing value."""
    if _missing(value):
        return ""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(float(f"{value:.{digits - 1}e}"))))
    if -4 <= exponent < digits:
        return f"{value:.{max(0, digits - 1 - exponent)}f}"
    return flops(value, digits)


def count(value: float | None) -> str:
    """A count with 3 significant figures and a k/M/B/T suffix: 51552 -> 51.6k, 13000 -> 13.0k, 8.21e9 -> 8.21B,
    512 -> 512; past 999T it is e-notation (a count of 1e16 tokens reads 1.00e16)."""
    if _missing(value):
        return ""
    rounded = float(f"{value:.{DIGITS}g}")
    if abs(rounded) >= 1e15:
        return flops(rounded)
    for scale, suffix in COUNT_SUFFIXES:
        if abs(rounded) >= scale:
            return sig(rounded / scale) + suffix
    return f"{rounded:g}" if float(rounded).is_integer() else sig(rounded)


def flops(value: float | None, digits: int = DIGITS) -> str:
    """E-notation with ``digits`` significant figures and no plus sign or leading zero in the exponent:
    2.15e19, 1.00e18, 3.20e-05."""
    if _missing(value):
        return ""
    mantissa, _, exponent = f"{value:.{digits - 1}e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def loss(value: float | None) -> str:
    """A loss in nats to 3 decimals (they differ in the second or third decimal between allocations)."""
    return "" if _missing(value) else f"{value:.3f}"


def duration(seconds: float | None) -> str:
    """45 s, 3 min 20 s, 2.4 h, 3.1 days: the two largest units under an hour, then hours, then days."""
    if _missing(seconds):
        return ""
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if seconds < 86400 * 2:
        return f"{sig(seconds / 3600, 2)} h"
    return f"{sig(seconds / 86400, 2)} days"


def plural(n: int, noun: str) -> str:
    """``n`` and the noun, in the plural unless n is 1: ``1 head``, ``2 heads``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def span(low: float | None, high: float | None, form: Callable[[float], str] = sig) -> str:
    """A range ``low-high`` in one format, the smaller end first whatever order it came in; one value when both
    ends read the same; "" when either end is missing."""
    if _missing(low) or _missing(high):
        return ""
    low, high = sorted((low, high))
    a, b = form(low), form(high)
    return a if a == b else f"{a}-{b}"


def stretches(parts, form: Callable[[float], str] = lambda v: f"{v:.3f}") -> str:
    """An interval as a line reads it: ``low to high``, or where a test accepts separate stretches each of them,
    ``a to b and c to d``; "" for none."""
    return " and ".join(f"{form(lo)} to {form(hi)}" for lo, hi in parts)


def wrap(text: str) -> str:
    """Every line of ``text`` within ``COLUMNS``: a longer one wrapped at spaces, its continuations indented two
    spaces past its own indent."""
    return "\n".join(part for line in text.split("\n") for part in _wrap_line(line))


def _wrap_line(line: str) -> list[str]:
    if len(line) <= COLUMNS:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 2)
    # a word longer than a line (a path) stays whole, to be copied
    return textwrap.wrap(line, COLUMNS, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)
