"""Phi's profile-likelihood interval and the nested-fit F test it shares with the tests against phi = 0 and 1.

The profile holds phi at a value p, refits the other five constants, and records the objective the joint fit
minimises (the summed Huber loss of log L, ``analysis.fit_objective``), f(p). Against the best fit f_min (k = 6
free constants, n rows) a held phi is a nested model with one restriction, tested by

    F(p) = (f(p) - f_min) / s,   s = sum_i psi(u_i)^2 / (n - k) / (2 * mean_i psi'(u_i)),   F ~ F(1, n - k)

where u_i are the best fit's residuals of log L, psi = clip(u, -delta, delta) the Huber derivative and psi' its
slope (1 inside delta, 0 outside). Where every residual lies inside delta the objective is SS/2 and F is the
classical F = (SS_p - SS) / (SS / (n - k)) of nested least squares; beyond delta, s is the Huber dispersion of
the drop-in-dispersion test of M-estimators (Ronchetti 1982; Hampel et al. 1986, ch. 7.3), so F keeps its scale.
The slope's mean counts the residuals inside delta less the k the fit pins there: a fit whose residuals mostly
lie beyond delta (L1-like, as the demo's do: 0.03 nats against delta = 1e-3) passes through about k runs, as a
least-absolute-deviations fit passes through k points, and counting those made s 4.7 times too small on the demo's
27-run design (coverage 71% with independent noise); so mean psi' = max(#inside - k, 1) / (n - k), which is 1
where every residual lies inside. Then s is multiplied by the design effect of the cells' shared offsets
(``analysis.overdispersion``), 1 where the residuals show none: the same rule for phi's interval, its tests
against 0 and 1, and Delta-phi's, all through ``NestedTest.at``.

The interval at confidence c is {p : P(F(1, n - k) > F(p)) > 1 - c}, the values of phi the test does not reject.
The tests against phi = 0 and phi = 1 are the same function at p = 0 and p = 1, both points of the profile's
grid: the interval excludes 0 exactly when the test against 0 rejects at level 1 - c, and likewise for 1.
The grid's crossings of the level are refined by zooming in (each bracket cut in ``ZOOM_STEPS``, the bracket
that still holds the crossing cut again, ``REFINE_LEVELS`` times), and so is the lowest point's stretch. The
interval is the accepted points' stretches (``stretches``): one for a single-valley profile; a profile with two
valleys (a sweep without r = 1 runs can fit a negative phi and a positive one alike) accepts two, with values
between them rejected, so their hull (``ci``) would hold values, 0 perhaps among them, that the test rejects.

Every stage fits all its points at once, as one batch of fixed-value fits (``analysis.optimize``; each point its
own problem): the grid from the joint optimum, then each point again from its neighbours' optima until no
point improves (the profile moves smoothly with its value, so a neighbour's optimum is a good start where the
joint optimum is far), then each zoom from the points around it. A sequence of single fits, each warm from the
last, reached the same profile point for point at tens of times the time, its steps being Python's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from .fit_objective import unweighted_objective
from .fit_problem import FitData, FitProblem
from .fit_types import LawFit
from .law_jacobian import log_loss, log_loss_jacobian
from .optimize import BatchObjective, minimize_batch
from .options import FitOptions
from .overdispersion import design_effect

GRID_STEP = 0.125     # the grid's spacing in the held constant (48 steps over the paper's phi in [-3, 3])
ZOOM_STEPS = 8        # a zoom cuts its bracket in this many: 7 new points
REFINE_LEVELS = 3     # zooms per crossing and at the minimum: 0.125 / 8^3 ~ 2.4e-4
NEIGHBOUR_PASSES = 8  # rounds of restarting every grid point from its neighbours' optima, at most
FREE_CONSTANTS = 6

# (data, values of phi (m,), warm starts (m, 6), options) -> (thetas (m, 6), objectives (m,)) with phi held at each
FixedPhiFitter = Callable[[FitData, np.ndarray, np.ndarray, FitOptions], tuple[np.ndarray, np.ndarray]]
# (values held (m,), warm starts (m, 6)) -> (thetas (m, 6), objectives (m,)) with the constant held at each
PointFitter = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def fit_at_phi(data: FitData, phis: np.ndarray, warm: np.ndarray, options: FitOptions) -> tuple[np.ndarray, np.ndarray]:
    """The fits with phi held at each of ``phis``, from the starts ``warm``: the fixed-phi fits the profile calls."""
    problem = FitProblem.of(data, dataclasses.replace(options, fix_phi=None))
    return held_fits(unweighted_objective(data, options.delta), problem.lower, problem.upper, 5, phis, warm,
                     options.max_iter)


def held_fits(fun: BatchObjective, lower: np.ndarray, upper: np.ndarray, index: int | None, values: np.ndarray,
              warm: np.ndarray, max_iter: int) -> tuple[np.ndarray, np.ndarray]:
    """m fits as one batch, fit i from ``warm[i]`` with theta[``index``] held at ``values[i]`` (None: a constant
    held outside theta, which ``fun`` reads from its row): (thetas (m, 6), objectives (m,)). Each fit is its own
    problem, so none is pruned against another."""
    m = len(values)
    lower, upper = np.tile(lower, (m, 1)), np.tile(upper, (m, 1))
    if index is not None:
        lower[:, index] = upper[:, index] = values
    result = minimize_batch(fun, np.asarray(warm, dtype=float), lower, upper, max_iter=max_iter,
                            groups=np.arange(m))
    return result.x, result.f


def theta_of(fit: LawFit) -> np.ndarray:
    """A fit's constants as theta (a, alpha, b, beta, e, phi), ``options.THETA``'s order."""
    return np.array([np.log(fit.A), fit.alpha, np.log(fit.B), fit.beta, np.log(fit.E), fit.phi])


def grid_of(bounds: tuple[float, float], *points: float) -> np.ndarray:
    """``GRID_STEP``-spaced values from bound to bound, with ``points`` (those within the bounds) added."""
    lo, hi = bounds
    steps = int(round((hi - lo) / GRID_STEP))
    return np.unique(np.concatenate([np.linspace(lo, hi, steps + 1), [p for p in points if lo <= p <= hi]]))


@dataclass(frozen=True)
class NestedTest:
    """The F test of a fit with one constant held against the best fit: its objective ``f_min``, the Huber
    dispersion ``scale`` of the best fit's residuals (with the cells' design effect) and the residual degrees of
    freedom ``dof``; ``design_effect``, the factor of the cells' shared offsets already in ``scale``."""

    f_min: float
    scale: float
    dof: int
    design_effect: float = 1.0

    @classmethod
    def at(cls, data: FitData, theta: np.ndarray, f_min: float, delta: float,
           n_free: int = FREE_CONSTANTS) -> "NestedTest":
        """The test against the best fit ``theta`` (objective ``f_min``, ``n_free`` constants) of ``data``."""
        u = log_loss(theta[None], data.r, data.n_once, data.n_rec, data.log_d)[0] - data.log_l
        psi = np.clip(u, -delta, delta)
        dof = max(data.n_runs - n_free, 1)
        # the runs the fit pins inside delta do not count toward the slope; at least one counts, or F is infinite
        inside = max(int((np.abs(u) <= delta).sum()) - n_free, 1) / dof
        jacobian = log_loss_jacobian(theta, data.r, data.n_once, data.n_rec, data.log_d)
        factor = design_effect(psi, jacobian, data.cell, n_free)
        return cls(f_min=f_min, scale=float((psi ** 2).sum() / dof / (2 * inside)) * factor,
                   dof=data.n_runs - n_free, design_effect=factor)

    def statistic(self, f_restricted: float) -> float:
        return max(f_restricted - self.f_min, 0.0) / self.scale if self.scale > 0 else 0.0

    def p(self, f_restricted: float) -> float:
        """P(F(1, dof) > F) of a fit with one constant held whose objective is ``f_restricted``."""
        if self.dof <= 0:
            return 1.0
        return float(stats.f.sf(self.statistic(f_restricted), 1, self.dof))


