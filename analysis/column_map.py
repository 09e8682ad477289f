"""``--columns TARGET=SOURCE[*FACTOR],...``: read another tool's runs table (a W&B export, a published IsoFLOP
study) under the names and units of docs/runs_table.md, without renaming its columns by hand.

Each TARGET is a column of the runs table format (``runs.TABLE_COLUMNS``, passed in by ``runs.load_runs``, or a
``template.<key>``); SOURCE names
a column of the file; ``*FACTOR`` multiplies it, for a unit: ``budget_flops=gflops*1e9`` reads GFLOPs as FLOPs,
``tokens=tokens_b*1e9`` billions of tokens as tokens. The mapped values replace a TARGET column the file
already has. Every problem is one ValueError line, raised before any fit or write: a TARGET the format does not
have, a FACTOR that is not a positive finite number, a TARGET given twice, and a SOURCE the file lacks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Mapped:
    """One TARGET=SOURCE*FACTOR of the mapping (FACTOR 1 where none was given)."""

    target: str
    source: str
    factor: float = 1.0

    def text(self) -> str:
        return f"{self.target}={self.source}" + (f"*{self.factor:g}" if self.factor != 1 else "")


def parse_columns(text: str, targets: tuple[str, ...]) -> tuple[Mapped, ...]:
    """The mapping of a ``--columns`` value (module docstring); ``targets``: the format's columns."""
    mapping: dict[str, Mapped] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        target, sign, source = (piece.strip() for piece in item.partition("="))
        if not sign or not target or not source:
            raise ValueError(f"--columns item {item!r} is not TARGET=SOURCE (e.g. val_loss=loss)")
        if target not in targets and not target.startswith("template."):
            raise ValueError(f"--columns target {target!r} is not a runs table column; the columns are "
                             f"{', '.join(targets)} and template.<key> (docs/runs_table.md)")
        if target in mapping:
            raise ValueError(f"--columns maps {target} twice ({mapping[target].text()}, {item})")
        source, star, factor_text = (piece.strip() for piece in source.rpartition("*")) if "*" in source \
            else (source, "", "")
        factor = _factor(factor_text, item) if star else 1.0
        mapping[target] = Mapped(target, source, factor)
    if not mapping:
        raise ValueError("--columns is empty; give TARGET=SOURCE pairs, e.g. val_loss=loss,N_once=params")
    return tuple(mapping.values())


def _factor(text: str, item: str) -> float:
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"--columns item {item!r}: the factor after '*' must be a positive number, e.g. 1e9")
    return factor


def apply_columns(table: pd.DataFrame, mapping: tuple[Mapped, ...], name: str) -> pd.DataFrame:
    """``table`` with each TARGET column taken from its SOURCE (times its factor); a SOURCE that ``table``
    (named ``name`` in the error) lacks is a ValueError naming it."""
    for item in mapping:
        if item.source not in table.columns:
            shown = ", ".join(map(str, table.columns[:12])) + (" ..." if len(table.columns) > 12 else "")
            raise ValueError(f"--columns {item.text()}: {name} has no column {item.source!r} (it has {shown})")
    # every value read before any is written: a mapping may swap two columns, or read one twice
    values = {item.target: _scaled(table[item.source], item.factor) for item in mapping}
    return table.assign(**values)


def _scaled(column: pd.Series, factor: float) -> pd.Series:
    if factor == 1:
        return column
    return pd.to_numeric(column, errors="coerce") * factor  # a text cell becomes NaN: the row is marked invalid
