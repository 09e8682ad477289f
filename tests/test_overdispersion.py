"""The cell-level random effect behind the nested F test's design effect (analysis/overdispersion.py): its
variances recovered from scores projected off a fit's Jacobian, and the factor it gives."""

from __future__ import annotations

import numpy as np
import pytest

from loopscale.analysis.overdispersion import cell_variances, design_effect

CELLS, PER_CELL, FREE = 60, 5, 6


def _scores(sigma: float, tau: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores psi = M (Z c + e) of a linear fit with FREE columns, as a fit's score equations leave them."""
    rng = np.random.default_rng(seed)
    cell = np.repeat(np.arange(CELLS), PER_CELL)
    jacobian = rng.standard_normal((cell.size, FREE))
    raw = tau * rng.standard_normal(CELLS)[cell] + sigma * rng.standard_normal(cell.size)
    projected = raw - jacobian @ np.linalg.lstsq(jacobian, raw, rcond=None)[0]
    return projected, jacobian, cell


def test_the_variances_of_a_run_and_of_its_cell_are_recovered_through_the_fits_projection():
    estimates = np.array([cell_variances(*_scores(1.0, 0.7, seed)) for seed in range(10)])
    assert estimates.mean(axis=0) == pytest.approx([1.0, 0.49], abs=0.08)


def test_independent_scores_give_a_design_effect_near_1_and_cell_offsets_one_near_kishs():
    independent = [design_effect(*_scores(1.0, 0.0, seed), FREE) for seed in range(10)]
    shared = [design_effect(*_scores(1.0, 1.0, seed), FREE) for seed in range(10)]
    assert min(independent) >= 1.0 and np.mean(independent) < 1.15
    assert np.mean(shared) == pytest.approx(1 + (PER_CELL - 1) * 0.5, rel=0.15)  # rho = 1/2, 5 runs per cell
