"""How precisely a design of runs can measure phi for its FLOPs, on the simulated replay of the paper's study
(run on demand; prints figures, asserts nothing). Designs use the ``paper`` preset's cells (the paper's 24 and
the 8 of the two cheap budgets the preset adds); the paper grid runs on the paper's 24.

    python tests/benchmarks/bench_phi_information.py [--seeds 12] [--check-seeds 40] [--fit-seeds 80]
                                                     [--set information=2 ...]

A design is a set of runs (budget, r, width), each a trial of its own or a warmdown branch of one. With the
law's true parameters and the simulate objective's errors (objectives/noise.py: a run's own noise, shared by
its branch points; an offset shared by a cell; a smooth deviation in log width, whose covariance at distance d
is misspec^2 E_P[cos(2 pi d / P)] over its periods P), the least-squares fit of log L has, linearised,

    var(theta_hat) = H J^T Sigma J H,   H = (J^T J)^-1,   J = d log L / d theta (law_sampler.log_loss_jacobian),

and phi's standard deviation is the root of its diagonal entry. No Monte Carlo noise: two designs compare
exactly. Printed:

1. the check: the paper grid's linearised sd against the RMSE of ``--check-seeds`` simulated grid sweeps fitted
   by least squares (how far to trust the linearisation), and what each error source alone gives;
2. designs: the paper grid, and the law sampler as the paper preset ships it (or as ``--set`` changes it) and
   with ``information = 0`` (``--seeds`` sweeps each, as bench_search_quality runs them): FLOPs / the grid's,
   mean sd(phi), and the variance-cost product var * FLOPs against the grid's (below 1: more precision per FLOP
   than the grid);
3. bounds: a greedy design that knows the true law and the cells' true optima adds, one at a time, the trial
   or branch point that removes the most variance of phi per FLOP, up to a share of the grid's FLOPs; once
   starting from the bracket rule's fewest trials (3 around each r's largest cell's optimum, branched into the
   cell just below it, and 1 at every other cell's), once from one trial per cell. What a sampler that must also
   find the optima can hope for;
4. the bounds without the linearisation: the bracket-rule greedy designs at 50% and 60% of the grid's FLOPs
   simulated on ``--fit-seeds`` seeds and fitted like ``loopscale analyze`` fits (``fit_joint_law``, its point
   estimate), paired with the grid on the same seeds: phi's RMSE, its ratio to the grid's with a 95% interval
   over resampled seeds (as bench_search_quality prints it) and the share of seeds within 0.03 of 0.459.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_search_quality as quality  # noqa: E402
from loopscale.analysis import fit_joint_law  # noqa: E402
from loopscale.model import PAPER_LAW, count_params, tokens_for_budget  # noqa: E402
from loopscale.objectives import simulate  # noqa: E402
from loopscale.objectives.noise import PERIODS  # noqa: E402
from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.law_sampler import _log_loss, fewest_trials, log_loss_jacobian  # noqa: E402

TRUE = np.array([math.log(PAPER_LAW.A), PAPER_LAW.alpha, math.log(PAPER_LAW.B), PAPER_LAW.beta,
                 math.log(PAPER_LAW.E), PAPER_LAW.phi])
REACH = 0.6  # log width around a cell's true optimum that the greedy bound may use
FIT_LIMITS = (0.50, 0.60)  # shares of the grid's FLOPs whose bracket-rule bounds section 4 fits


class Designs:
    """sd(phi) of designs of one spec: points are (budget, r, s, run), ``run`` naming the trial that ran it."""

    def __init__(self, spec: SweepSpec):
        self.spec = spec
        self.cells = {(c.budget, c.r): c for c in spec.cells()}
        self.rows: dict[tuple[float, int, float], tuple[np.ndarray, float]] = {}
        periods = np.exp(np.linspace(math.log(PERIODS[0]), math.log(PERIODS[1]), 2001))
        self.lag = np.linspace(0.0, 4.0, 2001)
        # E over log-uniform periods of cos(2 pi d / P): the smooth deviation's correlation at log-width lag d
        self.corr = np.cos(2 * np.pi * self.lag[:, None] / periods).mean(axis=1)

    def row(self, budget: float, r: int, s: float) -> tuple[np.ndarray, float]:
        """(d log L / d theta, L) of the law at a run."""
        key = (budget, r, s)
        if key not in self.rows:
            model = self.spec.grid.model(s, r)
            sizes = count_params(model)
            log_d = math.log(tokens_for_budget(model, budget, self.spec.grid.batch_tokens))
            jac = log_loss_jacobian(TRUE, float(r), np.array([float(sizes.N_once)]), np.array([float(sizes.N_rec)]),
                                    np.array([log_d]))[0]
            self.rows[key] = jac, PAPER_LAW.loss(sizes.N_once, sizes.N_rec, r, math.exp(log_d))
        return self.rows[key]

    def sd_phi(self, points: list[tuple[float, int, float, object]], noise: float | None = None,
               cell_noise: float | None = None, misspec: float | None = None) -> float:
        spec = self.spec
        noise = spec.simulation.noise if noise is None else noise
        cell_noise = spec.simulation.cell_noise if cell_noise is None else cell_noise
        misspec = spec.simulation.misspec if misspec is None else misspec
        rows = [self.row(b, r, s) for b, r, s, _ in points]
        jac = np.array([j for j, _ in rows])
        loss = np.array([v for _, v in rows])
        budget, r = np.array([p[0] for p in points]), np.array([p[1] for p in points])
        log_s = np.log([p[2] for p in points])
        ids = {run: i for i, run in enumerate(dict.fromkeys(p[3] for p in points))}
        run = np.array([ids[p[3]] for p in points])
        same_run = run[:, None] == run[None]
        same_cell = (budget[:, None] == budget[None]) & (r[:, None] == r[None])
        smooth = np.interp(np.abs(log_s[:, None] - log_s[None]), self.lag, self.corr)
        sigma = noise ** 2 * same_run + same_cell * (cell_noise ** 2 + misspec ** 2 * smooth)
        sigma /= np.outer(loss, loss)  # a deviation of d nats moves log L by d / L
        h = np.linalg.pinv(jac.T @ jac)
        return float(math.sqrt((h @ jac.T @ sigma @ jac @ h)[5, 5]))

    def grid(self) -> list[tuple[float, int, float, object]]:
        return [(c.budget, c.r, s, (c.budget, c.r, s)) for c, s in quality.paper_grid_points(self.spec)]

    def flops(self, points: list[tuple[float, int, float, object]]) -> float:
        """FLOPs of a design: a trial its budget, a branch point a fifth of its budget (its warmdown)."""
        return sum(b if run == (b, r, s) else 0.2 * b for b, r, s, run in points)


def ols_phi(runs) -> float:
    """phi of the least-squares fit of log L (the linearisation's estimator), started at the truth."""
    r, n_once, n_rec = (runs[c].to_numpy(float) for c in ("r", "N_once", "N_rec"))
    log_d, log_l = np.log(runs["tokens"].to_numpy(float)), np.log(runs["val_loss"].to_numpy(float))
    fit = least_squares(lambda th: _log_loss(th[None], r, n_once, n_rec, log_d)[0] - log_l, TRUE, method="lm")
    return float(fit.x[5])


def simulated_runs(spec: SweepSpec, points: list[tuple[float, int, float, object]]) -> pd.DataFrame:
    """The runs table of a design on ``spec``'s seed: each trial simulated with the warmdown branches its
    points name (objectives.simulate), its branch points expanded into rows as ``loopscale analyze`` reads them."""
    cells = {(c.budget, c.r): c for c in spec.cells()}
    rows = []
    for budget, r, s, run in points:
        if run == (budget, r, s):
            below = tuple(sorted(p[0] for p in points if p[3] == run and p[:3] != run))
            trial = dataclasses.replace(spec.trial_config(cells[(budget, r)], s), branch_budgets=below)
            rows.append({**simulate(trial), "stage": "search"})
    return quality.runs_table(rows).assign(status="ok")


def greedy(designs: Designs, optimum: dict[tuple[float, int], float], start: list, limit: float,
           reference: float) -> tuple[list, float, float]:
    """(points, sd(phi), FLOPs / reference) of the greedy design grown from ``start`` up to ``limit`` * reference,
    using widths within REACH of each cell's true ``optimum``."""
    widths = {k: [s for s in c.widths if abs(math.log(s / optimum[k])) <= REACH] for k, c in designs.cells.items()}
    points = list(start)
    spent = designs.flops(points)
    while True:
        now = designs.sd_phi(points) ** 2
        have = {p[:3] for p in points}
        trials = [p for p in points if p[3] == p[:3]]
        options = [((b, r, s, (b, r, s)), b) for (b, r), ws in widths.items() for s in ws if (b, r, s) not in have]
        options += [((k, r, s, run), 0.2 * k) for b, r, s, run in trials for (k, rr) in widths
                    if rr == r and k < b and (k, r, s) not in have and s in widths[(k, r)]]
        best = None
        for point, cost in options:
            if spent + cost > limit * reference:
                continue
            gain = (now - designs.sd_phi(points + [point]) ** 2) / cost
            if best is None or gain > best[0]:
                best = (gain, point, cost)
        if best is None:
            return points, designs.sd_phi(points), spent / reference
        points.append(best[1])
        spent += best[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=12, help="law sampler sweeps per variant")
    parser.add_argument("--check-seeds", type=int, default=40, help="simulated grid sweeps for the check")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--fit-seeds", type=int, default=80, help="simulated sweeps per design in section 4")
    quality.add_set_option(parser)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    base = quality.paper_replay(args.set)
    designs = Designs(base)
    grid = designs.grid()
    reference = designs.flops(grid)
    grid_sd = designs.sd_phi(grid)

    print(f"1. check: paper grid, linearised sd(phi) {grid_sd:.4f}; own noise alone "
          f"{designs.sd_phi(grid, cell_noise=0.0, misspec=0.0):.4f}, cell offsets alone "
          f"{designs.sd_phi(grid, noise=0.0, misspec=0.0):.4f}, smooth deviation alone "
          f"{designs.sd_phi(grid, noise=0.0, cell_noise=0.0):.4f}", flush=True)
    phis = [ols_phi(quality.sweep("paper grid", dataclasses.replace(base, sampling=dataclasses.replace(base.sampling,
                                                                                                       seed=seed)),
                                                                                                       args.workers))
            for seed in range(args.check_seeds)]
    rmse = math.sqrt(statistics.fmean((p - PAPER_LAW.phi) ** 2 for p in phis))
    print(f"   {args.check_seeds} simulated grid sweeps, least-squares fit: phi RMSE {rmse:.4f} "
          f"(+-{rmse / math.sqrt(2 * args.check_seeds):.4f}), mean error {statistics.fmean(phis) - PAPER_LAW.phi:+.4f}")

    print(f"2. designs ({args.seeds} seeds each, {args.workers} workers)\n"
          f"   {'design':<28} {'FLOPs/grid':>10} {'sd(phi)':>8} {'var*FLOPs/grid':>14}")
    print(f"   {'paper grid':<28} {1.0:>10.1%} {grid_sd:>8.4f} {1.0:>14.2f}")
    for label, information in ((f"law, information = {base.sampling.information:g}", base.sampling.information),
                               ("law, information = 0", 0.0)):
        sds, shares = [], []
        for seed in range(args.seeds):
            spec = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, seed=seed,
                                                                          information=information))
            runs = quality.sweep("law+branches", spec, args.workers)
            # a point's run is its trial's (budget, r, s): a branch point names its trial by run_id
            trial = {row.run_id: (row.budget_flops, int(row.r), float(row.s)) for row in runs.itertuples()}
            points = [(*trial[row.run_id], trial[row.branch_of or row.run_id]) for row in runs.itertuples()]
            sds.append(designs.sd_phi(points))
            shares.append(runs[runs["branch_of"] == ""]["flops_spent"].sum() / quality.grid_flops(spec))
        sd, share = statistics.fmean(sds), statistics.fmean(shares)
        print(f"   {label:<28} {share:>10.1%} {sd:>8.4f} {sd * sd * share / grid_sd ** 2:>14.2f}", flush=True)

    print("3. bounds: a greedy design knowing the true law and optima, most variance of phi removed per FLOP")
    fewest = fewest_trials(base.cells(), branches=True, deferred=base.sampling.deferred_budgets)
    optimum = {k: quality.truth(base, c)[0] for k, c in designs.cells.items()}

    def nearest(c) -> int:  # index of the cell's width nearest its true optimum
        return min(range(len(c.widths)), key=lambda j: abs(math.log(c.widths[j] / optimum[(c.budget, c.r)])))

    def around(c) -> list[float]:  # that width, with its neighbours in a largest cell
        i = nearest(c)
        return c.widths[max(i - 1, 0):i + 2] if fewest[c.key] == 3 else [c.widths[i]]

    bracket, single, bounds = [], [], {}
    largest = {c.r: c for c in base.cells() if fewest[c.key] == 3}
    for c in base.cells():
        if fewest[c.key] == 0:  # the cell just below the largest: the largest's three trials, branched into it
            top = largest[c.r]
            bracket += [(c.budget, c.r, s, (top.budget, c.r, s)) for s in around(top) if s in c.widths]
        else:
            bracket += [(c.budget, c.r, s, (c.budget, c.r, s)) for s in around(c)]
        s = c.widths[nearest(c)]
        single.append((c.budget, c.r, s, (c.budget, c.r, s)))
    for label, start, limits in (("bracket rule", bracket, (0.50, 0.55, 0.60, 0.65)),
                                 ("one trial per cell", single, (0.40, 0.50, 0.60, 0.80))):
        figures = []
        for limit in limits:
            points, sd, share = greedy(designs, optimum, start, limit, reference)
            figures.append(f"{share:.0%}: {sd:.4f} ({sd * sd * share / grid_sd ** 2:.2f})")
            if label == "bracket rule" and limit in FIT_LIMITS:
                bounds[f"bound at {limit:.0%}"] = points
        print(f"   from the {label:<18} " + ", ".join(figures), flush=True)

    print(f"4. the bracket-rule bounds fitted like `loopscale analyze` (point estimate), {args.fit_seeds} seeds, paired "
          f"with the grid\n   {'design':<16} {'phi RMSE':>8} {'ratio to the grid (95% CI)':>27} {'|err|<=0.03':>11}")
    seeded = [dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, seed=seed))
              for seed in range(args.fit_seeds)]
    errors = {label: np.array([fit_joint_law(simulated_runs(spec, points), n_starts=100, n_bootstrap=0).phi
                               - PAPER_LAW.phi for spec in seeded])
              for label, points in {"paper grid": grid, **bounds}.items()}
    for label, err in errors.items():
        ratio, (low, high) = quality.rmse_ratio(err, errors["paper grid"])
        print(f"   {label:<16} {math.sqrt((err ** 2).mean()):>8.4f} {ratio:>13.2f} ({low:.2f} to {high:.2f}) "
              f"{np.mean(np.abs(err) <= 0.03):>11.0%}", flush=True)


if __name__ == "__main__":
    main()
