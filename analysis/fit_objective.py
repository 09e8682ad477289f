"""The objective of the joint-law fit: the summed Huber loss of the law in log-sum-exp form, with its gradient.

With A = e^a, B = e^b, E = e^e the law (``model.law``) reads::

    log L_hat = LSE(a - alpha * log N_eff,  b - beta * log D,  e),   N_eff = N_once + r^phi * N_rec

and the fit minimises the Huber loss (delta = 1e-3) of ``log L_hat - log L`` SUMMED over runs: a mean makes the
gradient tiny and L-BFGS stops early, the flaw Besiroglu et al. 2024 found in Chinchilla's fit
(Schwethelm et al. 2026, arXiv 2604.21106, fit the law this way).
"""

from __future__ import annotations

import numpy as np

from .fit_problem import FitData
from .optimize import BatchObjective


def law_log_loss(theta: np.ndarray, r, n_once, n_rec, log_d) -> tuple[np.ndarray, tuple[np.ndarray, ...],
                                                                        np.ndarray, np.ndarray]:
    """log L_hat of the law at K parameter sets theta (K, 6) in THETA order for n runs (arrays (n,)), in the
    log-sum-exp form of the module docstring: (log L_hat (K, n), the terms' softmax weights w_i = exp(t_i - LSE)
    (three (K, n)), log N_eff (K, n), d log N_eff / d phi = r^phi log(r) N_rec / N_eff (K, n))."""
    a, alpha, b, beta, e, phi = (col[:, None] for col in theta.T)  # each (K, 1)
    log_r = np.log(r)
    r_phi = np.exp(phi * log_r)
    n_eff = n_once + r_phi * n_rec
    log_n_eff = np.log(n_eff)
    t1 = a - alpha * log_n_eff
    t2 = b - beta * log_d
    t3 = np.broadcast_to(e, t1.shape)
    top = np.maximum(np.maximum(t1, t2), t3)  # shift for a stable log-sum-exp
    e1, e2, e3 = np.exp(t1 - top), np.exp(t2 - top), np.exp(t3 - top)
    total = e1 + e2 + e3
    return top + np.log(total), (e1 / total, e2 / total, e3 / total), log_n_eff, r_phi * log_r * n_rec / n_eff


def objective(theta: np.ndarray, data: FitData, weights: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Weighted summed Huber loss of the log-sum-exp law and its analytic gradient, for K parameter sets.

    theta (K, 6) in THETA order, weights (K, n) (ones, or bootstrap multiplicities). Returns f (K,), grad (K, 6).
    With t1 = a - alpha log N_eff, t2 = b - beta log D, t3 = e, softmax weights w_i = exp(t_i - LSE) and
    psi = clip(residual, -delta, delta) (the Huber derivative):
    df/da = sum psi w1, df/dalpha = -sum psi w1 log N_eff, df/db = sum psi w2, df/dbeta = -sum psi w2 log D,
    df/de = sum psi w3, df/dphi = -alpha sum psi w1 r^phi log(r) N_rec / N_eff.
    """
    log_l_hat, (w1, w2, w3), log_n_eff, dlog_neff_dphi = law_log_loss(theta, data.r, data.n_once, data.n_rec,
                                                                       data.log_d)
    residual = log_l_hat - data.log_l
    size = np.abs(residual)
    huber = np.where(size <= delta, 0.5 * residual * residual, delta * (size - 0.5 * delta))
    f = (weights * huber).sum(axis=1)
    psi = weights * np.clip(residual, -delta, delta)
    p1, p2, p3 = psi * w1, psi * w2, psi * w3
    grad = np.stack([p1.sum(1), -(p1 * log_n_eff).sum(1), p2.sum(1), -(p2 * data.log_d).sum(1), p3.sum(1),
                     -(theta[:, 1] * (p1 * dlog_neff_dphi).sum(1))], axis=1)
    return f, grad


def unweighted_objective(data: FitData, delta: float) -> BatchObjective:
    """``objective`` with every run weighted 1, as ``analysis.optimize.minimize_batch`` calls it."""
    ones = np.ones((1, data.n_runs))
    return lambda x, rows: objective(x, data, ones, delta)
