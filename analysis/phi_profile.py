"""The profile of the fit's objective over phi: at each phi of a grid, the objective minimised over the other five
parameters with phi held there. A profile-likelihood interval for phi compares these minima with the joint
fit's (Venzon & Moolgavkar 1988 on profile-likelihood intervals).

Every phi gets the starts a fit with phi fixed there would get (the local minima of its projected (alpha, beta)
grid, ``analysis.projection``), and the starts of all phis run as one batch (``analysis.optimize``), phi held per
start: a profile of ~40 phis costs about what one fit costs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .fit import polish
from .fit_objective import unweighted_objective
from .fit_problem import FitData, FitProblem
from .optimize import minimize_batch
from .options import FitOptions
from .projection import exponent_grid, local_minima, projected_grid

STARTS_PER_PHI = 4  # the best local minima of each phi's (alpha, beta) grid (a fit finds 3 to 5 basins in all)


def profile_objective(data: FitData, options: FitOptions, phis: np.ndarray) -> np.ndarray:
    """The minimised objective of ``fit_joint_law``'s problem on ``data`` (the fitted rows, ``FitData``) with phi
    held at each of ``phis``, (len(phis),); ``options`` gives the bounds of the other parameters and the Huber
    delta (its ``fix_phi`` is not used). A phi outside ``options.bounds.phi`` is a ValueError."""
    phis = np.atleast_1d(np.asarray(phis, dtype=float))
    lo, hi = options.bounds.phi
    outside = phis[~((phis >= lo) & (phis <= hi))]
    if outside.size:
        raise ValueError(f"phi {outside[0]:g} is outside the fit's bounds on phi, {lo:g} to {hi:g}")
    problem = FitProblem.of(data, dataclasses.replace(options, fix_phi=None))
    theta, f = projected_grid(problem, phis)
    alphas, betas, _ = exponent_grid(problem)
    grid = f.reshape(len(phis), len(alphas) * len(betas))
    minimum = local_minima(grid.reshape(len(phis), len(alphas), len(betas)), axes=(1, 2)).reshape(grid.shape)
    # per phi, its local minima best first (others after them, +inf), the first STARTS_PER_PHI of them kept
    order = np.argsort(np.where(minimum, grid, np.inf), axis=1, kind="stable")[:, :STARTS_PER_PHI]
    keep = np.take_along_axis(minimum, order, axis=1)
    group = np.nonzero(keep)[0]
    starts = theta[(group * grid.shape[1] + order[keep])]
    lower, upper = np.tile(problem.lower, (len(starts), 1)), np.tile(problem.upper, (len(starts), 1))
    lower[:, 5] = upper[:, 5] = phis[group]
    result = minimize_batch(unweighted_objective(data, options.delta), starts, lower, upper,
                            max_iter=options.max_iter, groups=group)
    # each phi's best end, polished as fit_joint_law polishes its optimum, so that a profile at a phi is that fit's
    best = np.full(len(phis), -1)
    for row in np.argsort(result.f, kind="stable")[::-1]:
        best[group[row]] = row
    return np.array([polish(dataclasses.replace(problem, lower=lower[row], upper=upper[row]), result.x[row],
                            result.f[row])[1] for row in best])
