"""A cheap screen of candidate designs: phi's standard deviation from the least-squares fit linearised at the law.

With J = d log L / d theta at every run of a design (``law_sampler.log_loss_jacobian``) and the errors of the
simulated objective (``objectives.noise``): a trial's own noise, shared by its branch points, and a deviation
shared by a cell (its offset, and the smooth curve in width taken as fully shared, its correlation over a
cell's span being near 1), the least-squares estimate of theta has, to first order (the sandwich covariance of
least squares under correlated errors),

    var(theta_hat) = H J^T Sigma J H,   H = (J^T J)^-1,   Sigma_ij = (noise^2 [same trial] + (cell_noise^2 +
    misspec^2) [same cell]) / (L_i L_j)

(a deviation of d nats moves log L by d / L). It ranks designs in milliseconds; the forecast scales it to the
Monte Carlo of the spec's own design and confirms every design it reports by Monte Carlo.
"""

from __future__ import annotations

import math

import numpy as np

from loopscale.model import JointLaw
from loopscale.objectives.noise import Noise

from ..law_sampler import log_loss_jacobian
from .design import Design


def linear_sd_phi(design: Design, law: JointLaw, noise: Noise) -> float:
    """Phi's linearised standard deviation on ``design``'s runs under ``law`` and ``noise``."""
    runs = design.runs
    theta = np.array([math.log(law.A), law.alpha, math.log(law.B), law.beta, math.log(law.E), law.phi])
    r, n_once, n_rec = (runs[c].to_numpy(float) for c in ("r", "N_once", "N_rec"))
    tokens = runs["tokens"].to_numpy(float)
    jac = log_loss_jacobian(theta, r, n_once, n_rec, np.log(tokens))
    loss = np.asarray(law.loss(n_once, n_rec, r, tokens))
    trial = np.where(runs["branch_of"] != "", runs["branch_of"], runs["run_id"]).astype(str)
    budget = runs["budget_flops"].to_numpy(float)
    same_trial = trial[:, None] == trial[None]
    same_cell = (budget[:, None] == budget[None]) & (r[:, None] == r[None])
    sigma = noise.noise ** 2 * same_trial + (noise.cell_noise ** 2 + noise.misspec ** 2) * same_cell
    sigma = sigma / np.outer(loss, loss)
    h = np.linalg.pinv(jac.T @ jac)
    return float(math.sqrt(max((h @ jac.T @ sigma @ jac @ h)[5, 5], 0.0)))
