"""The compute-loss Pareto frontier and per-r power laws of the compute-optimal allocation.

A run is on the frontier when no run with at most its training FLOPs has a lower validation loss. The
per-r power laws q*(C) = k C^a for q in N*, D*, L* and D*/N* are least-squares lines in log-log space through
the per-cell IsoFLOP optima (analysis.isoflop); the exponent's interval repeats the regression on every
bootstrap draw of the cell optima. Comparing the rows across r checks the paper's finding that looped models
want larger N* (wider models) and fewer tokens per parameter at the same compute.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .isoflop import IsoflopResult
from .runs import usable_runs

POWER_LAW_QUANTITIES = ("N", "D", "L", "tokens_per_param")
MIN_CELLS = 3


def training_flops(runs: pd.DataFrame) -> pd.Series:
    """FLOPs a run spent: flops_spent, else flops_per_token x tokens, else its budget."""
    return runs["flops_spent"].fillna(runs["flops_per_token"] * runs["tokens"]).fillna(runs["budget_flops"])


def pareto_frontier(runs: pd.DataFrame, *, per_r: bool = True, overall: bool = True,
                    stage: str | None = "search") -> pd.DataFrame:
    """The non-dominated usable runs in (training FLOPs, validation loss), cheapest first.

    Returns the frontier rows with a ``group`` column: "all" for the frontier over every r, "r=<r>" for each
    r's own frontier (a run can appear in both).
    """
    usable = usable_runs(runs, stage=stage).assign(training_flops=training_flops)
    parts = []
    if overall:
        parts.append(_non_dominated(usable).assign(group="all"))
    if per_r:
        parts += [_non_dominated(group).assign(group=f"r={int(r)}") for r, group in usable.groupby("r")]
    return pd.concat(parts, ignore_index=True) if parts else usable.iloc[:0].assign(group=[])


def _non_dominated(runs: pd.DataFrame) -> pd.DataFrame:
    ordered = runs.sort_values(["training_flops", "val_loss"], kind="stable")
    best_before = ordered["val_loss"].cummin().shift(fill_value=np.inf)
    return ordered[ordered["val_loss"] < best_before]


def power_laws(optima: IsoflopResult, *, confidence: float = 0.95) -> pd.DataFrame:
    """Per r and quantity: q*(C) = coefficient x C^exponent with the exponent's bootstrap interval.

    Uses the cells with an interior optimum; an r with fewer than ``MIN_CELLS`` such cells gets no row (two
    points fit any line exactly and leave the exponent's interval meaningless).
    """
    table = optima.table
    if table.empty or "N_opt" not in table:
        return pd.DataFrame()
    ok = table[table["status"] == "ok"]
    tail = 100 * (1 - confidence) / 2
    rows = []
    for r, cells in ok.groupby("r"):
        if len(cells) < MIN_CELLS:
            continue
        log_c = np.log(cells["budget_flops"].to_numpy(float))
        points = {q: np.log(cells[f"{q}_opt"].to_numpy(float)) for q in ("N", "D", "L")}
        points["tokens_per_param"] = points["D"] - points["N"]
        # (B, cells, 3) draws of (log N*, log D*, L*)
        draws = np.stack([optima.draws[(float(c), int(r))] for c in cells["budget_flops"]], axis=1)
        boot = {"N": draws[..., 0], "D": draws[..., 1], "L": np.log(draws[..., 2])}
        boot["tokens_per_param"] = boot["D"] - boot["N"]
        for quantity in POWER_LAW_QUANTITIES:
            slope, intercept = np.polyfit(log_c, points[quantity], 1)
            slopes = _bootstrap_slopes(log_c, boot[quantity])
            lo, hi = np.percentile(slopes, [tail, 100 - tail]) if slopes.size else (np.nan, np.nan)
            rows.append({"r": int(r), "quantity": quantity, "coefficient": float(np.exp(intercept)),
                         "exponent": float(slope), "exponent_lo": float(lo), "exponent_hi": float(hi),
                         "n_cells": len(cells), "n_draws": int(slopes.size)})
    return pd.DataFrame(rows)


def _bootstrap_slopes(log_c: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Least-squares slope of each draw (row of values) against log C, over draws with every cell valid."""
    complete = values[np.all(np.isfinite(values), axis=1)]
    if complete.shape[0] == 0 or np.ptp(log_c) == 0:
        return np.empty(0)
    xc = log_c - log_c.mean()
    return (complete - complete.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
