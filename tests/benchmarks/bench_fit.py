"""Joint-law fit time and accuracy: today's variable-projection fit against the paper's 500 random starts, and the
profile of the objective over phi against one fixed-phi fit per phi, all measured in the same run.

    python tests/benchmarks/bench_fit.py            # 200 bootstrap resamples (the paper's settings)
    python tests/benchmarks/bench_fit.py --quick    # 50 resamples

Runs are simulated from the paper's law with 0.01-nat noise (objectives.simulate) on grids around the paper's:
half of its widths, the grid itself (116 runs), every even-to-odd width in between (dense), the dense grid twice
with different noise seeds, and the dense grid twice at r = 1 only (a plain study: phi held at 0). Per grid:
the fit with its block bootstrap by ``fit_joint_law`` (new) and by 500 seeded random starts through the same
batched optimiser, polish and bootstrap (old, tests/multistart.py, its bootstrap pruning its off-basin starts
after the optimiser's default 500 iterations, as before, instead of ``BOOTSTRAP_PRUNE_AFTER``: the fit as it was
made before variable projection, number for number); their CPU seconds and ratio, the relative
difference of the minimised objective (new - old: negative is a lower optimum), the largest relative difference
of the six constants, and phi with its interval by each. Then the profile: the fixed-phi fits analyze's profile
makes (``profile_interval.fit_at_phi``, one batch warm from the joint optimum) at 40 phis against 40 fixed-phi
fits by ``fit_joint_law``. Times are CPU seconds of this process (wall seconds in brackets):
on a shared machine the wall time swings with the neighbours' load, the CPU time much less. BLAS runs on one
thread (set before numpy loads), as on the 2 cores the goals are stated for.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import inspect  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the simulated grid and the reference

import loopscale.analysis.bootstrap as bootstrap  # noqa: E402
from loopscale.analysis import FitOptions, fit_joint_law  # noqa: E402
from loopscale.analysis.fit import joint_problem  # noqa: E402
from loopscale.analysis.fit_types import CONSTANTS, constants_of  # noqa: E402
from loopscale.analysis.optimize import minimize_batch  # noqa: E402
from loopscale.analysis.profile_interval import fit_at_phi, theta_of  # noqa: E402
from multistart import multistart_fit  # noqa: E402
from test_analysis_sim import PAPER_GRID, paper_runs  # noqa: E402

PROFILE_PHIS = np.linspace(-0.5, 1.5, 40)


def grids() -> dict[str, pd.DataFrame]:
    half = {c: s[::2] if len(s[::2]) >= 3 else s[:3] for c, s in PAPER_GRID.items()}
    dense = {c: tuple(range(s[0], s[-1] + 1)) for c, s in PAPER_GRID.items()}
    return {
        "half": paper_runs(noise=0.01, grid=half),
        "paper": paper_runs(noise=0.01),
        "dense": paper_runs(noise=0.01, grid=dense),
        "dense x2": pd.concat([paper_runs(noise=0.01, grid=dense, seed=s) for s in (0, 1)], ignore_index=True),
        "plain x2": pd.concat([paper_runs(noise=0.01, grid=dense, seed=s, recurrences=(1,)) for s in (0, 1)],
                              ignore_index=True),
    }


def timed(call):
    begin, wall = time.process_time(), time.perf_counter()
    result = call()
    return result, time.process_time() - begin, time.perf_counter() - wall


def interval(draws: np.ndarray, confidence: float) -> str:
    """phi's percentile interval from bootstrap draws (phi is the last column in THETA and CONSTANTS order)."""
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(draws[:, 5], [tail, 100 - tail])
    return f"{lo:.3f}-{hi:.3f}"


def old_fit(runs: pd.DataFrame, options: FitOptions) -> tuple[np.ndarray, float, np.ndarray]:
    """The fit as it was before variable projection: 500 random starts, and the bootstrap's starts pruned on the
    optimiser's default schedule."""
    projected = bootstrap.BOOTSTRAP_PRUNE_AFTER
    bootstrap.BOOTSTRAP_PRUNE_AFTER = inspect.signature(minimize_batch).parameters["prune_after"].default
    try:
        return multistart_fit(runs, options)
    finally:
        bootstrap.BOOTSTRAP_PRUNE_AFTER = projected


def compare_fits(n_boot: int) -> None:
    options = FitOptions(n_bootstrap=n_boot, stage=None)
    print(f"fit with {n_boot} block-bootstrap resamples: new (variable projection) vs old ({options.n_starts} random "
          "starts), CPU s (wall)")
    print(f"{'grid':>9} {'runs':>5} {'new s':>13} {'old s':>13} {'old/new':>7} {'d obj':>9} {'d const':>8} "
          f"{'starts':>6} {'phi new':>8} {'CI new':>12} {'CI old':>12}")
    for name, runs in grids().items():
        new, new_cpu, new_wall = timed(lambda: fit_joint_law(runs, options=options))
        (theta, f, boot), old_cpu, old_wall = timed(lambda: old_fit(runs, options))
        old_constants = constants_of(theta[None])[0]
        diff = np.abs([getattr(new, c) for c in CONSTANTS] - old_constants)
        d_const = np.max(diff / np.where(old_constants == 0, 1.0, np.abs(old_constants)))  # phi held at 0: absolute
        print(f"{name:>9} {len(runs):>5} {new_cpu:>6.2f} {f'({new_wall:.2f})':>6} {old_cpu:>6.2f} "
              f"{f'({old_wall:.2f})':>6} {old_cpu / new_cpu:>7.1f} {(new.huber - f) / f:>+9.1e} {d_const:>8.1e} "
              f"{new.n_starts:>6} {new.phi:>8.3f} {interval(new.bootstrap, options.confidence):>12} "
              f"{interval(boot, options.confidence):>12}")


def compare_profile() -> None:
    runs = paper_runs(noise=0.01)
    options = FitOptions(n_bootstrap=0, stage=None)
    problem, _ = joint_problem(runs, options)
    joint = theta_of(fit_joint_law(runs, options=options))
    (_, profile), new_cpu, new_wall = timed(lambda: fit_at_phi(problem.data, PROFILE_PHIS,
                                                               np.tile(joint, (len(PROFILE_PHIS), 1)), options))
    fits, old_cpu, old_wall = timed(lambda: [fit_joint_law(runs, options=options, fix_phi=p).huber
                                             for p in PROFILE_PHIS])
    worst = float(np.max((profile - fits) / fits))
    print(f"profile over {len(PROFILE_PHIS)} phis, paper grid: fit_at_phi {new_cpu:.2f} s ({new_wall:.2f}), "
          f"{len(PROFILE_PHIS)} fixed-phi fits {old_cpu:.2f} s ({old_wall:.2f}): {old_cpu / new_cpu:.1f}x less CPU; "
          f"largest (profile - fit) / fit {worst:+.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 bootstrap resamples")
    args = parser.parse_args()
    compare_fits(50 if args.quick else 200)
    compare_profile()


if __name__ == "__main__":
    main()
