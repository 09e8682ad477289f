"""The runs table: one validated row per finished trial, read from MLflow, CSV or parquet.

Columns: run_id, sweep, stage, r, budget_flops, width, n_prelude, n_recur, n_coda, N_once, N_rec, N_embed,
flops_per_token, tokens, flops_spent, val_loss, status (+ lr, seed, objective, reason, cell, s, batch_tokens and
the trial's ``template.*`` keys where recorded). A trial with warmdown branches (objectives/training.py) records
``branch<i>.*`` values; each branch becomes a row of its own (``expand_branches``), with the trial's sizes,
the branch's budget, tokens, FLOPs and loss, run_id ``<trial run_id>/branch<i>`` and ``branch_of`` = the
trial's run_id. A branch that repeats a run already in the table (same stage, r, width, tokens, rate, seed and
batch: with common random numbers a branch IS the run trained for its tokens outright, bit for bit up to float
noise) becomes status "repeat", so that the same point never enters a fit twice (``mark_repeated_branches``).
Rows whose status is not "ok" (failed, diverged, or "invalid":
marked ok but with a missing or impossible number) stay in the table with their reason; ``usable_runs`` and
``exclusions`` separate them so every report can count them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import numbers
from .column_map import apply_columns, parse_columns
from .options import MAX_RUNS
from .sizes import PAPER_BATCH_TOKENS, PAPER_TEMPLATE
from .store import BRANCH_COLUMN, OPTIONS_PARAM

RUN_COLUMNS = ("run_id", "sweep", "stage", "r", "budget_flops", "width", "n_prelude", "n_recur", "n_coda",
               "N_once", "N_rec", "N_embed", "flops_per_token", "tokens", "flops_spent", "val_loss", "status")
EXTRA_COLUMNS = ("lr", "seed", "objective", "reason", "cell", "s", "batch_tokens", "cell_widths", "branch_of")
NUMERIC_COLUMNS = ("r", "budget_flops", "width", "n_prelude", "n_recur", "n_coda", "N_once", "N_rec", "N_embed",
                   "flops_per_token", "tokens", "flops_spent", "val_loss", "lr", "s", "batch_tokens")
# What a fit cannot do without; the other columns are filled with NaN (or a default) when a file lacks them.
# A table without ``r`` is a plain (non-looped) study: r = 1 and, where it lacks N_rec too, N_rec = 0.
REQUIRED_COLUMNS = ("r", "budget_flops", "N_once", "N_rec", "tokens", "val_loss")
PLAIN_STUDY = {"r": 1, "N_rec": 0}
# Every column of the format docs/runs_table.md documents (and ``--columns`` may map to), ``template.<key>`` aside.
TABLE_COLUMNS = (*REQUIRED_COLUMNS, "width", "flops_per_token", "status", "reason", "stage", "run_id", "sweep",
                 "flops_spent", "N_embed", "lr", "seed", "s", "batch_tokens")
FILE_SUFFIXES = (".csv", ".parquet", ".pq")
MAX_MAGNITUDE = 1e60  # far beyond any FLOP, token or parameter count; 1e308 overflowed the fit
ORDER = ("stage", "budget_flops", "r", "width", "s", "run_id")  # rows read from MLflow, sorted


def load_runs(experiment: str | Path, tracking_uri: str | None = None, columns: str | None = None) -> pd.DataFrame:
    """The validated runs table of an MLflow experiment (= sweep name), or of a CSV / parquet file.

    ``experiment`` naming an existing file (or ending in .csv / .parquet) is read as a file; anything else is
    an experiment name looked up at ``tracking_uri`` (default: $MLFLOW_TRACKING_URI, else the search's store,
    sqlite:///<cwd>/loopscale-runs/mlflow.db). ``columns`` maps the table's own columns to the format's, as
    ``--columns`` does (``column_map``). Every problem with the input is a ValueError with one clear line,
    raised before any write.
    """
    mapping = parse_columns(columns, TABLE_COLUMNS) if columns is not None else ()
    source = str(experiment)
    path = Path(source)
    if path.suffix.lower() in FILE_SUFFIXES or path.is_file():
        table = read_file(path)
        origin = {"source": str(path), "tracking_uri": None}
        default_sweep = path.stem
    else:
        from .tracking import read_trial_runs

        rows, uri = read_trial_runs(source, tracking_uri)
        table = pd.DataFrame(rows)
        origin = {"source": source, "tracking_uri": uri}
        default_sweep = source
    if mapping:
        table = apply_columns(table, mapping, source)
    runs = validate_runs(table, default_sweep=default_sweep)
    if origin["tracking_uri"] is not None:
        # MLflow returns runs newest first, an order that a resumed or repeated sweep changes; the fit's sums and
        # its bootstrap follow the row order, so the same runs always enter it in one canonical order
        runs = runs.sort_values(list(ORDER), kind="stable", ignore_index=True)
    runs.attrs.update(origin)
    return runs


def read_file(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ValueError(f"no runs file at {path}")
    try:
        if path.suffix.lower() == ".csv":
            return pd.read_csv(path)
        return pd.read_parquet(path)
    except Exception as err:  # pandas/pyarrow raise many types for unreadable files
        raise ValueError(f"cannot read runs file {path}: {type(err).__name__}: {err}".splitlines()[0]) from None


def validate_runs(table: pd.DataFrame, *, default_sweep: str = "") -> pd.DataFrame:
    """Check and normalise a raw runs table; rows marked ok with unusable numbers become status 'invalid'."""
    if table.empty:
        raise ValueError(f"no runs in {default_sweep or 'the table'}")
    if "r" not in table.columns:
        table = table.assign(**{c: v for c, v in PLAIN_STUDY.items() if c not in table.columns})
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"runs table lacks column(s) {', '.join(missing)}")
    runs = table.copy()
    defaults: dict[str, Any] = {"run_id": [f"row{i}" for i in range(len(runs))], "sweep": default_sweep,
                                "stage": "search", "status": "ok", "reason": "", "objective": "", "cell": "",
                                "cell_widths": "", "branch_of": ""}
    for column in defaults:
        if column not in runs.columns:
            runs[column] = defaults[column]
    runs = expand_branches(runs)
    if len(runs) > MAX_RUNS:
        raise ValueError(f"{default_sweep or 'the runs table'} has {len(runs):,} runs (branch points included); "
                         f"at most {MAX_RUNS:,} are analysed at once (a fit's memory and time grow with the runs; the "
                         "paper's sweep has 116): analyse a part, e.g. one stage or a range of budgets")
    for column in (*RUN_COLUMNS, *EXTRA_COLUMNS):
        if column not in runs.columns:
            runs[column] = defaults.get(column, np.nan)
    for column in NUMERIC_COLUMNS:
        runs[column] = pd.to_numeric(runs[column], errors="coerce")
    for column in ("run_id", "sweep", "stage", "status", "reason", "objective", "cell", "cell_widths",
                   "branch_of"):
        runs[column] = runs[column].map(lambda v: "" if pd.isna(v) else str(v))
    runs["status"] = runs["status"].str.strip().str.lower().replace("", "ok")
    runs = mark_repeated_branches(runs)
    named = runs["run_id"][runs["run_id"] != ""]
    repeated = named[named.duplicated()]
    if not repeated.empty:  # the same run twice would enter the fit twice
        raise ValueError(f"runs table lists run_id {repeated.iloc[0]!r} more than once ({len(repeated)} repeated "
                         "row(s)); each run must appear once")

    problems = _row_problems(runs)
    flagged = (runs["status"] == "ok") & (problems != "")
    runs.loc[flagged, "status"] = "invalid"
    runs.loc[flagged, "reason"] = problems[flagged]
    blank = (runs["status"] != "ok") & (runs["reason"] == "")
    runs.loc[blank, "reason"] = "no reason recorded"
    ok = runs["status"] == "ok"
    runs.loc[ok, "r"] = runs.loc[ok, "r"].round()
    front = [*RUN_COLUMNS, *EXTRA_COLUMNS]
    return runs[front + [c for c in runs.columns if c not in front]].reset_index(drop=True)


BRANCH_FIELDS = ("budget_flops", "tokens", "flops_spent", "val_loss")  # what a branch row takes from its branch


def expand_branches(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with one more row per recorded warmdown branch (module docstring), branch columns dropped.

    A branch of a trial that did not finish ok keeps the trial's status and reason.
    """
    found = {m.group(1) for c in runs.columns if (m := BRANCH_COLUMN.match(str(c)))}
    columns = [c for c in runs.columns if BRANCH_COLUMN.match(str(c))]
    trials = runs.drop(columns=columns)
    pieces = [trials]
    for index in sorted(found, key=int):
        prefix = f"branch{index}."
        has = pd.to_numeric(runs.get(prefix + "tokens"), errors="coerce").notna() if prefix + "tokens" in runs \
            else pd.Series(False, index=runs.index)
        if not has.any():
            continue
        branch = trials[has].copy()
        for field in BRANCH_FIELDS:
            branch[field] = runs.loc[has, prefix + field] if prefix + field in runs else np.nan
        branch["branch_of"] = trials.loc[has, "run_id"].astype(str)
        branch["cell"] = ""  # the trial's cell tag names its own budget; a branch's cell is (its budget, r)
        branch["run_id"] = branch["branch_of"] + f"/branch{index}"
        if "steps" in branch and prefix + "steps" in runs:
            branch["steps"] = runs.loc[has, prefix + "steps"]
        pieces.append(branch)
    return pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else trials


REPEAT_KEY = ("sweep", "stage", "r", "width", "tokens", "lr", "seed", "batch_tokens")


def mark_repeated_branches(runs: pd.DataFrame) -> pd.DataFrame:
    """Branch rows that repeat an ok run of the same ``REPEAT_KEY`` get status "repeat": the run kept is the
    trial itself when one was trained for those tokens, else the first such branch.

    A warmdown branch follows the rates and batches of the run trained outright for its tokens
    (objectives/training.py), so with the sweep's shared init and data seeds it is that run; counting both
    would weigh one measurement twice in the fit and narrow its intervals for nothing. The rate is part of
    the key: under MuonH's data rule the outright run's rate differs from its parent trial's, and then the
    branch is a point of its own.
    """
    ok = runs["status"] == "ok"
    key = pd.Series(list(zip(*(runs[c].map(str) for c in REPEAT_KEY))), index=runs.index)
    is_branch = ~own_rows(runs)
    order = np.lexsort((runs.index.to_numpy(), is_branch.to_numpy()))  # trials first, then branches in order
    seen: set[tuple[str, ...]] = set()
    runs = runs.copy()
    for i in runs.index[order]:
        if not ok[i]:
            continue
        if key[i] in seen and is_branch[i]:
            runs.loc[i, "status"] = "repeat"
            runs.loc[i, "reason"] = "a warmdown branch repeating a run of the table (the same width, tokens and seeds)"
        seen.add(key[i])
    return runs


def _row_problems(runs: pd.DataFrame) -> pd.Series:
    """Per row, the first reason its numbers cannot enter a fit ('' when fine)."""
    checks = [
        ("r", lambda v: (v >= 1) & (v == v.round()), "r is not a positive integer"),
        ("budget_flops", lambda v: v > 0, "budget_flops is not positive"),
        ("N_once", lambda v: v > 0, "N_once is not positive"),
        ("N_rec", lambda v: v >= 0, "N_rec is negative"),
        ("tokens", lambda v: v > 0, "tokens is not positive"),
        ("val_loss", lambda v: v > 0, "val_loss is not positive"),
    ]
    problems = pd.Series("", index=runs.index, dtype=object)
    for column, test, text in reversed(checks):  # reversed: the first failing check wins
        values = runs[column]
        finite = np.isfinite(values.to_numpy(float))
        problems[~finite] = f"{column} is missing or not finite"
        problems[finite & ~test(values).to_numpy(bool)] = text
        # products of such numbers overflow float64 inside the fit and the tables
        problems[finite & (values.abs() > MAX_MAGNITUDE).to_numpy(bool)] = f"{column} is above {MAX_MAGNITUDE:.0e}"
    return problems


def budget_disagreement(runs: pd.DataFrame, name: str) -> str:
    """A warning line ("" when none) for the ok runs whose tokens x flops_per_token is off their budget_flops by
    more than a factor of 2, either way; a ValueError line when every run that has both is.

    A sweep's run trains the whole optimizer steps its budget buys (model/accounting.py, ``tokens_for_budget``):
    at least one step, so it spends between half its budget and all of it. Beyond 2x, budgets and tokens are in
    different units or from different runs, and since the IsoFLOP cells stand on budget_flops, the fit's
    compute-optimal models are off by that factor. When every run is, no allocation from the table means
    anything: refused. When some are (a researcher's runs trained past their cell's budget on purpose), the
    fit goes on, and the line says how many and by what factor."""
    ok = runs[(runs["status"] == "ok") & runs["flops_per_token"].notna()]
    if ok.empty:
        return ""
    factor = ok["tokens"].astype(float) * ok["flops_per_token"] / ok["budget_flops"]  # int64 would overflow
    off = factor[(factor > 2) | (factor < 0.5)]
    if off.empty:
        return ""
    typical = f"{numbers.sig(off.median())}x"
    if len(off) == len(ok):
        raise ValueError(f"every run of {name} ({len(ok)}) has tokens x flops_per_token {typical} its budget_flops "
                         "(the median), where a run spends half its budget to all of it: budgets and tokens in "
                         "different units? The IsoFLOP cells stand on budget_flops")
    return (f"{len(off)} of {len(ok)} runs of {name} have tokens x flops_per_token {typical} their budget_flops "
            "(the median of those), where a run spends half its budget to all of it; they are fitted as they are")


def own_rows(runs: pd.DataFrame) -> pd.Series:
    """True on a trial's own row, False on a warmdown branch point of one (``branch_of`` set); True on every row
    of a table without the column."""
    if "branch_of" not in runs:
        return pd.Series(True, index=runs.index)
    return runs["branch_of"].fillna("") == ""


def usable_runs(runs: pd.DataFrame, stage: str | None = "search") -> pd.DataFrame:
    """Rows with status 'ok' (of ``stage``, unless None): what a fit may use."""
    keep = runs["status"] == "ok"
    if stage is not None:
        keep &= runs["stage"] == stage
    return runs[keep]


EXCLUDED_COLUMNS = ("run_id", "stage", "r", "budget_flops", "status", "reason")


def excluded_runs(runs: pd.DataFrame, stage: str | None = "search") -> pd.DataFrame:
    """Every row a fit leaves out and why: failed or diverged runs with their own reason, ok runs of another
    stage with "stage <name> (not fitted)"."""
    left_out = runs[runs["status"] != "ok"]
    if stage is not None:
        other = runs[(runs["status"] == "ok") & (runs["stage"] != stage)]
        left_out = pd.concat([left_out, other.assign(reason="stage " + other["stage"] + " (not fitted)")])
    return left_out[[c for c in EXCLUDED_COLUMNS if c in left_out]].reset_index(drop=True)


def exclusions(runs: pd.DataFrame, stage: str | None = "search") -> pd.DataFrame:
    """Counts of the rows a fit leaves out (``excluded_runs``), by status and reason."""
    left_out = excluded_runs(runs, stage)
    if left_out.empty:
        return pd.DataFrame({"status": pd.Series(dtype=str), "reason": pd.Series(dtype=str),
                             "count": pd.Series(dtype=int)})
    counts = left_out.groupby(["status", "reason"]).size().reset_index(name="count")
    return counts.sort_values("count", ascending=False, ignore_index=True)


def template_of(runs: pd.DataFrame) -> tuple[dict[str, Any], int, str]:
    """The iso-depth template and batch size the sweep's trials used: (template, batch_tokens, where from).

    Read from the ``template.*`` and ``batch_tokens`` columns (MLflow params); the paper's when absent.
    """
    columns = [c for c in runs.columns if c.startswith("template.")]
    batch = runs["batch_tokens"].dropna().unique() if "batch_tokens" in runs else []
    if not columns:
        return dict(PAPER_TEMPLATE), int(batch[0]) if len(batch) == 1 else PAPER_BATCH_TOKENS, "paper (not recorded)"
    template = {}
    for column in columns:
        values = runs[column].dropna().astype(str).unique()
        if len(values) > 1:
            raise ValueError(f"runs disagree on {column}: {', '.join(sorted(values))}")
        if len(values) == 1 and column == OPTIONS_PARAM:
            template["options"] = json.loads(values[0])
        elif len(values) == 1 and values[0] != "None":
            key, _, option = column.removeprefix("template.").partition(".")
            if option:  # a factory's option, flattened as template.options.<name> by an older version
                template.setdefault(key, {})[option] = _parse(values[0])
            else:
                template[key] = _parse(values[0])
    if len(batch) > 1:
        raise ValueError(f"runs disagree on batch_tokens: {sorted(batch)}")
    return template, int(batch[0]) if len(batch) else PAPER_BATCH_TOKENS, "recorded"


def _parse(text: str) -> Any:
    """An MLflow param string back to int, float, bool or str (every numeric template field is an integer; a
    factory's option may be any of them)."""
    if text in ("True", "False"):
        return text == "True"
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value
