"""How the joint law is fitted: the parameter order, the box bounds and the options of ``fit_joint_law``
(analysis/fit.py and analysis/bootstrap.py carry the method and its sources).

Kept apart from the fit so that the command line can offer these choices without loading scipy and pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Internal parameter order of theta; the public constants are (E, A, alpha, B, beta, phi).
THETA = ("a", "alpha", "b", "beta", "e", "phi")
DATA_MODES = ("all", "frontier", "optima")
INTERVAL_METHODS = ("auto", "block", "residual")
# Bounds on the work of one analysis, far above real use (the paper's sweep has 116 runs; the defaults are 500
# starts and 200 resamples), checked before any work. The bootstrap refits its resamples at once, keeping per
# resample and start a weight and a log-loss per run: at the bounds about 2 GB in all (analysis/optimize.py
# evaluates the objective in slices, so its temporaries do not grow with them). A start holds O(1) memory, but
# costs the time of one fit. The runs table (runs.validate_runs) counts warmdown branch points as runs.
MAX_RUNS = 2_000
MAX_STARTS = 20_000
MAX_BOOTSTRAP = 5_000


@dataclass(frozen=True)
class Bounds:
    """Box bounds of the log-space parameters (the paper's)."""

    a: tuple[float, float] = (-5.0, 35.0)
    alpha: tuple[float, float] = (0.0, 2.5)
    b: tuple[float, float] = (-5.0, 35.0)
    beta: tuple[float, float] = (0.0, 2.5)
    e: tuple[float, float] = (-3.0, 2.0)
    phi: tuple[float, float] = (-3.0, 3.0)

    def __post_init__(self) -> None:
        for name in THETA:
            lo, hi = getattr(self, name)
            if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
                raise ValueError(f"bounds for {name} must be finite with lower <= upper, got ({lo}, {hi})")

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) in THETA order."""
        pairs = np.array([getattr(self, name) for name in THETA], dtype=float)
        return pairs[:, 0], pairs[:, 1]


DEFAULT_BOUNDS = Bounds()


@dataclass(frozen=True)
class FitOptions:
    """How ``fit_joint_law`` fits. Defaults follow the paper.

    n_starts: at most this many starts of the 6-parameter fit: the local minima of the objective over a grid of
        the exponents, with E, A and B solved at each grid point (analysis.projection), best first; the paper
        takes 500 random starts, which find the same optimum (tests/test_fit_projection.py).
    data: "all" runs, only the per-r Pareto "frontier", or the per-cell IsoFLOP "optima" (analysis.isoflop).
    stage: only runs of this stage are fitted (None: every stage).
    fix_phi: hold phi at this value (0 and 1 are the paper's restricted fits; a per-r fit with phi = 0 is a
        plain Chinchilla fit on N = N_once + N_rec), within ``bounds.phi``: the box a fitted phi is held to,
        and beyond it r^phi overflows (1e308) long before the fit could say so.
    bootstrap_starts: starts per bootstrap resample: the full-data optimum plus the next-best distinct local
        minima found by the main fit.
    interval: "block" or "residual" bootstrap, or "auto" to choose by the cells (``interval_method``).
    """

    delta: float = 1e-3
    n_starts: int = 500
    max_iter: int = 10_000
    n_bootstrap: int = 200
    bootstrap_starts: int = 4
    confidence: float = 0.95
    seed: int = 0
    bounds: Bounds = DEFAULT_BOUNDS
    fix_phi: float | None = None
    data: str = "all"
    stage: str | None = "search"
    interval: str = "auto"

    def __post_init__(self) -> None:
        lo, hi = self.bounds.phi
        checks = [
            (self.delta > 0, f"delta must be positive, got {self.delta}"),
            (1 <= self.n_starts <= MAX_STARTS, f"n_starts must be between 1 and {MAX_STARTS:,} (each start is "
                                               f"one more fit to run), got {self.n_starts:,}"),
            (self.max_iter >= 1, f"max_iter must be >= 1, got {self.max_iter}"),
            (0 <= self.n_bootstrap <= MAX_BOOTSTRAP, f"n_bootstrap must be between 0 and {MAX_BOOTSTRAP:,} (the "
                                                     "resamples are refitted at once, memory growing with "
                                                     f"resamples x runs), got {self.n_bootstrap:,}"),
            (self.bootstrap_starts >= 1, f"bootstrap_starts must be >= 1, got {self.bootstrap_starts}"),
            (0 < self.confidence < 1, f"confidence must be in (0, 1), got {self.confidence}"),
            (self.data in DATA_MODES, f"data must be one of {DATA_MODES}, got {self.data!r}"),
            (self.interval in INTERVAL_METHODS, f"interval must be one of {INTERVAL_METHODS}, got {self.interval!r}"),
            (self.fix_phi is None or np.isfinite(self.fix_phi), f"fix_phi must be finite, got {self.fix_phi}"),
            (self.fix_phi is None or not np.isfinite(self.fix_phi) or lo <= self.fix_phi <= hi,
             f"fix_phi {self.fix_phi} is outside the fit's bounds on phi, {lo:g} to {hi:g}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


DEFAULT_FIT_OPTIONS = FitOptions()
