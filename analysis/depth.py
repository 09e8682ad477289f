"""Depth extrapolation: kept models evaluated at other recurrence counts (``loopscale evaluate``), as a table.

A trial trained at r whose kept model was evaluated at r_eval carries ``val_loss_r<r_eval>`` (store.EVAL_COLUMN)
next to its ``val_loss``. ``depth_table`` gives one row per (trial, r_eval): its cell (stage, budget, trained r),
width, the loss at r_eval, the loss at the trained r as its trial measured it, and

    gain = val_loss(trained r) - val_loss(r_eval)    (nats; > 0: running the block r_eval times is better)

so the gain or loss of extra (r_eval > r) or fewer recurrences reads off one column. The evaluation at the
trained r itself has gain 0 up to float noise (it is the trial's own evaluation repeated).
"""

from __future__ import annotations

import pandas as pd

from .runs import own_rows
from .store import EVAL_COLUMN

DEPTH_COLUMNS = ("run_id", "stage", "budget_flops", "r", "width", "r_eval", "val_loss_r_eval", "val_loss", "gain")


def depth_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The evaluations at other r of the ok trials of ``runs`` (a runs table; module docstring), sorted by cell,
    run and r_eval; empty (with its columns) when no kept model was evaluated."""
    columns = {int(m.group(1)): c for c in runs.columns if (m := EVAL_COLUMN.match(str(c)))}
    if not columns:
        return pd.DataFrame(columns=list(DEPTH_COLUMNS))
    trials = runs[(runs["status"] == "ok") & own_rows(runs)]
    rows = []
    for r_eval, column in sorted(columns.items()):
        loss = pd.to_numeric(trials[column], errors="coerce")
        for index in loss.dropna().index:
            row = trials.loc[index]
            rows.append({"run_id": row["run_id"], "stage": row["stage"], "budget_flops": row["budget_flops"],
                         "r": int(row["r"]), "width": row["width"], "r_eval": r_eval,
                         "val_loss_r_eval": float(loss[index]), "val_loss": float(row["val_loss"]),
                         "gain": float(row["val_loss"]) - float(loss[index])})
    table = pd.DataFrame(rows, columns=list(DEPTH_COLUMNS))
    return table.sort_values(["stage", "budget_flops", "r", "run_id", "r_eval"], ignore_index=True)


def depth_text(depth: pd.DataFrame) -> str:
    """One line: the mean gain of each (trained r, r_eval) pair, with how many models it averages."""
    other = depth[depth["r_eval"] != depth["r"]]
    gains = other.groupby(["r", "r_eval"])["gain"].agg(["mean", "size"])
    pairs = [f"r={r} at {r_eval}: {row['mean']:+.4f} ({row['size']:.0f})" for (r, r_eval), row in gains.iterrows()]
    return (f"{depth['run_id'].nunique()} kept models evaluated at other r (tables/depth_eval, plots/loss_vs_r_eval); "
            f"mean gain over the trained r in nats (models): {', '.join(pairs) or 'none: only their trained r'}")
