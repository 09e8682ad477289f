"""Coverage of phi's 95% interval on simulated 9-cell sweeps (3 budgets x r in {1, 2, 4}), block vs residual
bootstrap, and what ``interval="auto"`` picks.

    python tests/benchmarks/bench_interval_coverage.py                 # 60 seeds, both noise models
    python tests/benchmarks/bench_interval_coverage.py --seeds 100 --noise structured

Sweeps: the paper's law and template on three of its budgets (1e18, 4.64e18, 2.15e19: a 21x span) with its
widths for them (15 runs per r, 45 in all), simulated by ``objectives.simulate`` (0.01 nats of independent
noise per run). ``structured`` noise adds what real sweeps have on top (objectives.noise, the simulated
objective's default sizes): a per-cell offset shared by the runs of a cell (0.005 nats) and a smooth
misspecification in width per cell that the law cannot express (0.004 nats). The truth is the law that made
the data (phi = 0.459).
For each seed and method: does the interval contain the truth, its width, and the share of bootstrap draws
on phi's bounds (-3 or 3; a CI pinned there says nothing). Quality figures: not timing-sensitive.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the simulated grid

from loopscale.analysis import fit_joint_law  # noqa: E402
from loopscale.analysis.bootstrap import block_loss_share, interval_method  # noqa: E402
from loopscale.analysis.fit_problem import FitData  # noqa: E402
from loopscale.analysis.options import DEFAULT_BOUNDS, DEFAULT_FIT_OPTIONS  # noqa: E402
from loopscale.model import PAPER_LAW  # noqa: E402
from loopscale.objectives.noise import Noise  # noqa: E402
from test_analysis_sim import PAPER_GRID, paper_runs  # noqa: E402

BUDGETS = (1e18, 4.64e18, 2.15e19)
STRUCTURE = Noise(noise=0.0)  # the default per-cell offset and misspecification, no extra independent noise


def sweep(seed: int, noise: str) -> pd.DataFrame:
    runs = paper_runs(noise=0.01, seed=seed, grid={c: PAPER_GRID[c] for c in BUDGETS}, recurrences=(1, 2, 4))
    if noise == "structured":
        runs["val_loss"] += [STRUCTURE.deviation(seed=seed, budget=c, r=int(r), width=int(w))
                             for c, r, w in zip(runs["budget_flops"], runs["r"], runs["width"])]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--noise", choices=("independent", "structured", "both"), default="both")
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--bootstrap", type=int, default=200)
    args = parser.parse_args()
    noises = ("independent", "structured") if args.noise == "both" else (args.noise,)
    lo_bound, hi_bound = DEFAULT_BOUNDS.phi
    truth = PAPER_LAW.phi
    begin = time.perf_counter()
    print(f"9-cell sweeps, truth phi = {truth}, {args.seeds} seeds, {args.starts} starts, "
          f"{args.bootstrap} resamples")
    print(f"{'noise':>12} {'method':>9} {'coverage':>9} {'median width':>13} {'mean |err|':>11} "
          f"{'draws at bound':>15} {'CIs touching bound':>19}")
    for noise in noises:
        for method in ("block", "residual"):
            rows = []
            for seed in range(args.seeds):
                fit = fit_joint_law(sweep(seed, noise), n_starts=args.starts, n_bootstrap=args.bootstrap,
                                    interval=method, seed=seed)
                lo, hi = fit.phi_ci
                draws = fit.bootstrap[:, 5]
                at_bound = float(((draws <= lo_bound + 1e-6) | (draws >= hi_bound - 1e-6)).mean())
                rows.append({"covered": lo <= truth <= hi, "width": hi - lo, "err": abs(fit.phi - truth),
                             "at_bound": at_bound, "pinned": lo <= lo_bound + 1e-6 or hi >= hi_bound - 1e-6})
            t = pd.DataFrame(rows)
            print(f"{noise:>12} {method:>9} {100 * t['covered'].mean():>8.1f}% {t['width'].median():>13.3f} "
                  f"{t['err'].mean():>11.3f} {100 * t['at_bound'].mean():>14.1f}% {int(t['pinned'].sum()):>19}")
    data = FitData.from_runs(sweep(0, "independent"))
    print(f"auto picks {interval_method(data, DEFAULT_FIT_OPTIONS)!r} for these sweeps (expected share of block "
          f"resamples keeping too few r's or budgets: {100 * block_loss_share(data):.1f}%); "
          f"{time.perf_counter() - begin:.0f} s")


if __name__ == "__main__":
    main()
