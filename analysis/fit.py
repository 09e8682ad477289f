"""Fitting the iso-depth joint law with phi, the paper's way (Schwethelm et al. 2026, arXiv 2604.21106).

The law (``model.law``)::

    L = E + A * N_eff^(-alpha) + B * D^(-beta),   N_eff = N_once + r^phi * N_rec

fitted in log-sum-exp form by the summed Huber loss of its log (``analysis.fit_objective``) within the paper's
bounds: a, b in [-5, 35]; alpha, beta in [0, 2.5]; e in [-3, 2]; phi in [-3, 3] (``analysis.options``). The
paper takes the best of 500 random starts; here the starts come from variable projection (``analysis.projection``):
on a grid over the exponents (alpha, beta, phi) the law is linear in (E, A, B), solved at every grid point, and
the grid's local minima (at most ``n_starts``, best first) are the starts. The uncertainty is a bootstrap, block or
residual by the design's cells (``analysis.bootstrap``).

All starts run as one batch (``analysis.optimize``) on the analytic gradient of the exact objective; the best
start is then polished by scipy's L-BFGS-B. The returned ``LawFit`` says whether the optimum is trustworthy:
``status`` is STOPPED_EARLY when the projected gradient at the answer is still large, AT_BOUND when a free
parameter sits on its bound.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from .bootstrap import Resamples, refit_resamples
from .fit_objective import objective, unweighted_objective
from .fit_problem import FitData, FitProblem, fit_rows, with_overrides
from .fit_types import CONSTANTS, FitStatus, LawFit, constants_of, law_of
from .optimize import Stop, minimize_batch
from .options import DEFAULT_FIT_OPTIONS, THETA, FitOptions
from .projection import grid_starts


def fit_joint_law(runs: pd.DataFrame, *, options: FitOptions = DEFAULT_FIT_OPTIONS, **overrides: Any) -> LawFit:
    """Fit the joint law to a runs table (``analysis.load_runs``); keyword overrides replace ``options`` fields.

    Only rows with status "ok" (and of ``options.stage``) are fitted; ``options.data`` picks all of them, the
    per-r Pareto frontier or the per-cell IsoFLOP optima.

    Runs of a single r cannot identify phi (at one r, r^phi N_rec is a constant multiple of N_rec, which A
    absorbs in an iso-depth sweep): unless phi is fixed, they are fitted as the plain Chinchilla law
    L = E + A N^-alpha + B D^-beta with N = N_once + N_rec (phi held at 0), and the fit's ``single_r`` says so.
    """
    problem, single_r = joint_problem(runs, with_overrides(options, overrides))
    options = problem.options
    main = minimize_batch(unweighted_objective(problem.data, options.delta), grid_starts(problem, options.n_starts),
                          problem.lower, problem.upper, max_iter=options.max_iter)
    best = int(np.argmin(main.f))
    theta, f_best = polish(problem, main.x[best], main.f[best])
    at_best = int((main.f <= f_best * (1 + 1e-6) + 1e-12).sum())
    resamples = refit_resamples(problem, theta, main, np.random.default_rng(options.seed))
    fit = _summarise(problem, theta, f_best, Stop(main.stop[best]), (at_best, len(main.f)), resamples)
    return dataclasses.replace(fit, single_r=single_r) if single_r is not None else fit


class TooFewRuns(ValueError):
    """The runs are too few to determine the law's free parameters."""


def joint_problem(runs: pd.DataFrame, options: FitOptions) -> tuple[FitProblem, int | None]:
    """The problem ``fit_joint_law`` solves on ``runs``, and the one r of a single-r table (None otherwise), whose
    problem holds phi at 0. ``TooFewRuns`` when the rows are too few for the free parameters."""
    data = FitData.from_runs(fit_rows(runs, options))
    single_r = int(data.r[0]) if np.unique(data.r).size == 1 and options.fix_phi is None else None
    if single_r is not None:
        options = dataclasses.replace(options, fix_phi=0.0)
    problem = FitProblem.of(data, options)
    if data.n_runs <= problem.n_free:
        raise TooFewRuns(f"{data.n_runs} runs cannot determine {problem.n_free} free parameters")
    return problem, single_r


def refit(data: FitData, previous: np.ndarray | None, *, n_starts: int = 4, seed: int = 0, max_iter: int = 300,
          options: FitOptions = DEFAULT_FIT_OPTIONS) -> tuple[np.ndarray, float]:
    """A cheap refit for a search that refits after every trial: (theta in THETA order, objective).

    Warm start: the previous optimum (None before the first fit) plus ``n_starts`` seeded random starts in
    the bounds, all in one ``minimize_batch`` call with pruning, and no bootstrap and no polish. One more run
    moves the optimum a little, so the previous optimum is usually where the best end lies; the random
    starts let the fit leave it when the new data have moved the optimum to another basin. (The full fit,
    ``fit_joint_law``, is what analysis reports.) ``max_iter`` bounds the iterations per start, and so the
    time of a refit.
    """
    problem = FitProblem.of(data, options)
    starts = problem.random_starts(n_starts, np.random.default_rng(seed))
    if previous is not None:
        starts = np.vstack([np.clip(previous, problem.lower, problem.upper), starts])
    result = minimize_batch(unweighted_objective(data, options.delta), starts, problem.lower, problem.upper,
                            max_iter=max_iter, prune_after=50)
    best = int(np.argmin(result.f))
    return result.x[best], float(result.f[best])


