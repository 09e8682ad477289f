"""What the bracket rule costs a design that knows every optimum, under the shipped noise (run on demand; prints
figures, asserts nothing).

    python tests/benchmarks/bench_bracket_oracle.py [--seeds 40] [--first-seed 100] [--spacings 0.35,0.5,0.7]
                                                    [--shifts 0,0.15] [--reaches 0.5,1] [--no-sampler]

Issue 11 asks the law sampler to match the paper grid's phi RMSE with at most 50% of its FLOPs while every
cell brackets its optimum: a cell is not finished while its best run (on the noisy losses) lacks a run on either
side, unless that side is the edge of its widths. The sampler must find each cell's optimum through the noise.
The oracle here is given it (``bench_search_quality.truth``: the noise-free width, the cell's own offset and curve
kept), so what it spends is what the bracket rule and the noise cost by themselves. Per r, budgets from the
largest down:

* the largest cell: three trials, at the allowed width nearest its true optimum moved ``shift`` down (log width,
  toward the next cell's optimum) and at the widths nearest ``spacing`` below and above that one;
* every trial records a warmdown branch (objectives/branches.py, its cost in the trial's FLOPs) in each smaller
  cell of its r that allows its width, has no run there yet, and whose true optimum lies within ``reach``;
* then every cell in turn: a trial at its true optimum when no branch reached it; then, while its best run
  lacks a run on a side that is not its edge, a trial on that side, the allowed width nearest ``spacing`` from
  the best.

It takes no trial to locate a parabola's vertex (the sampler's ``tolerance``) and none for phi (``information``):
only the bracket. Printed per setting, over the same seeds: FLOPs against the paper grid's, own trials per cell
in each r's two largest budgets, phi's RMSE (``fit_joint_law`` without bootstrap, ``--starts`` starts, as the
grid's) and its ratio to the paper grid's on the same seeds with a 95% interval (seeds resampled), and var *
FLOPs against the grid's. Unless ``--no-sampler``, the law sampler as shipped runs on the same seeds and is
fitted the same way (``bench_search_quality.sweep``, 4 slots), the comparison the oracle is for.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from bench_search_quality import (add_set_option, grid_flops, paper_replay, rmse_ratio, runs_table,  # noqa: E402
                                  sweep, truth)

from loopscale.analysis import fit_joint_law  # noqa: E402
from loopscale.model import PAPER_LAW  # noqa: E402
from loopscale.objectives import simulate  # noqa: E402
from loopscale.objectives.trial import recorded_branches  # noqa: E402
from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.space import Cell  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Setting:
    spacing: float  # log width between a bracket's runs
    shift: float    # log width the largest cell's centre sits below its true optimum
    reach: float    # log width: a branch lands in a cell whose true optimum is this near its width

    def __str__(self) -> str:
        return f"spacing {self.spacing:g}, shift {self.shift:g}, reach {self.reach:g}"


def nearest(widths: tuple[float, ...], target: float, side: int = 0, of: float = 0.0,
            taken: dict[float, float] | None = None) -> float | None:
    """The allowed width nearest ``target`` in log width; with ``side`` (-1 / 1), only those below / above
    ``of``; never one in ``taken``. None when there is none."""
    pool = [w for w in widths if w not in (taken or {}) and (side == 0 or side * (w - of) > 0)]
    return min(pool, key=lambda w: abs(math.log(w / target))) if pool else None


def oracle_runs(spec: SweepSpec, setting: Setting) -> list[dict]:
    """The result dicts of the oracle's trials (module docstring), branch points inside."""
    cells = spec.cells()
    optimum = {c.key: truth(spec, c)[0] for c in cells}
    points: dict[str, dict[float, float]] = {c.key: {} for c in cells}  # the cell's runs: width -> loss
    results: list[dict] = []

    def run_trial(cell: Cell, s: float, below: list[Cell]) -> None:
        reached = [o for o in below if s in o.widths and s not in points[o.key]
                   and abs(math.log(s / optimum[o.key])) <= setting.reach]
        config = dataclasses.replace(spec.trial_config(cell, s), branch_budgets=tuple(o.budget for o in reached))
        result = simulate(config)
        results.append({**result, "stage": "search"})
        points[cell.key][s] = result["val_loss"]
        at = {o.budget: o for o in reached}
        for budget, loss in recorded_branches(result):
            points[at[budget].key][s] = loss

    for r in sorted({c.r for c in cells}):
        down = sorted((c for c in cells if c.r == r), key=lambda c: -c.budget)
        for k, cell in enumerate(down):
            widths, mine, below = cell.widths, points[cell.key], down[k + 1:]
            if k == 0:
                centre = nearest(widths, optimum[cell.key] * math.exp(-setting.shift))
                sides = [nearest(widths, centre * math.exp(side * setting.spacing), side, centre) for side in (-1, 1)]
                for s in (centre, *sides):
                    if s is not None and s not in mine:
                        run_trial(cell, s, below)
            elif not mine:
                run_trial(cell, nearest(widths, optimum[cell.key]), below)
            while True:
                best = min(mine, key=mine.get)
                open_sides = [side for side in (-1, 1) if not any(side * (s - best) > 0 for s in mine)
                              and best != (widths[0] if side < 0 else widths[-1])]
                if not open_sides:
                    break
                side = open_sides[0]
                s = nearest(widths, best * math.exp(side * setting.spacing), side, best, mine)
                if s is None:
                    break
                run_trial(cell, s, below)
    return results


