"""What one fit of the joint law is given: the rows it fits (``fit_rows``), their arrays (``FitData``), and the
whole problem (``FitProblem``): the arrays, the box of bounds with any fixed parameter, and the options (Huber
delta, starts, iterations, bootstrap, seed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .frontier import pareto_frontier
from .isoflop import cell_optima
from .options import THETA, FitOptions
from .runs import usable_runs

CONTENT_ORDER = ("budget_flops", "r", "N_once", "N_rec", "tokens", "val_loss")  # what a fitted row is


@dataclass(frozen=True)
class FitData:
    """The arrays a fit works on, one entry per run."""

    r: np.ndarray
    n_once: np.ndarray
    n_rec: np.ndarray
    log_d: np.ndarray
    log_l: np.ndarray
    cell: np.ndarray   # integer code of the run's (budget, r) cell
    budget: np.ndarray
    trial: np.ndarray | None = None  # integer code of the trial a run comes from (a branch point: its trial's)

    @classmethod
    def from_runs(cls, runs: pd.DataFrame) -> "FitData":
        cells = runs.groupby(["budget_flops", "r"], sort=True).ngroup().to_numpy()
        trial = None
        if "run_id" in runs and "branch_of" in runs:
            trial = pd.factorize(runs["branch_of"].where(runs["branch_of"] != "", runs["run_id"]).astype(str))[0]
        return cls(r=runs["r"].to_numpy(float), n_once=runs["N_once"].to_numpy(float),
                   n_rec=runs["N_rec"].to_numpy(float), log_d=np.log(runs["tokens"].to_numpy(float)),
                   log_l=np.log(runs["val_loss"].to_numpy(float)), cell=cells,
                   budget=runs["budget_flops"].to_numpy(float), trial=trial)

    @property
    def n_runs(self) -> int:
        return int(self.r.size)

    @property
    def n_cells(self) -> int:
        return int(self.cell.max()) + 1


@dataclass(frozen=True, eq=False)
class FitProblem:
    """One fit: the runs' arrays, the box ``lower <= theta <= upper`` in THETA order (a fixed phi has
    lower = upper) and the options that say how to fit."""

    data: FitData
    lower: np.ndarray
    upper: np.ndarray
    options: FitOptions

    @classmethod
    def of(cls, data: FitData, options: FitOptions) -> "FitProblem":
        """The problem of ``data`` in the bounds of ``options``, phi held at ``options.fix_phi`` if set."""
        lower, upper = options.bounds.arrays()
        if options.fix_phi is not None:
            lower[5] = upper[5] = options.fix_phi
        return cls(data=data, lower=lower, upper=upper, options=options)

    @property
    def free(self) -> np.ndarray:
        """Which parameters the fit may move (their bounds differ)."""
        return self.upper > self.lower

    @property
    def n_free(self) -> int:
        return int(self.free.sum())

    def random_starts(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` starts drawn uniformly in the box, (count, 6)."""
        return self.lower + (self.upper - self.lower) * rng.random((count, len(THETA)))


def with_overrides(options: FitOptions, overrides: dict[str, Any]) -> FitOptions:
    """``options`` with some fields replaced; an unknown field is a ValueError."""
    try:
        return dataclasses.replace(options, **overrides)
    except TypeError as err:
        raise ValueError(f"unknown fit option: {err}") from None


def fit_rows(runs: pd.DataFrame, options: FitOptions) -> pd.DataFrame:
    """The rows a fit uses: usable runs, or their per-r frontier, or their per-cell optima as pseudo-runs."""
    table = usable_runs(runs, stage=options.stage)
    if table.empty:
        raise ValueError("no usable runs to fit (none with status 'ok'"
                         + (f" in stage {options.stage!r})" if options.stage else ")"))
    if options.data == "frontier":
        table = pareto_frontier(table, per_r=True, overall=False, stage=None)
    elif options.data == "optima":
        optima = cell_optima(table, stage=None, n_bootstrap=0).table
        if optima.empty or not (optima["status"] == "ok").any():
            raise ValueError("no (budget, r) cell has an interior IsoFLOP optimum to fit")
        optima = optima[optima["status"] == "ok"]
        table = pd.DataFrame({"r": optima["r"], "budget_flops": optima["budget_flops"],
                              "N_once": optima["N_once_opt"], "N_rec": optima["N_rec_opt"],
                              "tokens": optima["D_opt"], "val_loss": optima["L_opt"]})
    # rows in an order of their content, not of the store's (MLflow returns runs in an order that differs between
    # two sweeps of the same trials): the seeded bootstrap then draws the same resamples from the same runs
    return table.sort_values(list(CONTENT_ORDER), kind="mergesort").reset_index(drop=True)
