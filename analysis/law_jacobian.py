"""The joint law's log-loss at many parameter sets, and its Jacobian in the fit's parameters (THETA order).

With theta = (log A, alpha, log B, beta, log E, phi), log L = LSE(log A - alpha log N_eff, log B - beta log D,
log E), N_eff = N_once + r^phi N_rec (Schwethelm et al. 2026, Eq. 2). The Jacobian d log L / d theta linearises
the fit: the law sampler's information about phi and the cell-effect design effect of the nested F test
(``analysis.overdispersion``) both read it.
"""

from __future__ import annotations

import numpy as np

from .options import THETA


def log_loss(theta: np.ndarray, r, n_once, n_rec, log_d) -> np.ndarray:
    """log L of the law at parameter sets theta (K, 6) in THETA order and runs (n,): (K, n)."""
    a, alpha, b, beta, e, phi = (col[:, None] for col in theta.T)
    n_eff = n_once + np.exp(phi * np.log(r)) * n_rec
    terms = np.stack(np.broadcast_arrays(a - alpha * np.log(n_eff), b - beta * log_d, e))
    top = terms.max(axis=0)
    return top + np.log(np.exp(terms - top).sum(axis=0))


def log_loss_jacobian(theta: np.ndarray, r, n_once, n_rec, log_d, step: float = 1e-5) -> np.ndarray:
    """d log L / d theta (THETA order) of the law at ``theta`` for runs (n,): (n, 6), by forward differences."""
    moved = theta + step * np.vstack([np.zeros(len(THETA)), np.eye(len(THETA))])
    at = log_loss(moved, r, n_once, n_rec, log_d)
    return ((at[1:] - at[0]) / step).T
