"""Delta-phi as one model: two sweeps fitted jointly with one base law and a phi each.

Sweep A's rows follow N_eff = N_once + r^phi_A N_rec, sweep B's N_eff = N_once + r^(phi_A + Delta) N_rec, and
both share E, A, alpha, B, beta: the r = 1 runs of either sweep (where r^phi = 1) inform that base law once,
and neither sweep's fit can drift off a base of its own. Seven constants, one objective: the summed Huber loss
of log L over both sweeps' rows (``analysis.fit_objective``).

Held at a Delta, the model is the ordinary joint law on the combined rows once each B row's N_rec is scaled
by r^Delta (then r^phi_A (r^Delta N_rec) = r^(phi_A + Delta) N_rec), so Delta's profile is a batch of
ordinary joint fits, each on the rows scaled by its own Delta, and its interval and the test of
Delta = 0 come from the same nested F test as phi's (``analysis.profile_interval``, 7 free constants). The interval
excludes 0 exactly when the test of Delta = 0 rejects at the same level.

Both phi lie in phi's bounds [lo, hi] (``FitOptions.bounds.phi``), phi_B = phi_A + Delta too: held at a Delta, phi_A
is fitted in [max(lo, lo - Delta), min(hi, hi - Delta)], and Delta's own range is [lo - hi, hi - lo], the widest
difference two phi in the bounds can have. An interval that reaches an end of it puts phi_A and phi_B at opposite
bounds of phi's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .fit import refit
from .fit_objective import objective
from .fit_problem import FitData, FitProblem, fit_rows
from .fit_types import LawFit
from .optimize import minimize_batch
from .options import THETA, FitOptions
from .profile_interval import NestedTest, Profile, grid_of, profile, theta_of

FREE_CONSTANTS = 7  # E, A, alpha, B, beta, phi_A, Delta
PHI = THETA.index("phi")


@dataclass(frozen=True, eq=False)
class SharedBase:
    """The joint fit of two sweeps: the base law and phi_A at the optimum (``theta``), Delta, and Delta's
    profile with its test."""

    theta: np.ndarray   # (a, alpha, b, beta, e, phi_A) at the optimum
    delta: float
    profile: Profile
    n_rows: tuple[int, int]

    @property
    def phi_a(self) -> float:
        return float(self.theta[5])

    @property
    def phi_b(self) -> float:
        return self.phi_a + self.delta

    @property
    def ci(self) -> tuple[float, float]:
        return self.profile.ci

    @property
    def p_zero(self) -> float:
        """The F test of Delta = 0: one phi for both sweeps against a phi each."""
        return self.profile.p(0.0)


def combined(data_a: FitData, data_b: FitData, delta: float) -> FitData:
    """A's rows and B's as one table, B's N_rec scaled by r^delta (B's cells numbered after A's)."""
    scale = np.concatenate([np.ones(data_a.n_runs), data_b.r ** delta])
    return FitData(r=np.concatenate([data_a.r, data_b.r]),
                   n_once=np.concatenate([data_a.n_once, data_b.n_once]),
                   n_rec=np.concatenate([data_a.n_rec, data_b.n_rec]) * scale,
                   log_d=np.concatenate([data_a.log_d, data_b.log_d]),
                   log_l=np.concatenate([data_a.log_l, data_b.log_l]),
                   cell=np.concatenate([data_a.cell, data_b.cell + data_a.n_cells]),
                   budget=np.concatenate([data_a.budget, data_b.budget]))


def phi_a_bounds(options: FitOptions, delta: float) -> tuple[float, float]:
    """Where phi_A may lie at a held Delta, so that phi_A and phi_A + Delta are both in phi's bounds."""
    lo, hi = options.bounds.phi
    return max(lo, lo - delta), min(hi, hi - delta)


def fit_shared_base(runs_a: pd.DataFrame, runs_b: pd.DataFrame, fit_a: LawFit, fit_b: LawFit,
                    options: FitOptions) -> SharedBase:
    """The shared-base model of two sweeps' own runs (none borrowed: a borrowed run would count twice), started
    from their separate fits ``fit_a`` and ``fit_b``. Delta's grid spans the widest difference phi's bounds
    allow."""
    data_a, data_b = (FitData.from_runs(fit_rows(runs, options)) for runs in (runs_a, runs_b))
    free = dataclasses.replace(options, fix_phi=None)
    lo, hi = options.bounds.phi
    bounds = (lo - hi, hi - lo)
    centre = float(np.clip(fit_b.phi - fit_a.phi, *bounds))

    base = combined(data_a, data_b, 0.0)
    problem = FitProblem.of(base, free)
    ones = np.ones((1, base.n_runs))

    def fit_at(deltas: np.ndarray, warm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # each fit's rows carry its own Delta in N_rec: the objective reads the row's N_rec by the fit's index
        n_rec = np.stack([combined(data_a, data_b, d).n_rec for d in deltas])
        lower, upper = np.tile(problem.lower, (len(deltas), 1)), np.tile(problem.upper, (len(deltas), 1))
        lower[:, PHI], upper[:, PHI] = np.transpose([phi_a_bounds(options, d) for d in deltas])
        result = minimize_batch(lambda x, rows: objective(x, dataclasses.replace(base, n_rec=n_rec[rows]), ones,
                                                          options.delta),
                                np.clip(np.asarray(warm, dtype=float), lower, upper), lower, upper,
                                max_iter=options.max_iter, groups=np.arange(len(deltas)))
        return result.x, result.f

    held = dataclasses.replace(free, bounds=dataclasses.replace(options.bounds, phi=phi_a_bounds(options, centre)))
    theta_hat, f_hat = refit(combined(data_a, data_b, centre), theta_of(fit_a), n_starts=min(options.n_starts, 50),
                             seed=options.seed, max_iter=options.max_iter, options=held)

    def test_of(delta: float, theta: np.ndarray, f_min: float) -> NestedTest:
        return NestedTest.at(combined(data_a, data_b, delta), theta, f_min, options.delta, FREE_CONSTANTS)

    shape = profile(fit_at, grid_of(bounds, 0.0, centre), theta_hat, f_hat, centre, test_of, options.confidence)
    best = int(np.argmin(shape.f))
    theta, delta = (shape.thetas[best], shape.best) if shape.f[best] < f_hat else (theta_hat, centre)
    return SharedBase(theta=theta, delta=float(delta), profile=shape, n_rows=(data_a.n_runs, data_b.n_runs))