@dataclass(frozen=True, eq=False)
class Profile:
    """The profile of the objective over one held constant, its test and the interval the test leaves."""

    values: np.ndarray       # sorted grid, refined crossings and the refined minimum
    f: np.ndarray            # the objective with the constant held at each
    thetas: np.ndarray       # (len(values), 6) the other constants' optimum at each
    test: NestedTest
    confidence: float
    bounds: tuple[float, float]

    @property
    def best(self) -> float:
        """The held value of the lowest objective: the joint optimum's."""
        return float(self.values[int(np.argmin(self.f))])

    def p(self, value: float) -> float:
        """The test's p-value of the constant = ``value``, a point of the profile."""
        hit = np.flatnonzero(np.isclose(self.values, value, rtol=0, atol=1e-12))
        if not hit.size:
            raise ValueError(f"{value} is not a point of the profile")
        return self.test.p(float(self.f[hit[0]]))

    @property
    def accepted(self) -> np.ndarray:
        return np.array([self.test.p(f) > 1 - self.confidence for f in self.f])

    @property
    def ci(self) -> tuple[float, float]:
        """The hull of the values the test does not reject (of ``stretches``, where it accepts several)."""
        parts = self.stretches
        return (parts[0][0], parts[-1][1]) if parts else (np.nan, np.nan)

    @property
    def stretches(self) -> tuple[tuple[float, float], ...]:
        """The interval: each run of values the test does not reject, (low, high), in order; one for a
        single-valley profile. Between two stretches the test rejects, so their hull is no interval of it."""
        accepted = np.concatenate([[False], self.accepted, [False]]).astype(int)
        starts, ends = np.flatnonzero(np.diff(accepted) == 1), np.flatnonzero(np.diff(accepted) == -1) - 1
        return tuple((float(self.values[a]), float(self.values[b])) for a, b in zip(starts, ends))

    @property
    def segments(self) -> int:
        """How many separate stretches the test accepts (1 for a single-valley profile)."""
        return len(self.stretches)

    @property
    def identified(self) -> bool:
        """Whether the interval lets a verdict tell the constant from a value: one stretch, reaching no bound."""
        return self.segments == 1 and not self.reaches

    @property
    def reaches(self) -> tuple[float, ...]:
        """The bounds the interval reaches: the data do not bound the constant on that side."""
        lo, hi = self.ci
        return tuple(b for b, end in zip(self.bounds, (lo, hi)) if np.isfinite(end) and end == b)

    def table(self) -> pd.DataFrame:
        """The value held, the objective there, F and p, whether the test accepts it."""
        return pd.DataFrame({"value": self.values, "objective": self.f,
                             "F": [self.test.statistic(f) for f in self.f],
                             "p": [self.test.p(f) for f in self.f], "accepted": self.accepted})