def phi_of(runs: pd.DataFrame, starts: int) -> float:
    return fit_joint_law(runs.assign(status="ok"), n_starts=starts, n_bootstrap=0).phi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--spacings", default="0.35,0.5,0.7")
    parser.add_argument("--shifts", default="0,0.15")
    parser.add_argument("--reaches", default="0.5,1")
    parser.add_argument("--starts", type=int, default=20, help="random starts of each joint fit")
    parser.add_argument("--no-sampler", action="store_true", help="leave out the law sampler's own row")
    add_set_option(parser)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    base = paper_replay(args.set)
    reference = grid_flops(base)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    specs = [dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, seed=seed)) for seed in seeds]
    largest = sorted({c.budget for c in base.cells()})[-2:]
    per_budget = {b: sum(1 for c in base.cells() if c.budget == b) for b in largest}
    started = time.perf_counter()
    grid = np.array([phi_of(sweep("paper grid", spec, 4), args.starts) for spec in specs]) - PAPER_LAW.phi
    grid_rmse = math.sqrt(float(np.mean(grid ** 2)))
    print(f"paper replay: {len(base.cells())} cells, seeds {seeds.start}-{seeds.stop - 1}; paper grid phi RMSE "
          f"{grid_rmse:.4f} ({time.perf_counter() - started:.0f} s)")
    print(f"{'design':<44} {'FLOPs/grid':>10} {'own/cell ' + ' / '.join(f'{b:.3g}' for b in reversed(largest)):>27} "
          f"{'phi RMSE':>8} {'vs grid (95% CI)':>18} {'var*FLOPs':>9}  time")

    def report(name: str, runs_per_seed: list[pd.DataFrame]) -> None:
        own = [runs[runs["branch_of"] == ""] for runs in runs_per_seed]  # a branch's cost is its trial's
        flops = statistics.fmean(o["flops_spent"].sum() / reference for o in own)
        trials = [statistics.fmean(len(o[o["budget_flops"] == b]) / per_budget[b] for o in own) for b in largest]
        err = np.array([phi_of(runs, args.starts) for runs in runs_per_seed]) - PAPER_LAW.phi
        ratio, (low, high) = rmse_ratio(err, grid)
        print(f"{name:<44} {flops:>10.1%} {' / '.join(f'{t:.2f}' for t in reversed(trials)):>27} "
              f"{math.sqrt(float(np.mean(err ** 2))):>8.4f} {ratio:>6.2f} ({low:.2f}-{high:.2f}) "
              f"{ratio ** 2 * flops:>9.2f}  {time.perf_counter() - started:.0f} s", flush=True)

    for spacing in map(float, args.spacings.split(",")):
        for shift in map(float, args.shifts.split(",")):
            for reach in map(float, args.reaches.split(",")):
                started = time.perf_counter()
                setting = Setting(spacing, shift, reach)
                report(f"oracle: {setting}", [runs_table(oracle_runs(spec, setting)) for spec in specs])
    if not args.no_sampler:
        started = time.perf_counter()
        report("law sampler, as shipped", [sweep("law+branches", spec, 4) for spec in specs])


if __name__ == "__main__":
    main()
