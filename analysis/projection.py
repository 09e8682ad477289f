"""Starts for the joint-law fit by variable projection: E, A, B are linear once the exponents are fixed.

For fixed (alpha, beta, phi) the law (``model.law``)::

    L = E + A * x1 + B * x2,   x1 = N_eff^(-alpha),   x2 = D^(-beta),   N_eff = N_once + r^phi * N_rec

is linear in (E, A, B) >= 0. The fit's residual is ``log L_hat - log L``, which to first order is the relative
error ``(L_hat - L) / L``; so on a grid of exponents (``GRID_POINTS`` per free exponent, evenly over its
bounds) each point gets its (E, A, B) from non-negative least squares of the relative error, a 3-variable
problem solved exactly by trying every support set of the three coefficients (the NNLS optimum is the best
unconstrained least-squares solution, over support sets, that is non-negative). The Gram matrices of all grid
points come from a few matrix products over the runs, so the whole grid costs about one evaluation of the
objective at each of its points.

Each grid point, (E, A, B) taken into the log-space box, is then scored by the EXACT objective of the fit
(``analysis.fit_objective``), and the grid's local minima are the starts of the 6-parameter fit. The grid is the
global search (every exponent basin is visited, at a spacing of 0.1 in alpha and beta and 0.25 in phi); the
6-parameter polish of each basin's best point reaches the optimum of the Huber objective itself, so the
least-squares inner solve only has to find the basins, not to be the answer.
"""

from __future__ import annotations

import itertools

import numpy as np

from .fit_objective import objective
from .fit_problem import FitProblem

GRID_POINTS = {"alpha": 26, "beta": 26, "phi": 25}  # per free exponent over its bounds: steps 0.1, 0.1, 0.25
# Every non-empty support set of (E, A, B), as masks in that order.
SUPPORTS = np.array([s for s in itertools.product((0.0, 1.0), repeat=3) if any(s)])
# Grid points x runs per call of the objective: its (points x runs) temporaries then stay in the CPU's cache (with
# 116 runs, slices of ~1,000 points evaluated the grid ~4x faster per point than slices of 4,096, measured here).
SLICE_ELEMENTS = 2 ** 17
RIDGE = 1e-12  # on the unit diagonal of the column-normalised Gram matrix: keeps collinear columns solvable


