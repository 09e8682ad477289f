"""A table in the four formats the CLI writes: CSV (full precision), Markdown, LaTeX (booktabs) and JSON.

Markdown and LaTeX show 4 significant digits (integers in full); JSON is a list of records with full
precision and NaN as null.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

FORMATS = {"csv": ".csv", "md": ".md", "latex": ".tex", "json": ".json"}
LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def render(table: pd.DataFrame, fmt: str) -> str:
    """The table as text in ``fmt`` (one of FORMATS)."""
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "md":
        return to_markdown(table)
    if fmt == "latex":
        return to_latex(table)
    if fmt == "json":
        return to_json(table)
    raise ValueError(f"unknown table format {fmt!r}; choose one of {', '.join(FORMATS)}")


def write_all(table: pd.DataFrame, stem: Path) -> list[Path]:
    """Write ``stem``.csv/.md/.tex/.json; returns the paths."""
    paths = []
    for fmt, suffix in FORMATS.items():
        path = stem.with_suffix(suffix)
        path.write_text(render(table, fmt))
        paths.append(path)
    return paths


def cell(value) -> str:
    """A value as short text: 4 significant digits for floats, integers in full."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.4g}"
    return str(value)


def to_markdown(table: pd.DataFrame) -> str:
    header = [str(c) for c in table.columns]
    rows = [[cell(v).replace("|", r"\|") for v in row] for row in table.itertuples(index=False)]
    numeric = [pd.api.types.is_numeric_dtype(table[c]) for c in table.columns]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIALS.get(ch, ch) for ch in text)


def to_latex(table: pd.DataFrame) -> str:
    align = "".join("r" if pd.api.types.is_numeric_dtype(table[c]) else "l" for c in table.columns)
    lines = [rf"\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(latex_escape(str(c)) for c in table.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(cell(v)) for v in row) + r" \\" for row in table.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_json(table: pd.DataFrame) -> str:
    records = json.loads(table.to_json(orient="records", double_precision=15))
    return json.dumps(records, indent=1) + "\n"
