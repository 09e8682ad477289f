"""The variable-projection fitter (analysis.projection) against the paper's 500-start fit (tests/multistart.py):
the same optimum on simulated sweeps and the example runs tables; its exact non-negative least squares; the
profile of the objective over phi that analyze computes (analysis.profile_interval) against the fits."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import nnls

from loopscale.analysis import FitOptions, fit_joint_law, load_runs
from loopscale.analysis.fit import joint_problem
from loopscale.analysis.fit_types import CONSTANTS, constants_of
from loopscale.analysis.optimize import minimize_batch
from loopscale.analysis.profile_interval import profile_phi, theta_of
from loopscale.analysis.projection import exponent_grid, local_minima, nonnegative_least_squares
from multistart import multistart_fit
from test_analysis_sim import paper_runs
from test_fit import LAWS, NINE_CELLS
from test_runs_tables import tables  # noqa: F401 (the example runs tables, a fixture)

# (runs, options) pairs: the paper's grid with noise, phi free and held; nine cells (the residual bootstrap's
# shape); the example tables, single r (phi held at 0) and looped; a lopsided law without noise.
CASES = {
    "paper grid": (lambda t: paper_runs(noise=0.01), {}),
    "paper grid, phi = 1": (lambda t: paper_runs(noise=0.01), {"fix_phi": 1.0}),
    "nine cells": (lambda t: paper_runs(noise=0.01, **NINE_CELLS), {}),
    "single-r table": (lambda t: load_runs(t["single_r"]), {}),
    "looped table": (lambda t: load_runs(t["looped"]), {}),
    "steep law, phi = 1": (lambda t: paper_runs(LAWS["steep-N-flat-D"]), {"fix_phi": 1.0}),
}


@pytest.mark.parametrize("case", CASES)
def test_the_projected_fit_reaches_the_optimum_of_500_random_starts(case, tables):
    make, overrides = CASES[case]
    runs, options = make(tables), FitOptions(n_bootstrap=0, stage=None, **overrides)
    reference_theta, reference_f, _ = multistart_fit(runs, options)
    fit = fit_joint_law(runs, options=options)
    # equal or lower, up to the rounding of a sum of ~100 terms
    assert fit.huber <= reference_f * (1 + 1e-12) + 1e-24
    reference = constants_of(reference_theta[None])[0]
    np.testing.assert_allclose([getattr(fit, name) for name in CONSTANTS], reference, rtol=1e-4)
    assert fit.n_starts < 10 and fit.n_starts_at_best >= 1  # a few basins, not hundreds of starts


def test_a_single_r_grid_holds_phi_at_zero(tables):
    problem, single_r = joint_problem(load_runs(tables["single_r"]), FitOptions(stage=None))
    alphas, betas, phis = exponent_grid(problem)
    assert single_r == 1 and phis.tolist() == [0.0] and len(alphas) == len(betas) == 26


def test_local_minima_of_the_grid_one_per_flat_stretch():
    grid = np.array([[3.0, 1.0, 1.0, 2.0, 0.5],
                     [4.0, 2.0, 2.0, 2.0, 0.7]])
    assert np.argwhere(local_minima(grid, axes=(0, 1))).tolist() == [[0, 1], [0, 4]]
    # along the second axis alone, each row has its own
    assert np.argwhere(local_minima(grid, axes=(1,))).tolist() == [[0, 1], [0, 4], [1, 1], [1, 4]]


def test_nonnegative_least_squares_is_exact():
    """Against scipy's active-set NNLS, on random problems whose solutions have every support set, columns on
    scales twenty orders of magnitude apart."""
    rng = np.random.default_rng(0)
    gram, rhs, expected, scales = [], [], [], []
    for _ in range(300):
        scale = 10.0 ** rng.uniform(-10, 10, size=3)
        scales.append(scale)
        x = rng.normal(size=(30, 3)) * scale
        y = rng.normal(size=30) + x @ (rng.normal(size=3) / scale)
        gram.append(x.T @ x)
        rhs.append(x.T @ y)
        expected.append(nnls(x, y)[0])
    found = nonnegative_least_squares(np.array(gram), np.array(rhs))
    expected = np.array(expected)
    assert (found >= 0).all()
    # compared in the columns' own units (coefficient x column scale), where the solutions are of order 1
    np.testing.assert_allclose(found * scales, expected * scales, rtol=1e-6, atol=1e-9)
    assert ((expected == 0).sum(axis=1) > 0).sum() > 30  # many problems with a coefficient held at 0


def test_the_profile_over_phi_meets_the_fits():
    """The profile analyze computes (its fits warm from the joint optimum and from their neighbours), with no fit
    handed to it: its lowest point is the joint fit, its point at phi = 1 the fit with phi held at 1, nowhere
    below the joint fit, falling to it and rising after."""
    runs = paper_runs(noise=0.01)
    options = FitOptions(n_bootstrap=0, stage=None)
    fit = fit_joint_law(runs, options=options)
    held = fit_joint_law(runs, options=options, fix_phi=1.0)
    problem, _ = joint_problem(runs, options)
    profile = profile_phi(problem.data, theta_of(fit), fit.huber, options)
    assert profile.best == pytest.approx(fit.phi, abs=1e-9)
    assert profile.f.min() == pytest.approx(fit.huber, rel=1e-9)
    assert profile.f[np.isclose(profile.values, 1.0, rtol=0, atol=1e-12)][0] == pytest.approx(held.huber, rel=1e-9)
    assert (profile.f >= fit.huber * (1 - 1e-12)).all()
    below, above = profile.values <= fit.phi, profile.values >= fit.phi
    assert (np.diff(profile.f[below]) < 0).all() and (np.diff(profile.f[above]) > 0).all()


def test_the_batched_optimiser_takes_bounds_per_problem():
    """f(x) = sum (x - c)^2 with each problem's own box: the answer is c clipped to that box."""
    rng = np.random.default_rng(1)
    center = rng.normal(0, 2, size=(40, 3))
    lower = rng.uniform(-2, 0, size=(40, 3))
    upper = lower + rng.uniform(0, 2, size=(40, 3))
    upper[::4, 1] = lower[::4, 1]  # held variables, a different one per problem

    def fun(x, rows):
        diff = x - center[rows]
        return (diff ** 2).sum(axis=1), 2 * diff

    result = minimize_batch(fun, rng.uniform(-2, 2, size=(40, 3)), lower, upper)
    np.testing.assert_allclose(result.x, np.clip(center, lower, upper), atol=1e-7)
