"""Search quality on the simulated replay of the paper's study (run on demand; prints figures, asserts nothing).

    python tests/benchmarks/bench_search_quality.py [--seeds 40] [--workers 4] [--methods law,gp,...]
                                                    [--set information=2 ...] [--by-budget]
                                                    [--first-seed 0] [--dump seeds.csv]

The ``paper`` preset replayed with ``objective = "simulate"`` and its shipped noise (objectives/noise.py:
independent noise, a per-cell offset and a smooth per-cell deviation in log width), on the preset's cells: the
paper's 24 and the two cheap budgets below them the preset adds (search/presets/paper.toml). Every method runs
through the code a sweep runs: ``tune.studies.make_studies`` and ``CellSearcher`` (suggest / on_trial_complete,
as Tune calls them), on ``--workers`` simulated slots where a trial takes time proportional to its budget, so
the cost-aware order and the early stops act as in a sweep. Methods:

* ``paper grid``: the paper's own widths per budget (docs/paper.md; chosen with hindsight), on the paper's 24 cells;
* ``random`` / ``tpe`` / ``gp``: the per-cell Optuna studies, as many trials per cell as the paper grid used at
  that budget (4-6; at a budget below the paper's, as at its smallest);
* ``law``: the law sampler without warmdown branches (``branches = false``);
* ``law+branches``: the preset as shipped (sampler "law", ``trials_per_cell`` a cap, ``tolerance``, trials
  record warmdown branches where they land in an open smaller cell: ``branches = true``; a located cell takes
  more widths while they pay for themselves in var(phi): ``information = 1``). A branch point is a run row of
  its own in the fit (analysis.runs.expand_branches), its cost is in its trial's FLOPs;
* ``law+b info 0``: the same with ``information = 0`` (a cell stops once its optimum is located).

Each seed changes the noise draws (offsets and curves included) and the samplers' seeds. The runs of a
method are then analysed like ``loopscale analyze`` does: the joint fit (``fit_joint_law``: its bootstrap over
cells, with the trials of warmdown branch points) and the per-cell parabolas (``cell_optima``). Reported per
method, over the cells it ran: phi's RMSE against the law's 0.459, how often the 95% interval covers it and its
median width (the paper's own interval, 0.41-0.53, is 0.12 wide: docs/paper.md); the share of cells with an interior
optimum (column "paper": of the paper's cells alone); the share whose optimum (the parabola's width, else the
best run's) is within one step of the paper's grid of the true optimum (noise-free loss with the cell's offset
and curve; below the paper's budgets, its smallest budget's step); the mean regret at that width (millinats);
trials; and the total FLOPs spent relative to what the paper grid spent on its 24 cells (computed here by
model.accounting); with ``--by-budget``, that share and the trials per cell at each budget, next to the fewest
the bracket rule allows (``law_sampler.fewest_trials``), which says where a method spends above that floor.

Against the paper grid, on the same seeds (the same noise draws: the comparison is paired): the ratio of phi's
RMSE to the grid's with a 95% interval (seeds resampled, 2,000 draws), the share of seeds whose phi lies within
0.03 of 0.459, and var * FLOPs against the grid's (below 1: more precision per FLOP than the grid). The RMSE of
n seeds is itself uncertain by about 1 / sqrt(2 n) of itself (16% at 20 seeds), hence the default of 40.
``--dump`` writes every method's per-seed phi, interval and FLOPs, for questions the summary does not answer
(bias, the tails of the errors).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loopscale.analysis import cell_optima, fit_joint_law  # noqa: E402
from loopscale.analysis.flops import PAPER_GRID  # noqa: E402
from loopscale.analysis.runs import expand_branches  # noqa: E402
from loopscale.model import PAPER_LAW  # noqa: E402
from loopscale.objectives import TrialConfig, simulate  # noqa: E402
from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.law_sampler import fewest_trials  # noqa: E402
from loopscale.search.space import Cell, search_cell  # noqa: E402
from loopscale.search.tune.searcher import CellSearcher  # noqa: E402
from loopscale.search.tune.studies import make_studies  # noqa: E402

METHODS = ("paper grid", "random", "tpe", "gp", "law", "law+branches", "law+b info 0")


def add_set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a key of the paper preset, as `loopscale search --set` does (repeatable)")


def paper_replay(sets: list[str]) -> SweepSpec:
    """The ``paper`` preset with ``objective = "simulate"`` and the ``--set`` items."""
    with tempfile.TemporaryDirectory() as tmp:  # the spec's tracking check needs a writable place, never used
        return SweepSpec.from_toml("paper", sets, objective="simulate", tracking_uri=f"sqlite:///{tmp}/unused.db")


def run(spec: SweepSpec, cell: Cell, s: float) -> dict:
    return {**simulate(spec.trial_config(cell, s)), "stage": "search"}


def truth(spec: SweepSpec, cell: Cell) -> tuple[float, float]:
    """(s*, L*) without the per-trial noise (the cell's offset and curve stay) over every allowed width."""
    quiet = dataclasses.replace(spec, simulation=dataclasses.replace(spec.simulation, noise=0.0),
                                grid=dataclasses.replace(spec.grid, tokens_per_param=None))
    allowed = search_cell(quiet.grid, quiet.sampling.trials_per_cell, cell.budget, cell.r).widths
    return min(((s, run(quiet, cell, s)["val_loss"]) for s in allowed), key=lambda t: t[1])


def sweep(method: str, spec: SweepSpec, workers: int,
          searcher_class: type[CellSearcher] = CellSearcher) -> pd.DataFrame:
    """The runs of one method: CellSearcher (or a subclass: bench_law_refit times its calls) on ``workers``
    slots, a trial lasting its budget / 1e17 time units."""
    spec = dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, branches=method.startswith("law+b")))
    if method == "law+b info 0":
        spec = dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, information=0.0))
    cells = spec.cells()
    if method == "paper grid":
        return pd.DataFrame([run(spec, c, s) for c, s in paper_grid_points(spec)])
    if not method.startswith("law"):
        spec = dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, sampler=method))
        # as many trials per cell as the grid used at that budget (cells() caps trials_per_cell by the widths)
        cells = [dataclasses.replace(c, n_trials=min(len(paper_widths(c.budget)), len(c.widths))) for c in cells]
    searcher = searcher_class(make_studies(spec, "search", None, cells))
    clock, running, rows, n = 0.0, [], [], 0
    while True:
        while len(running) < workers:
            config = searcher.suggest(str(n))
            if config is None or config == CellSearcher.FINISHED:
                break
            heapq.heappush(running, (clock + config["trial"]["budget_flops"] / 1e17, n, config))
            n += 1
        if not running:
            return runs_table(rows)
        clock, trial_id, config = heapq.heappop(running)
        result = {**simulate(TrialConfig.from_params(config["trial"])), "stage": "search"}
        searcher.on_trial_complete(str(trial_id), result)
        rows.append(result)


