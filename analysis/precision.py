"""How precisely a design of runs measures phi, forecast from simulated copies of its final-loss table.

Each copy is one runs table with the same points (budget, r, N_once, N_rec, D; ``loopscale plan --precision``
draws its losses from a law plus noise) fitted exactly as ``loopscale analyze`` fits a sweep: the joint fit
(``fit.fit_joint_law``, no bootstrap: the profile interval is the verdict's) and phi's profile interval with its
F tests against phi = 0 and phi = 1 (``profile_interval.profile_phi``). Over the copies:

* the half-width of phi's interval, (high - low) / 2: its median and 80% range;
* the power to reject phi = 0 (and phi = 1): the share of copies whose verdict tells phi from it, those whose
  test rejects at 1 - confidence and whose phi is identified (its interval one stretch inside the fit's bounds:
  ``Profile.identified``). Where the truth is 0 (or 1) it is the test's size, nominally 1 - confidence. A copy
  whose interval splits into stretches (a sweep without r = 1 runs can fit a negative phi and a positive one
  alike) has a wide hull and a test that may reject 0 and 1 both; its verdict is "not identified", so it counts
  in no power, and the share of such copies is reported.

Delta-phi against a baseline: each pair of copies (baseline, variant) is fitted as one model with a shared base
law (``delta.fit_shared_base``); its profile interval's half-width, and the power of its test of Delta = 0.

Monte Carlo error: a share p from n copies is uncertain by sqrt(p (1 - p) / n); the median half-width by the
standard deviation of the median over ``MC_RESAMPLES`` bootstrap resamples of the copies (seeded).

The noise to simulate with can be measured on a pilot sweep (``measured_noise``): its residuals from its own
joint fit, split into an offset shared by each (budget, r) cell and a scatter within cells.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .delta import fit_shared_base
from .fit import fit_joint_law
from .fit_problem import FitData, fit_rows
from .fit_types import LawFit
from .options import FitOptions
from .profile_interval import profile_phi, theta_of

MC_RESAMPLES = 500  # bootstrap resamples of the copies for the median's Monte Carlo error


def quick_options(options: FitOptions) -> FitOptions:
    """``options`` without the bootstrap: a forecast reads the profile interval, which needs none."""
    return dataclasses.replace(options, n_bootstrap=0, fix_phi=None)


def phi_interval(runs: pd.DataFrame, options: FitOptions) -> tuple[float, float, float, float, bool]:
    """(low, high, p against phi = 0, p against phi = 1, identified) of ``runs``' joint fit, as ``analyze`` reports
    them: the hull of phi's interval, its tests, and whether that interval is one stretch inside the bounds."""
    options = quick_options(options)
    fit = fit_joint_law(runs, options=options)
    shape = profile_phi(FitData.from_runs(fit_rows(runs, options)), theta_of(fit), fit.huber, options)
    lo, hi = shape.ci
    return lo, hi, shape.p(0.0), shape.p(1.0), shape.identified


def _median_error(values: np.ndarray, seed: int) -> float:
    """Monte Carlo standard error of the median of ``values``, by bootstrap."""
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, size=(MC_RESAMPLES, len(values))), axis=1)
    return float(np.std(medians))


def share_error(share: float, n: int) -> float:
    """Monte Carlo standard error of a share from ``n`` copies."""
    return float(np.sqrt(share * (1 - share) / n)) if n else float("nan")


@dataclass(frozen=True, eq=False)
class Forecast:
    """One design's simulated intervals: per copy, the half-width and the p-values of the tests it reports."""

    half_widths: np.ndarray
    p_values: dict[str, np.ndarray]   # test name ("phi = 0", "Delta = 0", ...) -> p per copy
    confidence: float
    identified: np.ndarray            # per copy, whether its interval is one stretch inside the bounds

    @property
    def n(self) -> int:
        return len(self.half_widths)

    @property
    def median(self) -> float:
        return float(np.median(self.half_widths))

    @property
    def median_error(self) -> float:
        return _median_error(self.half_widths, seed=0)

    @property
    def range80(self) -> tuple[float, float]:
        lo, hi = np.percentile(self.half_widths, [10, 90])
        return float(lo), float(hi)

    def power(self, test: str) -> float:
        """The share of copies whose verdict rejects ``test``: identified, and the test rejects at 1 - confidence."""
        return float(np.mean((self.p_values[test] <= 1 - self.confidence) & self.identified))

    @property
    def unidentified(self) -> float:
        """The share of copies whose interval splits into stretches or reaches a bound: their verdict is "not
        identified"."""
        return float(np.mean(~self.identified))


def forecast_phi(copies: Iterable[pd.DataFrame], options: FitOptions) -> Forecast:
    """Phi's interval over simulated ``copies`` of a runs table (each with its own ``val_loss``)."""
    rows = np.array([phi_interval(runs, options) for runs in copies])
    return Forecast(half_widths=(rows[:, 1] - rows[:, 0]) / 2, confidence=options.confidence,
                    p_values={"phi = 0": rows[:, 2], "phi = 1": rows[:, 3]}, identified=rows[:, 4].astype(bool))


def forecast_delta(pairs: Iterable[tuple[pd.DataFrame, pd.DataFrame]], options: FitOptions) -> Forecast:
    """Delta-phi's interval over simulated (baseline, variant) ``pairs``, each fitted as one shared-base model."""
    options = quick_options(options)
    rows = []
    for runs_a, runs_b in pairs:
        shared = fit_shared_base(runs_a, runs_b, fit_joint_law(runs_a, options=options),
                                 fit_joint_law(runs_b, options=options), options)
        rows.append(((shared.ci[1] - shared.ci[0]) / 2, shared.p_zero, shared.profile.identified))
    rows = np.array(rows)
    return Forecast(half_widths=rows[:, 0], p_values={"Delta = 0": rows[:, 1]}, confidence=options.confidence,
                    identified=rows[:, 2].astype(bool))


def measured_noise(fit: LawFit, runs: pd.DataFrame, options: FitOptions) -> tuple[float, float]:
    """(scatter within cells, sd of the cells' offsets), nats, of ``runs``' residuals from ``fit`` (observed minus
    the law's loss). Method of moments: the pooled within-cell variance s_w^2 (n - cells degrees of freedom); the
    offsets' variance is the variance of the cell means less the share of s_w^2 each mean carries, mean of
    s_w^2 / n_c, floored at 0. A misspecification of the law's form shows up in both."""
    data = FitData.from_runs(fit_rows(runs, options))
    law = fit.law
    error = np.exp(data.log_l) - np.asarray(law.loss(data.n_once, data.n_rec, data.r, np.exp(data.log_d)))
    table = pd.DataFrame({"cell": data.cell, "e": error})
    groups = table.groupby("cell")["e"]
    n_c, means = groups.size().to_numpy(float), groups.mean().to_numpy()
    dof = data.n_runs - len(n_c)
    within = float(((table["e"] - groups.transform("mean")) ** 2).sum() / dof) if dof > 0 else 0.0
    between = float(np.var(means, ddof=1) - np.mean(within / n_c)) if len(n_c) > 1 else 0.0
    return float(np.sqrt(within)), float(np.sqrt(max(between, 0.0)))
