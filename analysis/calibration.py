"""The learning rate a calibration stage chooses: the loss fitted over log rate, its minimum with an interval, and
a winner claimed only where the trials tell it apart from the rate the spec started from.

With x = ln(rate) and the n trials that trained (x_i, L_i) at k >= 3 distinct rates, ordinary least squares fits

    L = a + b x + c x^2,

whose residual variance s^2 = RSS / (n - 3) is the trials' noise (their seeds, and what the parabola misses), with
V = s^2 (X'X)^-1 the covariance of (a, b, c). The fitted minimum x* = -b / (2c) has Fieller's interval (Fieller
1954, the interval for the stationary point of a quadratic response): every x0 at which the fitted slope
b + 2 c x0 is not significantly non-zero,

    (b + 2 c x0)^2 <= t^2 (V_bb + 4 x0 V_bc + 4 x0^2 V_cc),    t = Student's t quantile, n - 3 degrees of freedom,

a bounded interval exactly when the curvature c is significantly positive (c^2 > t^2 V_cc, c > 0); else the
trials cannot locate a minimum at all.

The choice: the rate the calibration starts from (the recipe's rate where it lies in [low, high], else the
log-middle: ``reference_rate``, the first rate a model-based calibration tries) stands unless the interval is
bounded, lies inside the rates tried, and excludes it; then the fitted minimum is claimed, with its interval.
Otherwise the trials cannot tell a winner from it, the line says so, and the rule picks the trained rate nearest
the reference (in log rate): a rule that reads no loss, so two seeds whose trials differ within their noise pick
the same rate. Fewer than four trained trials at three rates leave no noise to judge by: the same rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


def reference_rate(current: float | None, low: float, high: float) -> float:
    """The rate a calibration starts from: the recipe's ``current`` where it lies in [low, high], else the
    log-middle of [low, high]."""
    ok = current is not None and math.isfinite(current) and low <= current <= high
    return float(current) if ok else math.sqrt(low * high)


@dataclass(frozen=True)
class RateChoice:
    """The calibration's choice of ``param`` (module docstring)."""

    param: str
    rate: float  # the rate every search trial then uses
    claimed: bool  # the fitted minimum, told apart from the reference; else the rule's pick
    reference: float
    fitted: float | None = None  # exp(x*), where the parabola has a minimum
    ci: tuple[float, float] | None = None  # Fieller's interval of the minimum, where bounded
    noise: float | None = None  # the residual standard deviation s (nats)
    dof: int = 0
    trials: int = 0  # trials that trained
    why: str = ""  # why no winner was claimed

    def line(self) -> str:
        """One line: the rate, and whether the trials told it apart."""
        pct = f"{100 * CONFIDENCE:.0f}%"
        fit = "" if self.fitted is None else f"fitted minimum {self.fitted:.4g}"
        if self.fitted is not None:
            fit += (f" ({pct} CI {self.ci[0]:.4g} to {self.ci[1]:.4g})" if self.ci else
                    f" ({pct} CI unbounded)")
        noise = "" if self.noise is None else f"noise {self.noise:.4f} nats, {self.dof} dof"
        detail = "; ".join(part for part in (fit, noise) if part)
        if self.claimed:
            return (f"calibrated {self.param} = {self.rate:.4g}: the {fit}, told apart from the reference "
                    f"{self.reference:.4g} ({noise}); every search trial uses it")
        return (f"calibrated {self.param} = {self.rate:.4g}: the trials cannot tell a better rate from the "
                f"reference {self.reference:.4g} ({self.why}{'; ' + detail if detail else ''}), so the trained "
                "rate nearest it; every search trial uses it")

    def to_dict(self) -> dict:
        return {"param": self.param, self.param: self.rate, "ci": list(self.ci) if self.ci else None,
                "claimed": self.claimed, "reference": self.reference, "fitted_minimum": self.fitted,
                "noise": self.noise, "dof": self.dof, "trials": self.trials, "line": self.line()}


def choose_rate(param: str, rates: Sequence[float], losses: Sequence[float | None], reference: float) -> RateChoice:
    """The rate of ``param`` to search with, from the calibration trials' ``rates`` and ``losses`` (None or not
    finite: the trial did not train) and the ``reference`` rate (module docstring). Raises ValueError when no
    trial trained."""
    trained = [(float(r), float(v)) for r, v in zip(rates, losses) if v is not None and math.isfinite(v)]
    if not trained:
        raise ValueError("calibration: no trial trained without diverging")
    x = np.log([r for r, _ in trained])
    y = np.array([v for _, v in trained])
    nearest = min((r for r, _ in trained), key=lambda r: (abs(math.log(r / reference)), r))
    pick = {"param": param, "rate": nearest, "claimed": False, "reference": reference, "trials": len(trained)}
    dof = len(trained) - 3
    if len(np.unique(x)) < 3 or dof < 1:
        return RateChoice(**pick, why=f"trials trained: {len(trained)}, at {len(np.unique(x))} rates: no noise to "
                                       "judge by (it takes 4 trials at 3 rates)")
    design = np.column_stack([np.ones_like(x), x, x * x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    s2 = float(np.sum((y - design @ coef) ** 2)) / dof
    cov = s2 * np.linalg.inv(design.T @ design)
    _, b, c = coef
    t = float(stats.t.ppf(0.5 + CONFIDENCE / 2, dof))
    fitted = float(np.exp(-b / (2 * c))) if c > 0 else None
    pick.update(fitted=fitted, noise=math.sqrt(s2), dof=dof)
    if c <= 0:
        return RateChoice(**pick, why="the loss has no minimum over the rates tried")
    ci = _fieller(b, c, cov, t)
    if ci is None:
        return RateChoice(**pick, why="its curvature is within the noise")
    lo, hi = float(np.exp(ci[0])), float(np.exp(ci[1]))
    pick["ci"] = (lo, hi)
    if not (x.min() <= math.log(fitted) <= x.max()):
        return RateChoice(**pick, why="the fitted minimum lies beyond the rates tried: widen [calibrate] low/high")
    if lo <= reference <= hi:
        return RateChoice(**pick, why="the reference lies inside the fitted minimum's interval")
    return RateChoice(**{**pick, "rate": fitted, "claimed": True})


def _fieller(b: float, c: float, cov: np.ndarray, t: float) -> tuple[float, float] | None:
    """The x0 with (b + 2 c x0)^2 <= t^2 var(b + 2 c x0), where that set is a bounded interval, else None."""
    vbb, vbc, vcc = cov[1, 1], cov[1, 2], cov[2, 2]
    qa = 4 * (c * c - t * t * vcc)
    if c <= 0 or qa <= 0:
        return None
    qb = 4 * (b * c - t * t * vbc)
    qc = b * b - t * t * vbb
    root = math.sqrt(max(qb * qb - 4 * qa * qc, 0.0))  # >= 0: the set holds x* itself
    return (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)