def profile(fit_at: PointFitter, grid: np.ndarray, theta_hat: np.ndarray, f_hat: float, centre: float,
            test_of: Callable[[float, np.ndarray, float], NestedTest], confidence: float, *,
            known: dict[float, float] | None = None) -> Profile:
    """The profile of a held constant over ``grid`` (its bounds are the grid's ends), from a fit ``theta_hat``
    (objective ``f_hat``) at the value ``centre``. The grid is fitted from ``theta_hat``, then each point from its
    neighbours' optima while that lowers any; the lowest point's stretch is zoomed into for the minimum;
    ``test_of(value, theta, f_min)`` builds the test against that optimum; the crossings of the test's level
    are zoomed into. ``known``: objectives of fits already made at some values: a point keeps the lower of its
    own fit and the known one."""
    known = known or {}
    thetas: dict[float, np.ndarray] = {}
    values: dict[float, float] = {}

    def fit(points: list[float], warm: list[np.ndarray]) -> bool:
        """Fit ``points`` (repeats allowed) from ``warm``; each keeps its lowest objective. Whether any fell."""
        fitted, f = fit_at(np.array(points), np.array(warm))
        fell = False
        for value, theta, objective in zip(points, fitted, f):
            objective, before = min(float(objective), known.get(value, np.inf)), values.get(value, np.inf)
            if objective < before:
                # a fall of a billionth is rounding, not a better basin: it does not call for another pass
                fell |= np.isfinite(before) and objective < before - 1e-9 * abs(before)
                thetas[value], values[value] = theta, objective
        return fell

    points = [float(v) for v in grid]
    fit(points, [theta_hat] * len(points))
    for _ in range(NEIGHBOUR_PASSES):
        pairs = [(points[i], thetas[points[j]]) for i in range(len(points)) for j in (i - 1, i + 1)
                 if 0 <= j < len(points)]
        if not fit([v for v, _ in pairs], [w for _, w in pairs]):
            break
    lowest = int(np.argmin([values[v] for v in points]))

    def around_lowest(cut: list[float]) -> tuple[float, float]:
        i = int(np.argmin([values[v] for v in cut]))
        return cut[max(i - 1, 0)], cut[min(i + 1, len(cut) - 1)]

    zoom(fit, thetas, [around_lowest(points[max(lowest - 1, 0):lowest + 2])], around_lowest)
    best = min(values, key=values.get)
    theta_best, f_min, at = (thetas[best], values[best], best) if values[best] < f_hat else (theta_hat, f_hat, centre)
    test = test_of(at, theta_best, float(f_min))
    level = 1 - confidence

    def accepted(value: float) -> bool:
        return test.p(values[value]) > level

    def crossing(cut: list[float]) -> tuple[float, float]:
        return next((a, b) for a, b in zip(cut[:-1], cut[1:]) if accepted(a) != accepted(b))

    zoom(fit, thetas, [(a, b) for a, b in zip(points[:-1], points[1:]) if accepted(a) != accepted(b)], crossing)
    held = np.array(sorted(values))
    return Profile(values=held, f=np.array([values[v] for v in held]), thetas=np.array([thetas[v] for v in held]),
                   test=test, confidence=confidence, bounds=(float(grid[0]), float(grid[-1])))


