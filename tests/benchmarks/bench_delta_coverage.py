"""Coverage of Delta-phi's 95% interval on simulated sweep pairs with a known Delta: the one-model profile interval
(``analysis.delta``, what ``loopscale compare`` reports) against the interval compare gave before it, the
percentile interval of the differences of the two sweeps' separate bootstrap draws (baseline, same run).

    python tests/benchmarks/bench_delta_coverage.py                      # 100 pairs, independent noise
    python tests/benchmarks/bench_delta_coverage.py --pairs 30 --noise structured

A pair: sweep A under the paper's law on three of its budgets (1e18, 4.64e18, 2.15e19) with its widths, r in
{1, 2, 4}; sweep B the same budgets at r in {2, 4} under the law with phi + Delta, borrowing A's r = 1 runs (as
compare does for a variant without r = 1 runs). Delta cycles through -0.2, 0 and +0.2. Noise: 0.01 nats
independent per run; ``structured`` adds the per-cell offset and the misspecification in width of
``objectives.noise`` (its default sizes), which no interval here models. For each method: coverage of the
true Delta, median width, and over the pairs with Delta = 0 how often the interval excludes 0 (the test's
size; 5% is nominal). Quality figures: not timing-sensitive.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the simulated grid

from loopscale.analysis import fit_joint_law  # noqa: E402
from loopscale.analysis.borrow import with_borrowed_r1  # noqa: E402
from loopscale.analysis.delta import fit_shared_base  # noqa: E402
from loopscale.analysis.options import FitOptions  # noqa: E402
from loopscale.model import PAPER_LAW, JointLaw  # noqa: E402
from loopscale.objectives.noise import Noise  # noqa: E402
from test_analysis_sim import PAPER_GRID, paper_runs  # noqa: E402

BUDGETS = (1e18, 4.64e18, 2.15e19)
DELTAS = (-0.2, 0.0, 0.2)
STRUCTURE = Noise(noise=0.0)  # the default per-cell offset and misspecification, no extra independent noise


def sweep(law: JointLaw, seed: int, recurrences: tuple[int, ...], noise: str) -> pd.DataFrame:
    runs = paper_runs(law, noise=0.01, seed=seed, grid={c: PAPER_GRID[c] for c in BUDGETS}, recurrences=recurrences)
    if noise == "structured":
        runs["val_loss"] += [STRUCTURE.deviation(seed=seed, budget=c, r=int(r), width=int(w))
                             for c, r, w in zip(runs["budget_flops"], runs["r"], runs["width"])]
    return runs


def one_pair(index: int, noise: str, options: FitOptions) -> dict:
    delta = DELTAS[index % len(DELTAS)]
    runs_a = sweep(PAPER_LAW, 2 * index, (1, 2, 4), noise)
    runs_b = sweep(JointLaw(**{**PAPER_LAW.to_dict(), "phi": PAPER_LAW.phi + delta}), 2 * index + 1, (2, 4), noise)
    borrowed, _ = with_borrowed_r1(runs_b, runs_a, options.stage)
    fit_a = fit_joint_law(runs_a, options=options)
    fit_b = fit_joint_law(borrowed, options=options)
    shared = fit_shared_base(runs_a, runs_b, fit_a, fit_b, options)
    tail = 100 * (1 - options.confidence) / 2
    old = np.percentile(fit_b.draws()["phi"].to_numpy() - fit_a.draws()["phi"].to_numpy(), [tail, 100 - tail])
    return {"delta": delta, "profile_lo": shared.ci[0], "profile_hi": shared.ci[1], "profile_est": shared.delta,
            "bootstrap_lo": old[0], "bootstrap_hi": old[1], "bootstrap_est": fit_b.phi - fit_a.phi}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--noise", choices=("independent", "structured"), default="independent")
    parser.add_argument("--starts", type=int, default=100)
    parser.add_argument("--bootstrap", type=int, default=100)
    args = parser.parse_args()
    options = FitOptions(n_starts=args.starts, n_bootstrap=args.bootstrap)
    begin = time.perf_counter()
    rows = pd.DataFrame([one_pair(i, args.noise, options) for i in range(args.pairs)])
    print(f"{args.pairs} sweep pairs ({args.noise} noise), Delta in {DELTAS}, {args.starts} starts, "
          f"{args.bootstrap} resamples per sweep (baseline only), {time.perf_counter() - begin:.0f} s")
    print(f"{'method':>22} {'coverage':>9} {'median width':>13} {'mean |err|':>11} {'excludes 0 at Delta=0':>22}")
    widths = {}
    for method, label in (("profile", "one-model profile"), ("bootstrap", "bootstrap difference")):
        lo, hi, est = rows[f"{method}_lo"], rows[f"{method}_hi"], rows[f"{method}_est"]
        covered = (lo <= rows["delta"]) & (rows["delta"] <= hi)
        null = rows["delta"] == 0
        size = ((lo[null] > 0) | (hi[null] < 0)).mean()
        widths[method] = float((hi - lo).median())
        print(f"{label:>22} {100 * covered.mean():>8.1f}% {widths[method]:>13.3f} "
              f"{(est - rows['delta']).abs().mean():>11.3f} {100 * size:>21.1f}%")
    print(f"width ratio, profile / bootstrap difference: {widths['profile'] / widths['bootstrap']:.2f}")


if __name__ == "__main__":
    main()