def runs_table(rows: list[dict]) -> pd.DataFrame:
    """The runs of simulated trials (their result dicts) as ``loopscale analyze`` reads them: one row per trial,
    and one per warmdown branch point (analysis.runs.expand_branches)."""
    return expand_branches(pd.DataFrame(rows).assign(run_id=[str(i) for i in range(len(rows))], branch_of=""))


def paper_grid_points(spec: SweepSpec) -> list[tuple[Cell, int]]:
    """(cell, s) of the paper's 116-run grid among ``spec``'s cells: its widths at each of its budgets (the
    preset's cheaper budgets have none)."""
    return [(c, s) for c in spec.cells() if c.budget in PAPER_GRID for s in PAPER_GRID[c.budget]]


def paper_widths(budget: float) -> tuple[int, ...]:
    """The paper grid's widths at this budget; below the paper's budgets, those of its smallest."""
    return PAPER_GRID.get(budget, PAPER_GRID[min(PAPER_GRID)])


def grid_step(budget: float, s_true: float) -> float:
    """The paper grid's spacing around s* at this budget (its end spacing when s* lies outside the grid)."""
    g = paper_widths(budget)
    inside = [b - a for a, b in zip(g, g[1:]) if a <= s_true <= b]
    return max(inside) if inside else (g[1] - g[0] if s_true < g[0] else g[-1] - g[-2])


def grid_flops(spec: SweepSpec) -> float:
    """FLOPs the paper's 116-run grid spends on the paper's cells of ``spec`` (model.accounting, through the
    simulated trial)."""
    return sum(run(spec, c, s)["flops_spent"] for c, s in paper_grid_points(spec))


