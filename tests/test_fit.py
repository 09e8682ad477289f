"""The joint-law fit: recovery of known constants, analytic gradient, status, options, the batched optimiser."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from loopscale.analysis import DEFAULT_BOUNDS, Bounds, FitOptions, FitStatus, fit_joint_law, fit_suite
from loopscale.analysis.bootstrap import block_loss_share, interval_method
from loopscale.analysis.fit_objective import objective
from loopscale.analysis.fit_problem import FitData
from loopscale.analysis.fit_types import CONSTANTS
from loopscale.analysis.options import THETA
from loopscale.analysis.runs import expand_branches
from loopscale.analysis.optimize import Stop, minimize_batch
from loopscale.model import PAPER_LAW, JointLaw
from loopscale.objectives import simulate
from test_analysis_sim import PAPER_GRID, paper_runs, trial_configs

CONSTANTS = ("E", "A", "alpha", "B", "beta", "phi")
# The paper's constants and two lopsided sets: a Chinchilla-like data-dominated law with phi near 1, and a
# steep parameter term with a flat data term and phi near 0.
LAWS = {
    "paper": PAPER_LAW,
    "chinchilla-like": JointLaw(E=2.5, A=400.0, alpha=0.34, B=410.0, beta=0.28, phi=0.9),
    "steep-N-flat-D": JointLaw(E=0.8, A=3000.0, alpha=0.45, B=60.0, beta=0.15, phi=0.1),
}


@pytest.mark.parametrize("name", LAWS)
def test_noise_free_runs_give_back_every_constant(name):
    law = LAWS[name]
    fit = fit_joint_law(paper_runs(law), n_starts=100, n_bootstrap=0)
    assert fit.status is FitStatus.CONVERGED, fit.message
    for constant in CONSTANTS:
        assert getattr(fit, constant) == pytest.approx(getattr(law, constant), rel=1e-3), constant
    assert fit.r2 > 0.999999
    assert fit.max_residual < 1e-6


def test_noisy_paper_grid_recovers_phi_and_the_interval_covers_it():
    fit = fit_joint_law(paper_runs(noise=0.01), n_starts=200, n_bootstrap=200)
    assert fit.status is FitStatus.CONVERGED, fit.message
    assert abs(fit.phi - PAPER_LAW.phi) <= 0.03
    lo, hi = fit.phi_ci
    assert lo < PAPER_LAW.phi < hi
    assert hi - lo < 0.2  # an interval that says something
    assert fit.bootstrap.shape == (200, 6)
    assert fit.n_cells == 24
    assert 0.99 < fit.r2 < 0.9999  # 0.01-nat noise cannot be fitted away
    assert set(fit.rmse_per_r) == {1, 2, 4, 8}
    assert all(0.005 < v < 0.02 for v in fit.rmse_per_r.values())


@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_matches_finite_differences(seed):
    rng = np.random.default_rng(seed)
    data = FitData.from_runs(paper_runs(noise=0.01))
    truth = np.array([np.log(PAPER_LAW.A), PAPER_LAW.alpha, np.log(PAPER_LAW.B), PAPER_LAW.beta,
                      np.log(PAPER_LAW.E), PAPER_LAW.phi])
    weights = rng.integers(0, 3, size=(1, data.r.size)).astype(float)  # bootstrap-like multiplicities
    for delta in (1e-3, 1.0):  # mostly the linear and mostly the quadratic branch of the Huber loss
        theta = truth + rng.normal(0, 0.05, size=6)
        _, grad = objective(theta[None], data, weights, delta)
        np.testing.assert_allclose(grad[0], central_differences(theta, data, weights, delta), rtol=1e-5,
                                   atol=1e-10)


def central_differences(theta, data, weights, delta, h=1e-6):
    """(f(x + h e_i) - f(x - h e_i)) / 2h for every i, all 12 points in one batched call."""
    steps = np.eye(6) * h
    f, _ = objective(np.vstack([theta + steps, theta - steps]), data, np.repeat(weights, 12, axis=0), delta)
    return (f[:6] - f[6:]) / (2 * h)


def test_objective_is_batched_row_by_row():
    data = FitData.from_runs(paper_runs(noise=0.01))
    rng = np.random.default_rng(3)
    lower, upper = DEFAULT_BOUNDS.arrays()
    thetas = lower + (upper - lower) * rng.random((5, 6))
    weights = rng.integers(0, 3, size=(5, data.r.size)).astype(float)
    f, g = objective(thetas, data, weights, 1e-3)
    for k in range(5):
        fk, gk = objective(thetas[k:k + 1], data, weights[k:k + 1], 1e-3)
        assert f[k] == pytest.approx(fk[0], rel=1e-12)
        np.testing.assert_allclose(g[k], gk[0], rtol=1e-12)


def test_restricted_fits_hold_phi_and_fit_worse():
    runs = paper_runs(noise=0.01)
    suite = fit_suite(runs, n_starts=60, n_bootstrap=0)
    assert suite.phi0.phi == 0.0 and suite.phi1.phi == 1.0
    assert suite.phi0.fixed_phi == 0.0
    # The simulated truth has phi = 0.46: both restrictions must cost fit quality, phi = 1 the most (paper).
    assert suite.joint.r2 > suite.phi0.r2 > suite.phi1.r2
    assert set(suite.per_r) == {1, 2, 4, 8}
    assert all(f.r2 > 0.99 for f in suite.per_r.values())
    table = suite.table()
    assert list(table["fit"][:3]) == ["joint", "phi=0", "phi=1"] and len(table) == 7


def test_a_parameter_pinned_by_its_bounds_is_reported():
    bounds = dataclasses.replace(DEFAULT_BOUNDS, phi=(0.6, 3.0))  # the truth (0.459) lies outside
    fit = fit_joint_law(paper_runs(), n_starts=40, n_bootstrap=0, bounds=bounds)
    assert fit.status is FitStatus.AT_BOUND
    assert fit.at_bound == ("phi",)
    assert fit.phi == pytest.approx(0.6)


def test_an_iteration_limit_is_reported_as_stopped_early():
    fit = fit_joint_law(paper_runs(noise=0.01), n_starts=20, n_bootstrap=0, max_iter=3)
    assert fit.status is FitStatus.STOPPED_EARLY
    assert "projected gradient" in fit.message


def test_fit_selects_ok_search_rows_only():
    runs = paper_runs(noise=0.01)
    runs.loc[:4, "status"] = "failed"
    runs.loc[5:9, "stage"] = "calibrate"
    runs.loc[10, "val_loss"] = 99.0  # a diverged run's number: must not enter the fit
    runs.loc[10, "status"] = "diverged"
    fit = fit_joint_law(runs, n_starts=30, n_bootstrap=0)
    assert fit.n_runs == 116 - 11
    assert abs(fit.phi - PAPER_LAW.phi) < 0.06


@pytest.mark.parametrize("data", ["frontier", "optima"])
def test_fit_on_frontier_or_optima(data):
    fit = fit_joint_law(paper_runs(), data=data, n_starts=60, n_bootstrap=0)
    assert fit.data == data
    assert fit.n_runs < 116
    assert np.isfinite(fit.phi) and fit.r2 > 0.9


@pytest.mark.parametrize("overrides, message", [
    ({"n_starts": 0}, "n_starts"),
    ({"data": "best"}, "data must be one of"),
    ({"confidence": 1.5}, "confidence"),
    ({"starts": 3}, "unknown fit option"),
    ({"interval": "jackknife"}, "interval must be one of"),
])
def test_bad_options_are_one_line_value_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        fit_joint_law(paper_runs(), **overrides)


def test_bounds_are_validated():
    with pytest.raises(ValueError, match="lower <= upper"):
        Bounds(alpha=(1.0, 0.5))


def test_a_single_r_is_fitted_as_the_plain_law_without_phi():
    """One r cannot identify phi: the fit is the plain law (phi held at 0, N = N_once + N_rec) and says so."""
    runs = paper_runs(noise=0.01)
    single = runs[runs["r"] == 4]
    plain = fit_joint_law(single, n_starts=40, n_bootstrap=0)
    assert plain.single_r == 4 and not plain.phi_applicable and plain.phi == 0.0
    assert "phi not applicable" in plain.phi_text() and "r=4" in plain.phi_text()
    assert plain.status is FitStatus.CONVERGED
    explicit = fit_joint_law(single, n_starts=40, n_bootstrap=0, fix_phi=0.0)
    assert explicit.phi_applicable and explicit.phi_text() == "phi 0 (fixed)"
    assert [getattr(plain, c) for c in CONSTANTS] == [getattr(explicit, c) for c in CONSTANTS]
    # a fixed phi is the user's choice, kept even on one r; the runs of several r's fit phi as before
    held = fit_joint_law(single, n_starts=40, n_bootstrap=0, fix_phi=0.5)
    assert held.phi == 0.5 and held.phi_applicable
    assert fit_joint_law(runs, n_starts=40, n_bootstrap=0).phi_applicable


def test_bootstrap_draws_by_name():
    fit = fit_joint_law(paper_runs(noise=0.01), n_starts=40, n_bootstrap=30)
    draws = fit.draws()
    assert list(draws.columns) == list(CONSTANTS) and len(draws) == 30
    tail = 100 * (1 - fit.confidence) / 2
    for name in CONSTANTS:  # the named column is the one behind that constant's interval
        assert tuple(np.percentile(draws[name], [tail, 100 - tail])) == pytest.approx(fit.ci[name], rel=1e-12)
    assert fit_joint_law(paper_runs(), n_starts=5, n_bootstrap=0).draws().empty


def test_no_usable_rows_is_a_value_error():
    runs = paper_runs()
    runs["status"] = "failed"
    with pytest.raises(ValueError, match="no usable runs"):
        fit_joint_law(runs)


def test_fit_options_default_to_the_paper():
    options = FitOptions()
    assert (options.delta, options.n_starts, options.n_bootstrap) == (1e-3, 500, 200)
    lower, upper = DEFAULT_BOUNDS.arrays()
    expected = {"a": (-5, 35), "alpha": (0, 2.5), "b": (-5, 35), "beta": (0, 2.5), "e": (-3, 2), "phi": (-3, 3)}
    assert {name: (lower[i], upper[i]) for i, name in enumerate(THETA)} == expected


def test_batched_optimiser_solves_bounded_quadratics():
    """Independent problems f_k(x) = sum (x - c_k)^2 * w with box bounds: the answer is clip(c_k)."""
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 2, size=(50, 4))
    scales = np.array([1.0, 10.0, 100.0, 0.1])
    lower, upper = np.full(4, -1.0), np.full(4, 1.0)
    lower[3] = upper[3] = 0.25  # a fixed variable

    def fun(x, rows):
        diff = x - centers[rows]
        return (scales * diff ** 2).sum(axis=1), 2 * scales * diff

    result = minimize_batch(fun, rng.uniform(-1, 1, size=(50, 4)), lower, upper)
    expected = np.clip(centers, lower, upper)
    np.testing.assert_allclose(result.x, expected, atol=1e-7)
    assert set(result.stop) <= {Stop.GRADIENT, Stop.FUNCTION, Stop.NO_PROGRESS}


NINE_CELLS = {"grid": {c: PAPER_GRID[c] for c in (1e18, 4.64e18, 2.15e19)}, "recurrences": (1, 2, 4)}


def test_auto_interval_is_block_with_many_cells_and_residual_with_few():
    many, few = FitData.from_runs(paper_runs()), FitData.from_runs(paper_runs(**NINE_CELLS))
    # over the sets of levels whose loss leaves fewer than 3: pairs of the 4 r's (12 of 24 cells), fours of the 6
    # budgets (16 of 24); and any one level of 3 (3 of 9 cells)
    assert block_loss_share(many) == pytest.approx(6 * 0.5 ** 24 + 15 * (1 / 3) ** 24)
    assert block_loss_share(few) == pytest.approx(6 * (2 / 3) ** 9)
    assert interval_method(many, FitOptions()) == "block"
    assert interval_method(few, FitOptions()) == "residual"
    assert interval_method(few, FitOptions(interval="block")) == "block"
    assert fit_joint_law(paper_runs(**NINE_CELLS), n_starts=20, n_bootstrap=4).interval == "residual"


def test_auto_interval_counts_only_resamples_left_with_too_few_levels():
    """Losing one of eight budgets, as the paper preset's 32 cells may, leaves the law identified; losing one of
    three, as nine cells may, does not. Two r's are both needed."""
    preset = FitData.from_runs(paper_runs(grid={**{c: (8, 10, 12) for c in (1e17, 2.15e17)}, **PAPER_GRID}))
    assert preset.n_cells == 32 and block_loss_share(preset) < 1e-3
    assert interval_method(preset, FitOptions()) == "block"
    two_r = FitData.from_runs(paper_runs(recurrences=(1, 2)))  # 6 budgets x 2 r: losing an r of 12 cells
    assert block_loss_share(two_r) == pytest.approx(2 * 0.5 ** 12 + 15 * (1 - 8 / 12) ** 12)


