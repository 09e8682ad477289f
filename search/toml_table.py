"""Typed, checked access to the tables of a TOML file: every mistake is ONE ``ValueError`` line.

TOML has integers, floats, strings, lists and tables; a spec key wants one of them. ``Table`` reads a key as
the type it must be, refuses unknown keys with the closest known one as a hint, and refuses numbers a float
cannot hold (TOML spells inf and nan, and its integers are unbounded here).
"""

from __future__ import annotations

import math
import sys
from typing import Any

from loopscale.objectives.checks import did_you_mean, require

__all__ = ["Table", "finite", "require"]


def finite(value: int | float) -> bool:
    """A number a float can hold (TOML integers are unbounded here; ``float(10**400)`` overflows)."""
    return math.isfinite(value) if isinstance(value, float) else abs(value) <= sys.float_info.max


class Table:
    """Typed access to one TOML table that rejects unknown keys up front."""

    def __init__(self, raw: Any, where: str, known: tuple[str, ...]):
        require(isinstance(raw, dict), f"{where} must be a table")
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} in {where}{did_you_mean(unknown[0], known)}; "
                             f"known keys: {', '.join(known)}")
        self.raw, self.where = raw, where

    def _get(self, key: str, types: tuple[type, ...], default: Any, required: bool, kind: str) -> Any:
        if key not in self.raw:
            require(not required, f"{self.where} needs {key!r}")
            return default
        value = self.raw[key]
        require(isinstance(value, types) and not isinstance(value, bool),
                f"{key} in {self.where} must be {kind}, got {value!r}")
        return value

    def str(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        return self._get(key, (str,), default, required, "a string")

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.raw.get(key, default)
        require(isinstance(value, bool), f"{key} in {self.where} must be true or false, got {value!r}")
        return value

    def int(self, key: str, default: int | None = None, required: bool = False) -> int | None:
        return self._get(key, (int,), default, required, "an integer")

    def number(self, key: str, default: float | None = None, required: bool = False) -> float | None:
        value = self._get(key, (int, float), default, required, "a number")
        # no setting means inf or nan (and inf would only fail later, inside a trial)
        require(value is None or finite(value), f"{key} in {self.where} must be a finite number, got {value!r}")
        return value

    def table(self, key: str, required: bool = False) -> dict[str, Any]:
        return self._get(key, (dict,), {}, required, "a table")

    def list(self, key: str, item_types: tuple[type, ...], required: bool = False) -> list | None:
        value = self._get(key, (list,), None, required, "a list")
        if value is not None:
            require(len(value) > 0, f"{key} in {self.where} is empty")
            kind = "integers" if item_types == (int,) else "numbers"
            require(all(isinstance(v, item_types) and not isinstance(v, bool) and finite(v) for v in value),
                    f"{key} in {self.where} must be a list of finite {kind}, got {value!r}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value = self.str(key, default)
        require(value in options, f"{key} must be one of {', '.join(options)}, got {value!r}")
        return value
