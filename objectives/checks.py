"""The one-line errors of every table check (spec, recipe, data and testing tables): refuse, and hint."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


def require(ok: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``ok``: the one way a table is refused."""
    if not ok:
        raise ValueError(message)


def did_you_mean(word: Any, options: Iterable[Any]) -> str:
    """`` (did you mean 'x'?)`` for the option closest to ``word`` (difflib's ratio >= 0.6), else ``""``."""
    match = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""
