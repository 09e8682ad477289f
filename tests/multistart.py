"""The joint fit as the paper makes it, the reference the variable-projection fitter is measured against:
``n_starts`` seeded uniform random starts in the box, all in one batch (``analysis.optimize``), the best polished
by L-BFGS-B on the same objective (``analysis.fit.polish``), then the bootstrap from the same generator
(``analysis.bootstrap``). tests/test_fit_projection.py compares the optima, tests/benchmarks/bench_fit.py the
times.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from loopscale.analysis.bootstrap import refit_resamples
from loopscale.analysis.fit import joint_problem, polish
from loopscale.analysis.fit_objective import unweighted_objective
from loopscale.analysis.optimize import minimize_batch
from loopscale.analysis.options import FitOptions


def multistart_fit(runs: pd.DataFrame, options: FitOptions) -> tuple[np.ndarray, float, np.ndarray]:
    """(theta in THETA order, objective, the bootstrap's (B, 6) theta) of the best of ``options.n_starts`` random
    starts, polished."""
    problem, _ = joint_problem(runs, options)
    rng = np.random.default_rng(options.seed)
    starts = problem.random_starts(options.n_starts, rng)
    main = minimize_batch(unweighted_objective(problem.data, options.delta), starts, problem.lower, problem.upper,
                          max_iter=options.max_iter)
    best = int(np.argmin(main.f))
    theta, f = polish(problem, main.x[best], main.f[best])
    return theta, f, refit_resamples(problem, theta, main, rng).theta
