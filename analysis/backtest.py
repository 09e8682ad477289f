"""Extrapolation backtest: does the law fitted on the smaller budgets predict the largest one?

The question a reader of a scaling law asks first. The joint law is refitted on every usable run except those
of the largest budget C_max (which needs at least two other budgets), then asked about C_max:

* per r, the compute-optimal loss and width (``allocation_table`` on the refitted law; without a template
  ``law_optimum.optimum_table``, the loss alone) against the held-out
  cells' measured IsoFLOP optima (``cell_optima``: the parabola's vertex and its bootstrap interval);
* per held-out run, its loss predicted at its own (N_once, N_rec, r, D) against the measured one.

``loss_error`` = predicted - measured optimal loss (nats); ``width_ratio`` = predicted / measured optimal
width; ``within`` says whether the predicted optimal loss lies inside the measured optimum's interval widened
by the run noise the refit saw (its RMSE on both sides): "within the noise".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .fit import fit_joint_law
from .fit_types import LawFit
from .options import FitOptions
from .isoflop import IsoflopResult
from .runs import usable_runs


@dataclass(frozen=True, eq=False)
class Backtest:
    """The held-out budget, the refit, and the per-cell and per-run errors."""

    held_out: float
    fit: LawFit
    cells: pd.DataFrame    # one row per r at the held-out budget
    runs_rmse: float       # nats, held-out runs predicted by the refit
    runs_max_error: float  # nats
    n_held_out: int

    def summary(self) -> dict[str, Any]:
        errors = self.cells["loss_error"].dropna()
        ratios = self.cells["width_ratio"].dropna()
        return {"held_out_budget": self.held_out, "n_held_out_runs": self.n_held_out,
                "refit_phi": self.fit.phi, "refit_runs": self.fit.n_runs, "runs_rmse": self.runs_rmse,
                "runs_max_error": self.runs_max_error,
                "loss_error_mean_abs": float(errors.abs().mean()) if len(errors) else None,
                "width_ratio_range": [float(ratios.min()), float(ratios.max())] if len(ratios) else None,
                "cells_within_noise": int(self.cells["within"].sum()), "cells_compared": int(len(errors))}

    def text(self) -> str:
        s = self.summary()
        line = (f"backtest: refit without C={self.held_out:.3g} ({s['refit_runs']} runs"
                f"{f', phi {self.fit.phi:.3f}' if self.fit.phi_applicable else ''}) "
                f"predicts its {self.n_held_out} runs to {self.runs_rmse:.4f} nats RMSE")
        if s["cells_compared"]:
            line += (f"; optimal loss off by {s['loss_error_mean_abs']:.4f} nats on average, within the noise in "
                     f"{s['cells_within_noise']} of {s['cells_compared']} cells")
        if s["width_ratio_range"]:  # None without a template: no width predicted
            lo, hi = s["width_ratio_range"]
            line += f"; optimal width x{lo:.2f}-{hi:.2f}"
        return line


def backtest(runs: pd.DataFrame, optima: IsoflopResult, *, options: FitOptions,
             allocate: Callable[[LawFit, list[float], list[int]], pd.DataFrame]) -> Backtest | None:
    """Refit without the largest budget and predict it; None when fewer than three budgets were run;
    ``fit.TooFewRuns`` when the runs below the largest budget cannot determine the law (a sweep of one run per
    cell can fit the law on all its runs and not on two thirds of them).

    ``optima`` are the per-cell optima of all usable runs; ``allocate`` gives the refit's compute-optimal
    models (a template's ``allocation_table``, or without one ``law_optimum.optimum_table``, which has no width
    to predict).
    """
    used = usable_runs(runs, stage=options.stage)
    budgets = np.sort(used["budget_flops"].unique())
    if budgets.size < 3:
        return None
    held_out = float(budgets[-1])
    train = used[used["budget_flops"] < held_out]
    test = used[used["budget_flops"] == held_out]
    fit = fit_joint_law(train, options=dataclasses.replace(options, stage=None, n_bootstrap=0))
    error = fit.predict(test) - test["val_loss"].to_numpy(float)
    recurrences = sorted(int(r) for r in test["r"].unique())
    measured = optima.table
    measured = measured[measured["budget_flops"] == held_out].set_index("r") if not measured.empty else measured
    predicted = allocate(fit, [held_out], recurrences).set_index("r")
    rows = []
    for r in recurrences:
        row = {"r": r, "budget_flops": held_out, "L_pred": np.nan, "L_obs": np.nan, "L_obs_lo": np.nan,
               "L_obs_hi": np.nan, "loss_error": np.nan, "width_pred": np.nan, "width_obs": np.nan,
               "width_ratio": np.nan, "within": False}
        row.update(L_pred=predicted.loc[r, "loss"], width_pred=predicted.loc[r].get("width", np.nan))
        if r in measured.index and measured.loc[r, "status"] == "ok":
            cell = measured.loc[r]
            row.update(L_obs=cell["L_opt"], L_obs_lo=cell.get("L_lo", np.nan), L_obs_hi=cell.get("L_hi", np.nan),
                       width_obs=cell["width_opt"])
        row["loss_error"] = row["L_pred"] - row["L_obs"]
        row["width_ratio"] = row["width_pred"] / row["width_obs"]
        lo = np.nan_to_num(row["L_obs_lo"], nan=row["L_obs"]) - fit.rmse
        hi = np.nan_to_num(row["L_obs_hi"], nan=row["L_obs"]) + fit.rmse
        row["within"] = bool(lo <= row["L_pred"] <= hi)
        rows.append(row)
    return Backtest(held_out=held_out, fit=fit, cells=pd.DataFrame(rows),
                    runs_rmse=float(np.sqrt(np.mean(error ** 2))), runs_max_error=float(np.abs(error).max()),
                    n_held_out=len(test))