def exponent_grid(problem: FitProblem, phis: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exponent grid of ``problem``: alpha, beta and phi values, each evenly over its bounds (one value where
    the bounds pin it); ``phis`` replaces phi's values."""
    lower, upper = problem.lower, problem.upper

    def axis(i: int, name: str) -> np.ndarray:
        return np.linspace(lower[i], upper[i], GRID_POINTS[name] if upper[i] > lower[i] else 1)

    return axis(1, "alpha"), axis(3, "beta"), axis(5, "phi") if phis is None else np.asarray(phis, dtype=float)


def projected_grid(problem: FitProblem, phis: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every point of the exponent grid with its (E, A, B) solved, in THETA order clipped to the box, and its
    exact objective: (theta (K, 6), f (K,)), ordered phi-major, then alpha, then beta."""
    data = problem.data
    alphas, betas, phis = exponent_grid(problem, phis)
    # Columns of the relative-error regression, each run's row divided by its loss: 1/L, x1/L, x2/L; target 1.
    inv = np.exp(-data.log_l)
    log_n_eff = np.log(data.n_once + np.exp(phis[:, None] * np.log(data.r)) * data.n_rec)  # (P, n)
    x1 = np.exp(-alphas[None, :, None] * log_n_eff[:, None, :]).reshape(-1, data.n_runs) * inv  # (P*A, n)
    x2 = np.exp(-betas[:, None] * data.log_d) * inv  # (Bt, n)
    k1, k2 = len(x1), len(x2)
    gram = np.empty((k1, k2, 3, 3))
    gram[..., 0, 0] = inv @ inv
    gram[..., 0, 1] = gram[..., 1, 0] = (x1 @ inv)[:, None]
    gram[..., 0, 2] = gram[..., 2, 0] = (x2 @ inv)[None, :]
    gram[..., 1, 1] = np.einsum("ij,ij->i", x1, x1)[:, None]
    gram[..., 1, 2] = gram[..., 2, 1] = x1 @ x2.T
    gram[..., 2, 2] = np.einsum("ij,ij->i", x2, x2)[None, :]
    rhs = np.empty((k1, k2, 3))
    rhs[..., 0], rhs[..., 1], rhs[..., 2] = inv.sum(), x1.sum(axis=1)[:, None], x2.sum(axis=1)[None, :]
    coef = nonnegative_least_squares(gram.reshape(-1, 3, 3), rhs.reshape(-1, 3))  # (K, 3): E, A, B

    with np.errstate(divide="ignore"):
        log_coef = np.log(coef)
    phi, alpha, beta = (g.ravel() for g in np.meshgrid(phis, alphas, betas, indexing="ij"))
    theta = np.stack([log_coef[:, 1], alpha, log_coef[:, 2], beta, log_coef[:, 0], phi], axis=1)
    theta = np.clip(theta, problem.lower, problem.upper)
    ones, step = np.ones((1, data.n_runs)), max(1, SLICE_ELEMENTS // data.n_runs)
    f = np.concatenate([objective(theta[i:i + step], data, ones, problem.options.delta)[0]
                        for i in range(0, len(theta), step)])
    return theta, f


def nonnegative_least_squares(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """argmin_{c >= 0} c^T G c - 2 h^T c for K 3-variable problems at once: G (K, 3, 3), h (K, 3) -> c (K, 3).

    Exact: the optimum is the unconstrained solution on its support, so it is the feasible support solution
    that lowers the objective most (the reduction of a support's solution c is h^T c). Columns are normalised
    first (Gram diagonal 1), which makes the solve independent of the columns' scales (N^-alpha ranges over
    twenty orders of magnitude).
    """
    scale = np.sqrt(np.maximum(np.diagonal(gram, axis1=1, axis2=2), 1e-300))  # (K, 3)
    g = gram / (scale[:, :, None] * scale[:, None, :]) + RIDGE * np.eye(3)
    h = rhs / scale
    best = np.zeros_like(h)
    best_gain = np.zeros(len(h))
    for mask in SUPPORTS:
        # excluded variables get the identity row and a zero right-hand side: their solution is exactly 0
        sub = g * np.outer(mask, mask) + np.diag(1.0 - mask)
        c = np.linalg.solve(sub, (h * mask)[..., None])[..., 0]
        gain = (h * c).sum(axis=1)
        better = (c >= 0).all(axis=1) & (gain > best_gain)
        best[better], best_gain[better] = c[better], gain[better]
    return best / scale


def grid_starts(problem: FitProblem, count: int) -> np.ndarray:
    """The starts of the 6-parameter fit: the local minima of the projected grid's exact objective (each lower
    than its neighbours along alpha, beta and phi, one per plateau), best first, at most ``count``, (k, 6).

    Each local minimum stands for one basin of the objective over the exponents; the 6-parameter polish of each
    then finds the basin's optimum (on the fixtures of tests/test_fit_projection.py, 3 to 5 basins).
    """
    theta, f = projected_grid(problem)
    alphas, betas, phis = exponent_grid(problem)
    points = np.flatnonzero(local_minima(f.reshape(len(phis), len(alphas), len(betas)), axes=(0, 1, 2)))
    return theta[points[np.argsort(f[points], kind="stable")[:count]]]


def local_minima(grid: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Which points of ``grid`` are local minima along ``axes``: strictly below the previous neighbour and not
    above the next on each axis, so that one point of a flat stretch qualifies; a boolean array of its shape."""
    minimum = np.ones(grid.shape, dtype=bool)
    for axis in axes:
        edge = [(0, 0)] * grid.ndim
        edge[axis] = (1, 1)
        padded = np.pad(grid, edge, constant_values=np.inf)
        below = np.take(padded, np.arange(grid.shape[axis]), axis=axis)
        above = np.take(padded, np.arange(2, grid.shape[axis] + 2), axis=axis)
        minimum &= (grid < below) & (grid <= above)
    return minimum
