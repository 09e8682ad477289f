"""The "did you mean" hint of every bad-key and bad-value message (spec, recipe and data tables)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


def did_you_mean(word: Any, options: Iterable[Any]) -> str:
    """`` (did you mean 'x'?)`` for the option closest to ``word`` (difflib's ratio >= 0.6), else ``""``."""
    match = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""
