"""At matched loss: one loss -> accuracy curve per axis across every r, and what a recurrence buys beyond it.

Downstream accuracy follows validation loss along a sigmoid (Bhagia et al., "Establishing Task Scaling Laws via
Compute-Efficient Model Ladders", arXiv 2412.04403, 2024). Per axis, with c its chance score, every kept model i
(its loss L_i at its trained r_i, its score a_i with standard error s_i over items) enters one fit

    a_i = c + (1 - c) sigmoid(u + v (L_i - Lbar)) + delta_{r_i},    delta_ref = 0

weighted least squares in 1 / s_i^2 over u, v and one shift delta_r per r other than the reference (r = 1 where
it ran): delta_r is the accuracy r buys beyond what its loss predicts. Its standard error is the Gauss-Newton
one, (J^T W J)^-1, scaled by the residuals' dispersion chi^2 / dof (dof = models - parameters; quasi-likelihood,
McCullagh & Nelder 1989, ch. 9), which the models themselves estimate, so it absorbs the spread between models
that items do not explain (training seeds, a curve not quite sigmoid); the interval is delta_r +- t_{dof} se,
and the verdict reads from it, so the two cannot disagree: an interval
excluding 0 says r moves accuracy more (or less) than its loss predicts, one holding 0 cannot tell from none.
With fewer models than parameters + 1, or scores all alike (every model at 0, say), there is no test, and the
verdict says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import expit
from scipy.stats import t as student

from .compute import reference_r

SE_FLOOR = 1e-3  # a score's standard error is at least this (a fraction), so one model never takes all weight
STARTS = (-8.0, 0.0, 8.0)  # slopes v (per nat) the fit starts from; the best end is kept


@dataclass(frozen=True)
class Shift:
    """delta at matched loss of one ``level`` (an r, or a design) against the reference (a fraction), its
    interval, the fit's dof, and its verdict clause."""

    level: int
    shift: float
    ci: tuple[float, float]
    dof: int

    @property
    def verdict(self) -> str:
        if self.ci[0] > 0:
            return "more than its loss predicts"
        if self.ci[1] < 0:
            return "less than its loss predicts"
        return "cannot tell from none"


@dataclass(frozen=True)
class LossCurve:
    """The fitted curve of one axis: chance, the sigmoid's u, v and centre Lbar, the shifts and the reference
    level."""

    chance: float
    u: float
    v: float
    centre: float
    shifts: dict[int, Shift]
    reference: int
    models: int

    def accuracy(self, loss: np.ndarray, r: int | None = None) -> np.ndarray:
        """The fitted accuracy at ``loss`` (of the reference r, or plus r's shift)."""
        delta = self.shifts[r].shift if r in self.shifts else 0.0
        return self.chance + (1 - self.chance) * expit(self.u + self.v * (np.asarray(loss) - self.centre)) + delta


def fit_loss_curve(trained: pd.DataFrame, confidence: float = 0.95, by: str = "r") -> LossCurve | None:
    """The curve of one axis from its models at their trained r (module docstring), with a shift per value of the
    column ``by`` (r; or a design, analysis/downstream/designs.py) but its reference (r: ``reference_r``; else the
    smallest); None when there is no test (models <= parameters, or every model scored the same)."""
    ref = reference_r(trained) if by == "r" else int(trained[by].min())
    others = sorted(int(r) for r in trained[by].unique() if r != ref)
    loss, score = trained["loss"].to_numpy(float), trained["score"].to_numpy(float)
    sigma = np.maximum(trained["se"].fillna(SE_FLOOR).to_numpy(float), SE_FLOOR)
    chance = float(np.nanmean(trained["chance"])) if trained["chance"].notna().any() else 0.0
    design = np.array([[float(r == o) for o in others] for r in trained[by]]).reshape(len(trained), len(others))
    dof = len(trained) - 2 - len(others)
    if dof < 1 or np.ptp(score) == 0:  # too few models, or all alike (every one at 0, say): nothing to weigh
        return None
    centre = float(loss.mean())

    def residuals(p: np.ndarray) -> np.ndarray:
        return (chance + (1 - chance) * expit(p[0] + p[1] * (loss - centre)) + design @ p[2:] - score) / sigma

    level = np.clip((score.mean() - chance) / (1 - chance), 0.02, 0.98)
    lower = [-15.0, -200.0] + [-1.0] * len(others)
    upper = [15.0, 200.0] + [1.0] * len(others)
    fits = [least_squares(residuals, [math.log(level / (1 - level)), v] + [0.0] * len(others), bounds=(lower, upper))
            for v in STARTS]
    best = min(fits, key=lambda f: f.cost)
    dispersion = 2 * best.cost / dof
    cov = dispersion * np.linalg.pinv(best.jac.T @ best.jac)
    quantile = float(student.ppf(0.5 + confidence / 2, dof))
    shifts = {}
    for k, r in enumerate(others):
        delta, se = float(best.x[2 + k]), math.sqrt(max(cov[2 + k, 2 + k], 0.0))
        shifts[r] = Shift(level=r, shift=delta, ci=(delta - quantile * se, delta + quantile * se), dof=dof)
    return LossCurve(chance=chance, u=float(best.x[0]), v=float(best.x[1]), centre=centre, shifts=shifts,
                     reference=ref, models=len(trained))
