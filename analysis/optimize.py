"""A vectorised box-constrained quasi-Newton minimiser for many small problems at once.

Scaling-law fits need hundreds of random starts (the paper: best of 500 L-BFGS-B starts) and hundreds of
bootstrap refits, each a 6-parameter problem over ~100 runs. One scipy call per start costs ~0.2 ms of Python
overhead per function evaluation; here all K problems advance together, one numpy evaluation of the K x n
objective per line-search trial, so 500 starts take about as long as a handful of scipy runs.

Method: projected BFGS with a full inverse-Hessian approximation per problem (for 6 parameters this is the
full-memory limit of L-BFGS-B). Variables at a bound whose gradient points outward are held fixed for the
step; the step ``x + t d`` is projected onto the box and accepted by the Armijo condition on the projected
path, halving t until it holds. A problem stops when its projected gradient is below ``gtol``, when the
relative decrease of f falls below ``ftol``, when no step length gives a decrease, or after ``max_iter``.

Pruning: random starts in the paper's wide bounds often land on a plateau (power terms ~0, the law a constant
E) where steps shrink and f creeps down for thousands of iterations; in one process those stragglers would
cost as much as everything else. After ``prune_after`` iterations a problem still above ``prune_factor`` times
the best value of its group (the starts of one fit) is abandoned as PRUNED: to become the group's best it
would still have to shed more than half its value (factor 2), having failed to in all iterations so far.
Every ``prune_after`` iterations, a problem not below a start of its group that has already converged is
abandoned too (it can only end where that start ended, or slightly lower after many more iterations); a
start below every converged one of its group runs on to ``max_iter``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# f and gradient of the problems in ``rows`` at points x (len(rows), p) -> (f (len(rows),), g (len(rows), p)).
BatchObjective = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


LADDER = 8  # step lengths tried per objective call once the full step has failed
# Points evaluated per objective call at most: the objective's temporaries are (points x runs) arrays, so larger
# calls are made in slices of this many (each point's value is its own: the slices change no number).
EVAL_POINTS = 4096
SINGULAR = 1e15  # a Hessian model whose eigenvalues span more than this is not inverted


class Stop(enum.IntEnum):
    """Why one problem stopped."""

    RUNNING = 0
    GRADIENT = 1    # projected gradient <= gtol
    FUNCTION = 2    # relative decrease of f <= ftol
    NO_PROGRESS = 3  # no step length decreased f (flat or kinked at the current point)
    MAX_ITER = 4
    PRUNED = 5       # abandoned far above the best of its group (see module docstring)


@dataclass(frozen=True)
class BatchResult:
    x: np.ndarray       # (K, p) final points
    f: np.ndarray       # (K,) final values
    nit: np.ndarray     # (K,) iterations taken
    stop: np.ndarray    # (K,) Stop codes


def minimize_batch(fun: BatchObjective, x0: np.ndarray, lower: np.ndarray, upper: np.ndarray, *,
                   max_iter: int = 1000, gtol: float = 1e-10, ftol: float = 1e-13,
                   armijo: float = 1e-4, max_halvings: int = 50, groups: np.ndarray | None = None,
                   prune_after: int = 500, prune_factor: float = 2.0) -> BatchResult:
    """Minimise K independent problems from starts ``x0`` (K, p) within ``lower <= x <= upper``, bounds shared (p,)
    or per problem (K, p).

    Variables with ``lower == upper`` stay fixed at that value. ``groups`` (K,) labels the problems that are
    starts of the same fit (default: all one group) for pruning.
    """
    n_problems, p = x0.shape
    lower, upper = np.broadcast_to(lower, x0.shape), np.broadcast_to(upper, x0.shape)
    x = np.clip(x0, lower, upper)
    f, g = _evaluate(fun, x, np.arange(n_problems))
    h_inv = np.tile(np.eye(p), (n_problems, 1, 1))
    fixed = upper <= lower
    stop = np.full(n_problems, Stop.RUNNING, dtype=int)
    nit = np.zeros(n_problems, dtype=int)
    groups = np.zeros(n_problems, dtype=int) if groups is None else np.unique(groups, return_inverse=True)[1]
    for it in range(max_iter):
        if it and it % prune_after == 0:
            _prune(f, stop, groups, prune_factor, first=it == prune_after)
        rows = np.flatnonzero(stop == Stop.RUNNING)
        if rows.size == 0:
            break
        xa, fa, ga, ha = x[rows], f[rows], g[rows], h_inv[rows]
        lo, hi = lower[rows], upper[rows]
        free = ~(fixed[rows] | ((xa <= lo) & (ga > 0)) | ((xa >= hi) & (ga < 0)))
        g_free = ga * free
        at_gtol = np.abs(g_free).max(axis=1) <= gtol
        d = _reduced_newton_step(ha, g_free, free)
        uphill = (d * ga).sum(axis=1) >= 0
        if uphill.any():  # a stale curvature model: restart it from steepest descent
            ha[uphill] = np.eye(p)
            d[uphill] = -g_free[uphill]
        # The first step moves no parameter by more than 1 (the scale of the bounds' log-space units).
        t = np.ones(rows.size) if it else np.minimum(1.0, 1.0 / np.maximum(np.abs(d).max(axis=1), 1e-300))
        x_new, f_new, g_new = xa.copy(), fa.copy(), ga.copy()
        searching = ~at_gtol
        tried = 0
        while tried < max_halvings and searching.any():
            # One call tries a ladder of step lengths t, t/2, ..., t/2^(m-1) for every problem still searching
            # (a single step first: it is accepted most of the time); keep the longest that passes Armijo.
            m = 1 if tried == 0 else min(LADDER, max_halvings - tried)
            trial = np.flatnonzero(searching)
            steps = t[trial, None] * 0.5 ** np.arange(m)  # (n, m)
            xt = np.clip(xa[trial, None, :] + steps[..., None] * d[trial, None, :], lo[trial, None, :],
                         hi[trial, None, :]).reshape(-1, p)
            ft, gt = _evaluate(fun, xt, np.repeat(rows[trial], m))
            x0 = np.repeat(xa[trial], m, axis=0)
            ok = np.isfinite(ft) & (ft <= np.repeat(fa[trial], m)
                                    + armijo * (np.repeat(ga[trial], m, axis=0) * (xt - x0)).sum(axis=1))
            ok = ok.reshape(-1, m)
            passed = ok.any(axis=1)
            pick = np.flatnonzero(passed) * m + ok[passed].argmax(axis=1)  # the longest passing step
            done = trial[passed]
            x_new[done], f_new[done], g_new[done] = xt[pick], ft[pick], gt[pick]
            searching[done] = False
            t[trial[~passed]] *= 0.5 ** m
            tried += m
        no_progress = searching
        _bfgs_update(ha, x_new - xa, g_new - ga, scale_first=it == 0)
        small = (fa - f_new) <= ftol * np.maximum(np.abs(fa), 1e-300)
        x[rows], f[rows], g[rows], h_inv[rows] = x_new, f_new, g_new, ha
        nit[rows] += 1
        stop[rows] = np.select([at_gtol, no_progress, small], [Stop.GRADIENT, Stop.NO_PROGRESS, Stop.FUNCTION],
                               Stop.RUNNING)
    stop[stop == Stop.RUNNING] = Stop.MAX_ITER
    return BatchResult(x=x, f=f, nit=nit, stop=stop)


def _reduced_newton_step(h_inv: np.ndarray, g_free: np.ndarray, free: np.ndarray) -> np.ndarray:
    """The quasi-Newton step in the free variables alone, zero in the held ones: d_f = -(B_ff)^-1 g_f, with
    B = H^-1 the Hessian model and f the free variables. Once a variable is held (fixed, or at its bound), the
    free block of H is not (B_ff)^-1: stepping with it, a fit along a bound (E at its floor, alpha at its cap)
    or with phi fixed crawled for thousands of iterations where L-BFGS-B, which steps in the free subspace, took
    tens. (The same block from H alone, H_ff - H_fh (H_hh)^-1 H_hf, is exact too but lost to rounding on the
    fits of the tests.) Where nothing is held, or H is numerically singular (eigenvalues spanning more than
    ``SINGULAR``), the step is H's own, -H g_f."""
    step = -np.einsum("kij,kj->ki", h_inv, g_free) * free
    held = np.flatnonzero(~free.all(axis=1))
    if not held.size:
        return step
    values, vectors = np.linalg.eigh(h_inv[held])
    ok = values[:, 0] > values[:, -1] / SINGULAR
    rows, values, vectors, mask = held[ok], values[ok], vectors[ok], free[held[ok]]
    hessian = (vectors / values[:, None, :]) @ vectors.transpose(0, 2, 1)
    both = mask[:, :, None] & mask[:, None, :]
    reduced = np.where(both, hessian, 0.0) + np.eye(free.shape[1]) * ~mask[:, None, :]
    step[rows] = -np.linalg.solve(reduced, g_free[rows, :, None])[..., 0] * mask
    return step


