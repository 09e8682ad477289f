"""The simulated objective's deviations from the law: what makes a replayed study look like a measured one.

A real study's losses do not scatter independently around its fitted law: the paper's residuals are about
0.01 nats and correlated within a (budget, r) cell (a cell's runs share their data order, their learning-rate
transfer and whatever the law's form misses at that scale). Independent noise alone makes a replay's
bootstrap intervals over-optimistic and its per-cell parabolas better than they would be. So the simulated
log-loss is, for a trial at width s in cell (C, r)::

    log L_obs = log L_law + (offset_cell + wiggle_cell(log s) + noise * z) / L_law

* ``noise * z``, z ~ N(0, 1) drawn per trial: independent noise (a run's seed, its data order);
* ``offset_cell ~ N(0, cell_noise^2)``: one shift shared by every run of the cell;
* ``wiggle_cell(x) = misspec * sqrt(2 / K) * sum_k g_k cos(2 pi x / P_k + p_k)``, g_k ~ N(0, 1), phases
  p_k ~ U(0, 2 pi), periods P_k log-uniform in [2, 8] (log width): a smooth, stationary random curve in log
  width with standard deviation ``misspec`` (random Fourier features of a Gaussian process), i.e. a
  misspecification that moves each cell's true optimum a little away from the law's.

Every draw is seeded (the per-trial z by (seed, C, r, width) of the run; the cell's offset and curve by
(seed, C, r) of the point: a warmdown branch at C_k < C shares its trial's z and has cell (C_k, r)'s offset),
so the same trial always returns the same loss and a resumed sweep reproduces an uninterrupted one.
Defaults are sized so that a replay of the paper's 116-run grid, fitted like the paper, gives R^2 of about
0.997 and residuals of about 0.01 nats that are correlated within cells (tests/test_simulate_noise.py
measures both).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

FEATURES = 4            # K, cosine features of the smooth deviation
PERIODS = (2.0, 8.0)    # their periods in log width: a tilt or bend over a cell's span (~0.7), not a jitter


@dataclass(frozen=True)
class Noise:
    """Sizes (nats) of the three deviations; ``Noise()`` is the default of the simulated objective."""

    noise: float = 0.008       # independent, per trial
    cell_noise: float = 0.005  # per-cell offset
    misspec: float = 0.004     # smooth deviation in log width, per cell

    def deviation(self, *, seed: int, budget: float, r: int, width: int, run_budget: float | None = None) -> float:
        """The deviation (nats) of the point at ``width`` in cell (budget, r) from the law's loss, measured by
        the run of budget ``run_budget`` (default ``budget``; a warmdown branch's run is its trial's)."""
        cell = _rng(f"{seed}|{budget:.6e}|{r}|cell")
        offset = cell.gauss(0.0, 1.0) * self.cell_noise
        x = math.log(width)
        wiggle = 0.0
        for _ in range(FEATURES):
            period = math.exp(cell.uniform(math.log(PERIODS[0]), math.log(PERIODS[1])))
            wiggle += cell.gauss(0.0, 1.0) * math.cos(2 * math.pi * x / period + cell.uniform(0.0, 2 * math.pi))
        run = budget if run_budget is None else run_budget
        z = _rng(f"{seed}|{run:.6e}|{r}|{width}").gauss(0.0, 1.0)
        return offset + self.misspec * math.sqrt(2.0 / FEATURES) * wiggle + self.noise * z

    def observe(self, clean: float, **trial: float) -> float:
        """The observed loss given the law's ``clean`` loss: log L_obs = log L + deviation / L."""
        return math.exp(math.log(clean) + self.deviation(**trial) / clean)


def _rng(key: str) -> random.Random:
    return random.Random(hashlib.sha256(key.encode()).digest())