def branched_runs(noise: float) -> pd.DataFrame:
    """The paper grid simulated with independent noise only, each trial also branching into the next smaller
    budget: a branch point carries its trial's noise into another cell."""
    budgets = sorted(PAPER_GRID)
    configs = [dataclasses.replace(c, branch_budgets=tuple(b for b in budgets if b < c.budget_flops)[-1:])
               for c in trial_configs(noise=noise, seed=3)]
    rows = [{"run_id": f"t{i}", "sweep": "sim", "stage": "search", "branch_of": "", **simulate(c)}
            for i, c in enumerate(configs)]
    return expand_branches(pd.DataFrame(rows))


def test_the_block_bootstrap_resamples_branch_points_with_their_trial():
    runs = branched_runs(noise=0.02)
    data = FitData.from_runs(runs)
    branches = runs[runs["branch_of"] != ""]
    assert len(branches) == 116 - 4 * len(PAPER_GRID[min(PAPER_GRID)]) and data.trial.max() + 1 == 116
    by_run = dict(zip(runs["run_id"], data.trial))  # (FitData keeps the runs' order)
    assert all(by_run[b] == by_run[t] for b, t in zip(branches["run_id"], branches["branch_of"]))

    both = fit_joint_law(runs, n_starts=40, n_bootstrap=100, interval="block")
    # the same runs with their trials forgotten: cells alone are resampled, and the shared noise is missed
    cells = fit_joint_law(runs.assign(branch_of=""), n_starts=40, n_bootstrap=100, interval="block")
    assert (both.n_shared_trials, cells.n_shared_trials) == (len(branches), 0)  # one branch point per trial here
    assert both.phi_ci[1] - both.phi_ci[0] > 1.2 * (cells.phi_ci[1] - cells.phi_ci[0])


