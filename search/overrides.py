"""``--set key=value``: change a spec's keys on the command line without copying the TOML file.

A key is a TOML key path: ``trials_per_cell`` at the top level, ``widths.s_max`` inside ``[widths]``. A value
is read as a TOML value (``8``, ``1e12``, ``[1, 2, 4]``, ``"gp"``, ``true``); a bare word that is not TOML
(``gp``) is taken as a string. The overrides are applied to the parsed file before validation, so a bad key or
value fails exactly as it would in the file; the spec that is hashed and logged is the effective one (its text
rewritten as TOML, headed by the ``--set`` items).
"""

from __future__ import annotations

import copy
import json
import math
import re
import tomllib
from typing import Any

_KEY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def parse_set(item: str) -> tuple[tuple[str, ...], Any]:
    """``"widths.s_max=8"`` -> (("widths", "s_max"), 8); a ValueError in one line for a malformed item."""
    if any(ord(c) < 32 or ord(c) == 127 for c in item):  # a newline would end the value, and the logged comment
        raise ValueError(f"--set {item!r}: holds a control character (a newline?); one item is one key=value line")
    key, sep, text = item.partition("=")
    key, text = key.strip(), text.strip()
    if not sep or not _KEY.match(key):
        raise ValueError(f"--set {item!r}: expected key=value with a dotted key such as widths.s_max=8")
    if not text:
        raise ValueError(f"--set {item!r}: no value after '='")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except RecursionError:
        raise ValueError(f"--set {item[:40]!r}...: the value nests too deeply") from None
    except tomllib.TOMLDecodeError:
        if not re.fullmatch(r"[A-Za-z0-9_.:/+-]+", text):
            raise ValueError(f"--set {item!r}: {text!r} is not a TOML value (quote strings: key=\"...\")") from None
        value = text  # a bare word: the string it spells
    return tuple(key.split(".")), value


def apply_sets(raw: dict[str, Any], items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """A copy of the parsed spec ``raw`` with every ``key=value`` of ``items`` applied in order; a table on the
    way that the file lacks is created (validation then says what else it needs)."""
    out = copy.deepcopy(raw)
    for item in items:
        path, value = parse_set(item)
        table = out
        for depth, part in enumerate(path[:-1]):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ValueError(f"--set {item!r}: {'.'.join(path[:depth + 1])} is a value, not a table")
        table[path[-1]] = value
    return out


def effective_text(text: str, raw: dict[str, Any], items: list[str] | tuple[str, ...]) -> str:
    """What is logged as the sweep's spec: the file's own text, or with ``--set`` items the effective spec
    ``raw`` as TOML, headed by the items (the file's comments do not survive the rewrite)."""
    if not items:
        return text
    header = "".join(f"# --set {item}\n" for item in items)
    return f"# effective spec: the file with the command line's overrides\n{header}{to_toml(raw)}"


def to_toml(raw: dict[str, Any]) -> str:
    """A parsed spec as TOML: top-level keys, then one [table] per table (deeper tables inline);
    ``tomllib.loads(to_toml(raw)) == raw`` for the types a spec holds."""
    top = [f"{k} = {_value(v)}" for k, v in raw.items() if not isinstance(v, dict)]
    tables = [f"\n[{k}]\n" + "".join(f"{kk} = {_value(vv)}\n" for kk, vv in v.items())
              for k, v in raw.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n" + "".join(tables)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + "}"
    return str(value)