def _evaluate(fun: BatchObjective, x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``fun(x, rows)``, called on slices of at most ``EVAL_POINTS`` points: its memory then stays bounded
    whatever the number of starts or bootstrap resamples."""
    if len(rows) <= EVAL_POINTS:
        return fun(x, rows)
    parts = [fun(x[i:i + EVAL_POINTS], rows[i:i + EVAL_POINTS]) for i in range(0, len(rows), EVAL_POINTS)]
    return np.concatenate([f for f, _ in parts]), np.concatenate([g for _, g in parts])


def _prune(f: np.ndarray, stop: np.ndarray, groups: np.ndarray, factor: float, *, first: bool) -> None:
    """Mark running problems PRUNED in place: the first time, those above ``factor`` x their group's best; every
    time, those no lower than a problem of their group that has already converged."""
    running = stop == Stop.RUNNING
    best = np.full(groups.max() + 1, np.inf)
    np.minimum.at(best, groups, f)
    settled = np.full(groups.max() + 1, np.inf)
    finished = ~running & (stop != Stop.PRUNED)
    np.minimum.at(settled, groups[finished], f[finished])
    doomed = f >= settled[groups] * (1 - 1e-9)
    if first:
        doomed |= f > factor * best[groups] + 1e-12
    stop[running & doomed] = Stop.PRUNED


def _bfgs_update(h_inv: np.ndarray, s: np.ndarray, y: np.ndarray, *, scale_first: bool) -> None:
    """In-place BFGS update of the inverse Hessians, H <- V H V^T + rho s s^T with V = I - rho s y^T.

    Skipped where the curvature condition s.y > 0 fails (the update would lose positive definiteness).
    ``scale_first``: rescale the identity by s.y / y.y first (Nocedal & Wright, eq. 6.20).
    """
    sy = (s * y).sum(axis=1)
    ok = sy > 1e-12 * np.sqrt((s * s).sum(axis=1) * (y * y).sum(axis=1))
    if not ok.any():
        return
    s, y, sy = s[ok], y[ok], sy[ok]
    h = h_inv[ok]
    if scale_first:
        h = h * (sy / np.maximum((y * y).sum(axis=1), 1e-300))[:, None, None]
    rho = 1.0 / sy
    v = np.eye(s.shape[1]) - rho[:, None, None] * s[:, :, None] * y[:, None, :]
    h_inv[ok] = v @ h @ v.transpose(0, 2, 1) + rho[:, None, None] * s[:, :, None] * s[:, None, :]
