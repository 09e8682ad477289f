"""How much a sweep's cell-level offsets inflate the nested F test's scale: a design effect from a random effect.

Real sweeps' residuals are not independent: the runs of one (budget, r) cell share a shift (their data order and
init seed, the learning rate transferred to them, whatever the law's form misses at that scale), and phi is
measured between cells (every run of a cell has the same r). A test that takes the residuals as independent is
then too sure: phi's profile interval covered the truth on 81% (the paper's design) and 61% (the demo's) of
simulated sweeps with such offsets (docs/log.md, 2026-12-06 (12)). The model of the fit's Huber scores
psi_i = clip(u_i, -delta, delta) (u the residuals of log L at the optimum) is one-way random effects,

    psi = M (Z c + e),   c ~ N(0, tau^2 I_g),   e ~ N(0, sigma^2 I_n),   M = I - J (J^T J)^+ J^T

with Z the runs' cell indicators and J = d log L / d theta at the optimum (``analysis.law_jacobian``): the fit's
score equations J^T psi = 0 project the scores off the span of J, which absorbs part of every cell's shift. The
variances come from the method of moments on the within-cell and between-cell sums of squares, W = I - P_Z and
P_Z (Z's cell-mean projection), whose expectations are E[psi^T Q psi] = sigma^2 tr(M Q M) + tau^2 tr(M Q M Z Z^T)
(an ANOVA estimator of variance components, the fit's projection taken out; Searle, Casella & McCulloch 1992).
With rho = tau^2 / (tau^2 + sigma^2) the intraclass correlation and m = sum_c n_c^2 / n the runs per cell a run
sees, the score's variance grows by Kish's design effect (Kish 1965, Survey Sampling)

    deff = (1 + (m - 1) rho) (sigma^2 + tau^2) / s^2,   s^2 = sum psi_i^2 / (n - k)

over the i.i.d. estimate s^2 the test would use, and the F statistic's scale by the same factor; deff is held at
>= 1 (a negative tau^2 estimate is noise, not evidence of anticorrelation), and is exactly 1 when the estimate of
tau^2 is not positive. Measured on >= 200 simulated sweeps of the demo's design and the paper's
(tests/benchmarks/bench_phi_calibration.py): with it the interval covers the truth ~95% with cell offsets at the
level real sweeps show. A sandwich variance for the held constant alone ((J^T J)^-1 J^T V J (J^T J)^-1 over the
i.i.d. one, V from the same two variances) covered within a sweep of it on 60 sweeps of each design and noise,
so the factor that needs no choice of constant is kept: Delta-phi's test (seven constants) uses it unchanged.
"""

from __future__ import annotations

import numpy as np


def cell_variances(psi: np.ndarray, jacobian: np.ndarray, cell: np.ndarray) -> tuple[float, float]:
    """(sigma^2, tau^2): the scores' own variance and their cells' shared one, by the method of moments on
    the within- and between-cell sums of squares, the fit's projection taken out. A tau^2 estimate <= 0 (or a
    degenerate design, e.g. one run per cell) gives (sum psi^2 / tr M, 0): the i.i.d. estimate.

    Every trace is taken without an n x n matrix (Q idempotent, M = I - J G J^T, G = (J^T J)^+):
    tr(M Q M) = tr(Q) - tr(G J^T Q J) and tr(M Q M Z Z^T) = ||Q M Z||_F^2, so a sweep of thousands of runs costs
    O(n (g + k) k)."""
    codes = np.unique(cell, return_inverse=True)[1]
    counts = np.bincount(codes).astype(float)
    indicator = np.eye(counts.size)[codes]                      # Z, (n, g)
    gram = np.linalg.pinv(jacobian.T @ jacobian)                 # G

    def between(x: np.ndarray) -> np.ndarray:                    # P_Z x: each run's cell mean, per column
        return indicator @ ((indicator.T @ x).T / counts).T

    def within(x: np.ndarray) -> np.ndarray:
        return x - between(x)

    off_fit = indicator - jacobian @ (gram @ (jacobian.T @ indicator))  # M Z
    moments = np.array([[trace - np.trace(gram @ jacobian.T @ q(jacobian)), float((q(off_fit) ** 2).sum())]
                        for q, trace in ((within, psi.size - counts.size), (between, counts.size))])
    sums = np.array([psi @ within(psi), psi @ between(psi)])
    iid = (float(psi @ psi / (psi.size - np.trace(gram @ jacobian.T @ jacobian))), 0.0)
    if np.linalg.matrix_rank(moments) < 2:
        return iid
    sigma2, tau2 = np.linalg.solve(moments, sums)
    return (float(sigma2), float(tau2)) if sigma2 > 0 and tau2 > 0 else iid


def design_effect(psi: np.ndarray, jacobian: np.ndarray, cell: np.ndarray, n_free: int) -> float:
    """The factor (>= 1) by which cell-level offsets inflate the variance of the fit's Huber scores ``psi``
    (n,) over the i.i.d. estimate sum psi^2 / (n - k), k = ``n_free`` (the free constants; ``jacobian``
    linearises the law in its own six, which Delta-phi's model shares)."""
    n = psi.size
    if n <= n_free:
        return 1.0
    sigma2, tau2 = cell_variances(psi, jacobian, cell)
    if tau2 <= 0:
        return 1.0
    counts = np.bincount(cell)
    per_cell = float((counts.astype(float) ** 2).sum() / n)
    rho = tau2 / (sigma2 + tau2)
    return max((1 + (per_cell - 1) * rho) * (sigma2 + tau2) / float(psi @ psi / (n - n_free)), 1.0)
