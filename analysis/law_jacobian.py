"""The joint law's log-loss at many parameter sets, and its Jacobian in the fit's parameters (THETA order).

With theta = (log A, alpha, log B, beta, log E, phi), log L = LSE(log A - alpha log N_eff, log B - beta log D,
log E), N_eff = N_once + r^phi N_rec (Schwethelm et al. 2026, Eq. 2). The Jacobian d log L / d theta linearises
the fit: the law sampler's information about phi and the cell-effect design effect of the nested F test
(``analysis.overdispersion``) both read it.
"""

from __future__ import annotations

import numpy as np

from .fit_objective import law_log_loss
from .options import THETA


def log_loss(theta: np.ndarray, r, n_once, n_rec, log_d) -> np.ndarray:
    """log L of the law at parameter sets theta (K, 6) in THETA order and runs (n,): (K, n), as the fit
    computes it (``analysis.fit_objective.law_log_loss``)."""
    return law_log_loss(theta, r, n_once, n_rec, log_d)[0]


def log_loss_jacobian(theta: np.ndarray, r, n_once, n_rec, log_d, step: float = 1e-5) -> np.ndarray:
    """d log L / d theta (THETA order) of the law at ``theta`` for runs (n,): (n, 6), by forward differences."""
    moved = theta + step * np.vstack([np.zeros(len(THETA)), np.eye(len(THETA))])
    at = log_loss(moved, r, n_once, n_rec, log_d)
    return ((at[1:] - at[0]) / step).T
