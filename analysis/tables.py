"""A table in the four formats the CLI writes: CSV (full precision), Markdown, LaTeX (booktabs) and JSON.

Markdown and LaTeX show 4 significant digits (integers in full); JSON is a list of records with full
precision and NaN as null.

Text cells come from the runs table (a CSV anyone may have written, a failure reason quoting an exception), so
each format escapes them: in CSV a text cell starting with ``= + - @``, a tab or a carriage return gets a
leading ``'`` (OWASP's defence against CSV injection: a spreadsheet would run ``=cmd|...`` as a formula); in
Markdown ``|``, ``<``, ``>``, ``&`` and line breaks become ``\\|``, HTML entities and ``<br>`` (a bare ``|`` or
newline splits the table, ``<script>`` is live HTML in a rendered page); in LaTeX the ten special characters
become their commands and line breaks spaces.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

FORMATS = {"csv": ".csv", "md": ".md", "latex": ".tex", "json": ".json"}
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
MARKDOWN_SPECIALS = {"|": r"\|", "<": "&lt;", ">": "&gt;", "&": "&amp;", "\r\n": "<br>", "\n": "<br>",
                     "\r": "<br>"}
LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "\n": " ", "\r": " "}  # a blank line inside a tabular ends it with an error


def render(table: pd.DataFrame, fmt: str) -> str:
    """The table as text in ``fmt`` (one of FORMATS)."""
    if fmt == "csv":
        return to_csv(table)
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


def to_csv(table: pd.DataFrame) -> str:
    """CSV at full precision, text cells that a spreadsheet would read as a formula quoted (module docstring)."""
    safe = table.rename(columns=lambda c: csv_text(c) if isinstance(c, str) else c)
    for column in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[column]):
            safe[column] = safe[column].map(lambda v: csv_text(v) if isinstance(v, str) else v)
    return safe.to_csv(index=False)


def csv_text(text: str) -> str:
    return "'" + text if text.startswith(FORMULA_START) else text


_MARKDOWN_SPECIAL = re.compile("|".join(re.escape(k) for k in MARKDOWN_SPECIALS))


def markdown_escape(text: str) -> str:
    return _MARKDOWN_SPECIAL.sub(lambda m: MARKDOWN_SPECIALS[m[0]], text)


def to_markdown(table: pd.DataFrame) -> str:
    header = [markdown_escape(str(c)) for c in table.columns]
    rows = [[markdown_escape(cell(v)) for v in row] for row in table.itertuples(index=False)]
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