def polish(problem: FitProblem, theta: np.ndarray, f: float) -> tuple[np.ndarray, float]:
    """scipy's L-BFGS-B on the exact objective from ``theta`` (objective ``f``); keep whichever point is lower."""
    ones = np.ones((1, problem.data.n_runs))

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = objective(x[None], problem.data, ones, problem.options.delta)
        return float(value[0]), grad[0]

    result = minimize(fun, theta, jac=True, method="L-BFGS-B", bounds=list(zip(problem.lower, problem.upper)),
                      options={"maxiter": problem.options.max_iter, "ftol": 1e-15, "gtol": 1e-12})
    if np.isfinite(result.fun) and result.fun < f:
        return np.asarray(result.x), float(result.fun)
    return theta, float(f)


def _status(problem: FitProblem, theta: np.ndarray, best_stop: Stop,
            starts: tuple[int, int]) -> tuple[FitStatus, str, tuple[str, ...]]:
    """Whether the optimum ``theta`` is trustworthy: (status, message, the free parameters at a bound);
    ``starts``: (how many starts reached the optimum, how many ran)."""
    options, free = problem.options, problem.free
    width = np.where(free, problem.upper - problem.lower, 1.0)
    near = free & ((theta - problem.lower <= 1e-6 * width) | (problem.upper - theta <= 1e-6 * width))
    at_bound = tuple(THETA[i] for i in np.flatnonzero(near))
    _, grad = objective(theta[None], problem.data, np.ones((1, problem.data.n_runs)), options.delta)
    projected = float(np.abs(grad[0] * (free & ~near)).max())
    # The gradient of the summed Huber loss scales as n * delta; 1e-6 of that is a converged fit.
    tolerance = 1e-6 * problem.data.n_runs * options.delta
    if projected > tolerance:
        return (FitStatus.STOPPED_EARLY, f"projected gradient {projected:.2e} > {tolerance:.1e} "
                f"(best start stopped: {best_stop.name.lower()})", at_bound)
    if at_bound:
        return FitStatus.AT_BOUND, f"{', '.join(at_bound)} at a bound of {options.bounds}", at_bound
    return (FitStatus.CONVERGED,
            f"projected gradient {projected:.1e}; {starts[0]}/{starts[1]} starts reached the optimum", at_bound)


def _summarise(problem: FitProblem, theta: np.ndarray, f_best: float, best_stop: Stop, starts: tuple[int, int],
               resamples: Resamples) -> LawFit:
    """The ``LawFit`` of optimum ``theta``: its constants, fit quality, status and bootstrap intervals."""
    data, options = problem.data, problem.options
    constants = constants_of(theta[None])[0]
    law = law_of(theta)
    observed = np.exp(data.log_l)
    predicted = np.asarray(law.loss(data.n_once, data.n_rec, data.r, np.exp(data.log_d)))
    error = observed - predicted
    r2 = 1.0 - float((error ** 2).sum() / ((observed - observed.mean()) ** 2).sum())
    rmse_per_r = {int(r): float(np.sqrt(np.mean(error[data.r == r] ** 2))) for r in np.unique(data.r)}
    status, message, at_bound = _status(problem, theta, best_stop, starts)

    boot = constants_of(resamples.theta)
    tail = 100 * (1 - options.confidence) / 2
    if len(boot):
        lo, hi = np.percentile(boot, [tail, 100 - tail], axis=0)
    else:
        lo = hi = np.full(len(CONSTANTS), np.nan)
    ci = {name: (float(lo[i]), float(hi[i])) for i, name in enumerate(CONSTANTS)}
    return LawFit(**dict(zip(CONSTANTS, map(float, constants))), phi_ci=ci["phi"], ci=ci, r2=r2,
                  rmse=float(np.sqrt(np.mean(error ** 2))), rmse_per_r=rmse_per_r,
                  max_residual=float(np.abs(error).max()), huber=f_best, status=status, message=message,
                  at_bound=at_bound, fixed_phi=options.fix_phi, data=options.data, n_runs=data.n_runs,
                  n_cells=data.n_cells, n_shared_trials=resamples.n_shared_trials, n_starts=starts[1],
                  n_starts_at_best=starts[0], n_bootstrap=len(boot), interval=resamples.method,
                  bootstrap_stopped_early=resamples.stopped_early, confidence=options.confidence, bootstrap=boot)