def bracket_floor(spec: SweepSpec) -> float:
    """FLOPs of the fewest trials the bracket rule allows (``law_sampler.fewest_trials``: 3 in each r's largest
    cell, none in the ``deferred_budgets`` cells just below it, 1 in every other cell with warmdown branches,
    whose own cost is left out), each at the cell's first guess. No sampler of the rule that gives each smaller
    cell its first trial spends less; every wasted guess is above it."""
    fewest = fewest_trials(spec.cells(), branches=True, deferred=spec.sampling.deferred_budgets)
    return sum(fewest[c.key] * run(spec, c, c.first_guess)["flops_spent"] for c in spec.cells())


def branch_warmdowns(spec: SweepSpec) -> float:
    """FLOPs of the warmdowns of the branch points every cell below each r's largest needs besides its own
    fewest trials (``fewest_trials``: 3 - 0 in a deferred cell, 3 - 1 in the others): what the
    design that ``bracket_floor`` counts adds to it at the least, even if it knows every optimum. Each costs its
    trial the warmdown of a run of the cell (objectives/branches.py), taken here from a trial of the next budget
    up at the cell's first guess."""
    cells = spec.cells()
    fewest = fewest_trials(cells, branches=True, deferred=spec.sampling.deferred_budgets)
    total = 0.0
    for c in cells:
        above = [o for o in cells if o.r == c.r and o.budget > c.budget]
        if above:
            up = min(above, key=lambda o: o.budget)
            plain = spec.trial_config(up, c.first_guess)
            branched = dataclasses.replace(plain, branch_budgets=(c.budget,))
            total += (3 - fewest[c.key]) * (simulate(branched)["flops_spent"] - simulate(plain)["flops_spent"])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="run seeds first-seed .. first-seed + seeds - 1 (fresh seeds check a setting chosen "
                             "on others)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--starts", type=int, default=100, help="random starts of each joint fit")
    parser.add_argument("--dump", metavar="CSV",
                        help="also write each method's per-seed phi, its 95%% interval and FLOPs to CSV")
    parser.add_argument("--by-budget", action="store_true",
                        help="also print each method's FLOPs and own trials per cell at each budget")
    add_set_option(parser)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    base = paper_replay(args.set)
    reference = grid_flops(base)
    floor = bracket_floor(base)
    warmdowns = branch_warmdowns(base)
    cells_at = Counter(c.budget for c in base.cells())  # cells per budget (every seed has the same cells)
    sim, sampling = base.simulation, base.sampling
    print(f"paper replay: {len(base.cells())} cells, noise {sim.noise} / cell {sim.cell_noise} / misspec "
          f"{sim.misspec} nats, {args.seeds} seeds ({args.first_seed}-{args.first_seed + args.seeds - 1}), "
          f"{args.workers} workers; paper grid {reference:.3g} FLOPs; "
          f"law preset: cap {sampling.trials_per_cell} trials per cell, tolerance {sampling.tolerance} (log width); "
          "the "
          f"bracket rule's floor (3 trials in each r's largest cell, none in the {sampling.deferred_budgets} budget(s) "
          f"just below it while a cheaper one remains, 1 elsewhere, branches "
          f"free) {floor / reference:.1%} of the grid, {(floor + warmdowns) / reference:.1%} with the warmdowns "
          f"of the branch points that bracket the other cells")
    print(f"{'method':<11} {'phi RMSE':>8} {'CI covers':>9} {'CI width':>8} {'interior':>8} {'paper':>6} "
          f"{'<=1 step':>8} {'regret':>7} {'trials':>6} {'points':>6} {'FLOPs/grid':>10}  time")
    errors, costs, per_seed = {}, {}, []
    for method in args.methods.split(","):
        started = time.perf_counter()
        phis, covers, widths, interior, paper, hits, regret, trials, points, flops = ([] for _ in range(10))
        by_budget: dict[float, list[tuple[float, float]]] = {}  # budget -> (FLOPs share, own trials per cell) per seed
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            spec = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, seed=seed))
            runs = sweep(method, spec, args.workers).assign(status="ok")
            fit = fit_joint_law(runs, n_starts=args.starts)
            phis.append(fit.phi)
            covers.append(fit.phi_ci[0] <= PAPER_LAW.phi <= fit.phi_ci[1])
            widths.append(fit.phi_ci[1] - fit.phi_ci[0])
            optima = cell_optima(runs, n_bootstrap=0).table.set_index(["budget_flops", "r"])
            for cell in spec.cells():
                if (cell.budget, cell.r) not in optima.index:
                    continue  # the paper grid runs the paper's cells only
                s_true, l_true = truth(spec, cell)
                row = optima.loc[(cell.budget, cell.r)]
                ok = row["status"] == "ok"
                interior.append(ok)
                if cell.budget in PAPER_GRID:
                    paper.append(ok)
                own = runs[(runs["budget_flops"] == cell.budget) & (runs["r"] == cell.r)]
                s = (row["width_opt"] / spec.grid.width_unit) if ok else float(own.loc[own["val_loss"].idxmin(), "s"])
                s = min(cell.widths, key=lambda w: abs(math.log(w / s)))
                hits.append(abs(s - s_true) <= grid_step(cell.budget, s_true) + 1e-9)
                quiet = dataclasses.replace(spec, simulation=dataclasses.replace(spec.simulation, noise=0.0))
                regret.append(1000 * (run(quiet, cell, s)["val_loss"] - l_true))
            own = runs[runs["branch_of"] == ""] if "branch_of" in runs else runs  # a branch's cost is its trial's
            trials.append(len(own))
            points.append(len(runs))
            flops.append(own["flops_spent"].sum() / reference)
            per_seed.append({"method": method, "seed": seed, "phi": fit.phi, "phi_low": fit.phi_ci[0],
                             "phi_high": fit.phi_ci[1], "flops_vs_grid": flops[-1]})
            for budget, n_cells in cells_at.items():
                spent = own[own["budget_flops"] == budget]
                by_budget.setdefault(budget, []).append((spent["flops_spent"].sum() / reference, len(spent) / n_cells))
        errors[method], costs[method] = np.array(phis) - PAPER_LAW.phi, statistics.fmean(flops)
        rmse = math.sqrt(statistics.fmean((p - PAPER_LAW.phi) ** 2 for p in phis))
        print(f"{method:<11} {rmse:>8.3f} {np.mean(covers):>9.0%} {np.median(widths):>8.3f} {np.mean(interior):>8.1%} "
              f"{np.mean(paper):>6.1%} {np.mean(hits):>8.1%} {statistics.fmean(regret):>7.2f} "
              f"{statistics.fmean(trials):>6.1f} {statistics.fmean(points):>6.1f} {statistics.fmean(flops):>10.0%}  "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        if args.by_budget:
            # the bracket rule's fewest trials, for the law sampler with or without branches as this method runs it
            fewest = fewest_trials(base.cells(), branches=method.startswith("law+b"),
                                   deferred=base.sampling.deferred_budgets)
            rule = {c.budget: fewest[c.key] for c in base.cells()}  # the same for every r of a budget here
            for budget in sorted(by_budget, reverse=True):
                share, per_cell = np.mean(by_budget[budget], axis=0)
                floor_note = f" (fewest the bracket rule allows: {rule[budget]})" if method.startswith("law") else ""
                print(f"    {budget:9.3g}: {share:6.1%} of the grid's FLOPs, {per_cell:.2f} own trials per cell"
                      f"{floor_note}")
    if args.dump:
        pd.DataFrame(per_seed).to_csv(args.dump, index=False)
    if "paper grid" in errors:
        paired(errors, costs)


def paired(errors: dict[str, np.ndarray], costs: dict[str, float]) -> None:
    """Each method against the paper grid on the same seeds (module docstring)."""
    print(f"against the paper grid, same seeds: {'method':<12} {'RMSE ratio (95% CI)':>21} {'|err|<=0.03':>11} "
          f"{'var*FLOPs':>9}")
    for method, err in errors.items():
        ratio, (low, high) = rmse_ratio(err, errors["paper grid"])
        print(f"{'':<36}{method:<12} {ratio:>6.2f} ({low:.2f} to {high:.2f}) {np.mean(np.abs(err) <= 0.03):>11.0%} "
              f"{ratio ** 2 * costs[method] / costs['paper grid']:>9.2f}")


def rmse_ratio(err: np.ndarray, grid: np.ndarray) -> tuple[float, tuple[float, float]]:
    """(RMSE of ``err`` / RMSE of ``grid``, its 95% interval): the errors of the same seeds, resampled together
    (2,000 draws, seeded)."""
    draws = np.random.default_rng(0).integers(0, grid.size, size=(2000, grid.size))
    boot = np.sqrt((err[draws] ** 2).mean(axis=1) / (grid[draws] ** 2).mean(axis=1))
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(np.sqrt((err ** 2).mean() / (grid ** 2).mean())), (float(low), float(high))


if __name__ == "__main__":
    main()