def zoom(fit: Callable[[list[float], list[np.ndarray]], bool], thetas: dict[float, np.ndarray],
         brackets: list[tuple[float, float]], inside: Callable[[list[float]], tuple[float, float]]) -> None:
    """``REFINE_LEVELS`` times: cut each bracket (a, b) in ``ZOOM_STEPS`` (all brackets' new points fitted in one
    batch, each from the nearer end's optimum) and go on in the part ``inside(cut)`` names: the sub-bracket
    holding a crossing, or the neighbours of the lowest point."""
    for _ in range(REFINE_LEVELS):
        brackets = [(a, b) for a, b in brackets if b > a]
        if not brackets:
            return
        cuts = [[float(v) for v in np.linspace(a, b, ZOOM_STEPS + 1)] for a, b in brackets]
        inner = [(v, thetas[a] if v - a <= b - v else thetas[b]) for (a, b), cut in zip(brackets, cuts)
                 for v in cut[1:-1]]
        fit([v for v, _ in inner], [w for _, w in inner])
        brackets = [inside(cut) for cut in cuts]


def profile_phi(data: FitData, theta_hat: np.ndarray, f_hat: float, options: FitOptions, *,
                known: dict[float, float] | None = None, fitter: FixedPhiFitter = fit_at_phi) -> Profile:
    """The profile of ``data``'s objective over phi around the joint optimum ``theta_hat`` (objective
    ``f_hat``), on a grid over phi's bounds that holds 0, 1 and the fitted phi. ``known``: objectives of fits
    already made at some phi (the suite's phi = 0 and phi = 1)."""
    phi_hat = float(np.clip(theta_hat[5], *options.bounds.phi))
    return profile(lambda phi, warm: fitter(data, phi, warm, options), grid_of(options.bounds.phi, 0.0, 1.0, phi_hat),
                   theta_hat, f_hat, phi_hat, lambda _, theta, f: NestedTest.at(data, theta, f, options.delta),
                   options.confidence, known=known)
