"""The downstream scores of a runs table as one long table: a row per (kept model, axis, r_eval).

Columns: the run, its stage, budget, trained r and width, its training compute ``flops`` (the trial's
``flops_spent``, else its budget), ``r_eval``, the ``axis``, its ``score`` and ``se`` (analysis/downstream/
accuracy.py), the axis' ``chance``, and ``loss``: the model's validation loss at r_eval (its ``val_loss`` at the
trained r, ``val_loss_r<r_eval>`` at another, NaN where it was not measured).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..runs import own_rows
from ..store import eval_column
from .columns import AXIS_COLUMN, axis_chance, axis_se

SCORE_COLUMNS = ("run_id", "stage", "budget_flops", "r", "width", "flops", "r_eval", "axis", "score", "se", "chance",
                 "loss")


def score_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The long table of the ok trials of ``runs`` that carry downstream scores (empty, with its columns, when
    none do), sorted by axis, cell, run and r_eval."""
    found = [(m.group(1), int(m.group(2)), c) for c in runs.columns if (m := AXIS_COLUMN.match(str(c)))]
    if not found:
        return pd.DataFrame(columns=list(SCORE_COLUMNS))
    trials = runs[(runs["status"] == "ok") & own_rows(runs)]
    rows = []
    for axis, r_eval, column in found:
        scores = pd.to_numeric(trials[column], errors="coerce")
        for index in scores.dropna().index:
            row = trials.loc[index]
            loss = row["val_loss"] if int(row["r"]) == r_eval else row.get(eval_column(r_eval), np.nan)
            spent = row.get("flops_spent", np.nan)
            rows.append({"run_id": row["run_id"], "stage": row["stage"], "budget_flops": row["budget_flops"],
                         "r": int(row["r"]), "width": row.get("width", np.nan),
                         "flops": float(spent) if pd.notna(spent) else float(row["budget_flops"]),
                         "r_eval": r_eval, "axis": axis, "score": float(scores[index]),
                         "se": float(row.get(axis_se(axis, r_eval), np.nan)),
                         "chance": float(row.get(axis_chance(axis), np.nan)), "loss": float(loss)})
    table = pd.DataFrame(rows, columns=list(SCORE_COLUMNS))
    return table.sort_values(["axis", "stage", "budget_flops", "r", "run_id", "r_eval"], ignore_index=True)


def at_trained_r(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of each model evaluated as it was trained (r_eval = r), with a measured loss."""
    return table[(table["r_eval"] == table["r"]) & table["loss"].notna()]
