"""Joint-law fit time and accuracy against the number of runs, next to a per-start scipy baseline.

    python tests/benchmarks/bench_fit.py            # 500 starts, 200 bootstrap resamples (the paper's settings)
    python tests/benchmarks/bench_fit.py --quick    # 100 starts, 50 resamples

Runs are simulated from the paper's law with 0.01-nat noise (objectives.simulate) on grids around the paper's:
half of its widths, the grid itself (116 runs), every even-to-odd width in between (dense), and the dense grid
twice with different noise seeds. Accuracy: |phi - 0.459| and the width of phi's 95% interval. Baseline,
measured in the same run: one scipy L-BFGS-B call per start on the same objective and gradient (the textbook
loop), timed on 40 starts of the 116-run grid and scaled to the batched fit's number of optimisations.
Times are CPU seconds of this process (wall seconds in brackets): on a shared machine the wall time of a
20 ms optimisation swings with the neighbours' load, its CPU time much less. BLAS runs on one thread
(set before numpy loads): with OpenBLAS's default thread pool, scipy's L-BFGS-B, which calls BLAS on
6-element vectors, measured ~10x slower here (~75 ms instead of ~7 ms a start), which would flatter the
batched fit.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.optimize import minimize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the simulated grid

from loopscale.analysis import DEFAULT_BOUNDS, fit_joint_law  # noqa: E402
from loopscale.analysis.fit_objective import objective  # noqa: E402
from loopscale.analysis.fit_problem import FitData  # noqa: E402
from loopscale.model import PAPER_LAW  # noqa: E402
from test_analysis_sim import PAPER_GRID, paper_runs  # noqa: E402


def grids() -> dict[str, pd.DataFrame]:
    half = {c: s[::2] if len(s[::2]) >= 3 else s[:3] for c, s in PAPER_GRID.items()}
    dense = {c: tuple(range(s[0], s[-1] + 1)) for c, s in PAPER_GRID.items()}
    return {
        "half": paper_runs(noise=0.01, grid=half),
        "paper": paper_runs(noise=0.01),
        "dense": paper_runs(noise=0.01, grid=dense),
        "dense x2": pd.concat([paper_runs(noise=0.01, grid=dense, seed=s) for s in (0, 1)], ignore_index=True),
    }


def scipy_seconds_per_start(runs: pd.DataFrame, starts: int) -> float:
    data = FitData.from_runs(runs)
    lower, upper = DEFAULT_BOUNDS.arrays()
    ones = np.ones((1, data.r.size))
    rng = np.random.default_rng(0)

    def fun(x):
        f, g = objective(x[None], data, ones, 1e-3)
        return float(f[0]), g[0]

    begin = time.process_time()
    for x0 in lower + (upper - lower) * rng.random((starts, 6)):
        minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=list(zip(lower, upper)),
                 options={"maxiter": 10_000, "ftol": 1e-15, "gtol": 1e-12})
    return (time.process_time() - begin) / starts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 starts and 50 resamples")
    args = parser.parse_args()
    n_starts, n_boot = (100, 50) if args.quick else (500, 200)
    print(f"fit: {n_starts} starts, {n_boot} block-bootstrap resamples x 4 starts; truth phi = {PAPER_LAW.phi}")
    print(f"{'grid':>9} {'runs':>5} {'cpu s':>6} {'(wall)':>8} {'phi':>7} {'|err|':>6} {'CI':>15} {'width':>6} "
          f"{'status':>10}")
    timings = {}
    for name, runs in grids().items():
        begin, wall = time.process_time(), time.perf_counter()
        fit = fit_joint_law(runs, n_starts=n_starts, n_bootstrap=n_boot)
        seconds, wall = time.process_time() - begin, time.perf_counter() - wall
        timings[name] = (len(runs), seconds)
        lo, hi = fit.phi_ci
        print(f"{name:>9} {len(runs):>5} {seconds:>6.2f} {f'({wall:.2f})':>8} {fit.phi:>7.3f} "
              f"{abs(fit.phi - PAPER_LAW.phi):>6.3f} {lo:>7.3f}-{hi:<7.3f} {hi - lo:>6.3f} {fit.status.value:>10}")
    per_start = scipy_seconds_per_start(grids()["paper"], 40)
    optimisations = n_starts + 4 * n_boot
    baseline = per_start * optimisations
    runs, ours = timings["paper"]
    print(f"baseline (one scipy L-BFGS-B call per start), {runs} runs: {1000 * per_start:.1f} CPU ms per start x "
          f"{optimisations} optimisations = {baseline:.1f} s; batched fit {ours:.2f} s: {baseline / ours:.1f}x less CPU")


if __name__ == "__main__":
    main()
