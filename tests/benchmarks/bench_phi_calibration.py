"""Calibration of phi's 95% profile interval: coverage of the truth on simulated sweeps of the demo's design and
the paper's, with independent noise and with the cell-level offsets real sweeps show, under the nested F test as
shipped (pinned runs left out of the Huber slope, the cells' design effect: analysis/profile_interval.py,
analysis/overdispersion.py) and as it was before (baseline, same runs, same fits).

    python tests/benchmarks/bench_phi_calibration.py                         # 200 sweeps per design and noise
    python tests/benchmarks/bench_phi_calibration.py --design demo --noise offsets --sweeps 50

Designs: ``paper``, the paper's 116-run grid (6 budgets x r in {1, 2, 4, 8}, its widths) under its law
(phi = 0.459); ``demo``, the shipped demo's design (3 budgets over 4.5x x r in {1, 2, 4}, 3 widths per cell
around the optimum, warmdown branches) under the toy-scale law of bench_demo_design.py (phi = 0.46).
Noise: ``independent``, per run only (paper 0.01 nats, demo 0.03); ``offsets``, at the level real sweeps show:
for the paper the simulated objective's defaults (objectives/noise.py: 0.008 per run, 0.005 per cell, 0.004
misspecification in width, sized to the paper's refit residuals), for the demo 0.03 per run and 0.010 per cell,
the variances ``analysis.overdispersion.cell_variances`` found in the real demo sweep's residuals (seed 0,
2026-12-06). A sweep's interval covers the truth when the test does not reject phi held there (the interval is the
set the test accepts, so this is exact); the shipped interval's width is its profile's (``--profiles`` sweeps per
setting). Quality figures: not timing-sensitive.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the simulated grid
sys.path.insert(0, str(Path(__file__).resolve().parent))      # the demo's design and toy law

from bench_demo_design import DESIGNS, TOY_LAW, simulated_runs  # noqa: E402
from loopscale.analysis import fit_joint_law  # noqa: E402
from loopscale.analysis.fit_problem import FitData, fit_rows  # noqa: E402
from loopscale.analysis.law_jacobian import log_loss  # noqa: E402
from loopscale.analysis.options import FitOptions  # noqa: E402
from loopscale.analysis.profile_interval import NestedTest, fit_at_phi, profile_phi, theta_of  # noqa: E402
from loopscale.model import PAPER_LAW  # noqa: E402
from loopscale.objectives import simulate  # noqa: E402
from test_analysis_sim import trial_configs  # noqa: E402

DEMO = DESIGNS[-1]  # the shipped design
NOISE = {("paper", "independent"): (0.01, 0.0, 0.0), ("paper", "offsets"): (0.008, 0.005, 0.004),
         ("demo", "independent"): (0.03, 0.0, 0.0), ("demo", "offsets"): (0.03, 0.010, 0.0)}


def sweep(design: str, noise: str, seed: int) -> tuple[pd.DataFrame, float]:
    """A simulated sweep's runs table and the truth of phi."""
    per_run, per_cell, misspec = NOISE[design, noise]
    if design == "demo":
        return simulated_runs(DEMO, seed, per_run, cell_noise=per_cell, misspec=misspec), TOY_LAW.phi
    rows = []
    for i, config in enumerate(trial_configs(PAPER_LAW, per_run, seed)):
        metrics = simulate(dataclasses.replace(config, cell_noise=per_cell, misspec=misspec))
        rows.append({"run_id": f"sim{i}", "stage": "search", **{k: v for k, v in metrics.items() if k != "reason"},
                     "reason": ""})
    return pd.DataFrame(rows), PAPER_LAW.phi


def before(data: FitData, theta: np.ndarray, f_min: float, delta: float, n_free: int = 6) -> NestedTest:
    """The test as it was before the calibration (the baseline): every residual inside delta counted toward the
    Huber slope, no design effect."""
    u = log_loss(theta[None], data.r, data.n_once, data.n_rec, data.log_d)[0] - data.log_l
    psi = np.clip(u, -delta, delta)
    inside = max(int((np.abs(u) <= delta).sum()), 1) / data.n_runs
    dof = data.n_runs - n_free
    return NestedTest(f_min=f_min, scale=float((psi ** 2).sum() / max(dof, 1) / (2 * inside)), dof=dof)


def one(design: str, noise: str, seed: int, options: FitOptions, with_profile: bool) -> dict:
    runs, truth = sweep(design, noise, seed)
    data = FitData.from_runs(fit_rows(runs, options))
    fit = fit_joint_law(runs, options=options)
    theta = theta_of(fit)
    warm = theta.copy()
    warm[5] = truth
    f_truth = fit_at_phi(data, truth, warm, options)[1]
    shipped, old = NestedTest.at(data, theta, fit.huber, options.delta), before(data, theta, fit.huber, options.delta)
    level = 1 - options.confidence
    row = {"shipped": shipped.p(f_truth) > level, "before": old.p(f_truth) > level,
           "design_effect": shipped.design_effect, "slope_ratio": shipped.scale / shipped.design_effect / old.scale,
           "phi": fit.phi, "runs": data.n_runs}
    if with_profile:
        lo, hi = profile_phi(data, theta, fit.huber, options).ci
        row["width"] = hi - lo
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=200)
    parser.add_argument("--profiles", type=int, default=30, help="sweeps per setting whose interval width is taken")
    parser.add_argument("--design", choices=("paper", "demo", "both"), default="both")
    parser.add_argument("--noise", choices=("independent", "offsets", "both"), default="both")
    parser.add_argument("--starts", type=int, default=60)
    args = parser.parse_args()
    options = FitOptions(n_starts=args.starts, n_bootstrap=0)
    designs = ("demo", "paper") if args.design == "both" else (args.design,)
    print(f"{args.sweeps} simulated sweeps per design and noise, {args.starts} starts, widths over the first "
          f"{args.profiles}; coverage of the truth by phi's 95% profile interval")
    print(f"{'design':>6} {'noise':>12} {'runs':>5} {'sd(phi)':>8} {'before':>8} {'shipped':>8} "
          f"{'width shipped':>14} {'design effect (median, 90th)':>29} {'slope ratio':>12}")
    for design in designs:
        for noise in ("independent", "offsets") if args.noise == "both" else (args.noise,):
            begin = time.perf_counter()
            t = pd.DataFrame([one(design, noise, seed, options, seed < args.profiles) for seed in range(args.sweeps)])
            print(f"{design:>6} {noise:>12} {int(t['runs'].median()):>5} {t['phi'].std():>8.3f} "
                  f"{100 * t['before'].mean():>7.1f}% {100 * t['shipped'].mean():>7.1f}% "
                  f"{t['width'].median():>14.3f} "
                  f"{t['design_effect'].median():>14.2f}, {t['design_effect'].quantile(0.9):>5.2f}{'':>8} "
                  f"{t['slope_ratio'].median():>12.2f}   ({time.perf_counter() - begin:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