def test_residual_bootstrap_keeps_phi_identified_on_nine_cells():
    runs = paper_runs(noise=0.01, seed=1, **NINE_CELLS)
    fit = fit_joint_law(runs, n_starts=100, n_bootstrap=100)
    assert fit.interval == "residual" and fit.n_cells == 9
    lo, hi = fit.phi_ci
    assert lo < PAPER_LAW.phi < hi and hi - lo < 0.5
    assert np.all(np.abs(fit.draws()["phi"]) < 2.9)  # no resample ran phi to its bound (-3 or 3)


def test_residual_bootstrap_of_noise_free_runs_is_the_fit_itself():
    fit = fit_joint_law(paper_runs(**NINE_CELLS), n_starts=60, n_bootstrap=10, interval="residual")
    np.testing.assert_allclose(fit.draws()["phi"], PAPER_LAW.phi, atol=1e-3)


def test_the_same_runs_in_another_order_give_the_same_interval():
    """Two sweeps of the same trials read them from MLflow in different orders; the seeded bootstrap must draw
    the same resamples from the same runs, whatever their order."""
    runs = paper_runs(noise=0.01, seed=2, **NINE_CELLS)
    shuffled = runs.sample(frac=1.0, random_state=0)
    assert not runs.index.equals(shuffled.index)
    first, second = (fit_joint_law(t, n_starts=20, n_bootstrap=8) for t in (runs, shuffled))
    assert first.phi == pytest.approx(second.phi, abs=1e-9) and first.phi_ci == second.phi_ci
