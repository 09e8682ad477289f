"""Search quality on the simulated replay of the paper's study (run on demand; prints figures, asserts nothing).

    python tests/benchmarks/bench_search_quality.py [--seeds 8] [--noise 0.01]

For every (C, r) cell of the ``paper`` preset the noise-free law (the paper's fit, objectives.simulate with
noise 0) gives the true optimal width s* over every width the preset allows. Each method then gets exactly as
many simulated trials per cell as the paper's fixed grid used at that budget (4-6), with seeded noise of
``--noise`` nats on every loss:

* ``paper grid``: the paper's own widths per budget (PAPER.md; chosen with hindsight of where optima lie);
* ``random``: uniform random widths (log scale) in the cell's window, without replacement;
* ``tpe`` / ``gp``: loopscale's per-cell Optuna study (``search.tune_runner.CellStudy``, exactly what a sweep
  runs: first guess at ~20 tokens per parameter, widths without replacement), driven ask/tell without Ray.

A cell's best width is read two ways: the width of the lowest observed loss, and the paper's per-cell method,
a parabola in log N through the cell's trials (vertex clipped to the tried range, the nearest allowed width).
Reported: the share of cells whose best width is within one step of the paper's grid of s* (the grid's local
spacing around s*: 2 at the four lower budgets, 2-6 above), the share within +-2 (one width step of the
template), and the regret, the noise-free loss at the chosen width minus the true optimum (in millinats).
Every seed changes both the noise draws and the samplers' seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loopscale.model import count_params  # noqa: E402
from loopscale.objectives import simulate  # noqa: E402
from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.spec import Cell  # noqa: E402
from loopscale.search.tune_runner import CellStudy  # noqa: E402

PAPER_GRID = {4.64e17: [6, 8, 10, 12], 1e18: [6, 8, 10, 12, 14], 2.15e18: [8, 10, 12, 14, 16],
              4.64e18: [10, 12, 14, 16, 18, 20], 1e19: [12, 16, 18, 20, 24], 2.15e19: [18, 24, 28, 34]}
METHODS = ("paper grid", "random", "tpe", "gp")


def loss(spec: SweepSpec, cell: Cell, s: float, noise: float) -> float:
    return simulate({**spec.trial_config(cell, s), "noise": noise})["val_loss"]


def truth(spec: SweepSpec, cell: Cell) -> tuple[float, float]:
    """(s*, L*) of the noise-free law over every width with at least min_steps optimizer steps."""
    allowed = dataclasses.replace(spec, tokens_per_param=None)._cell(cell.budget, cell.r).widths
    return min(((s, loss(spec, cell, s, 0.0)) for s in allowed), key=lambda t: t[1])


def observe(method: str, spec: SweepSpec, cell: Cell, n: int, noise: float) -> list[tuple[float, float]]:
    if method == "paper grid":
        return [(s, loss(spec, cell, s, noise)) for s in PAPER_GRID[cell.budget]]
    sampler = {"tpe": "tpe", "gp": "gp", "random": "random"}[method]
    study = CellStudy(dataclasses.replace(spec, sampler=sampler), dataclasses.replace(cell, n_trials=n),
                      spec.trial_config(cell, cell.first_guess))
    points = []
    for _ in range(n):
        number, config = study.ask()
        value = simulate({**config, "noise": noise})["val_loss"]
        study.tell(number, value)
        points.append((config["s"], value))
    return points


def best_width(spec: SweepSpec, cell: Cell, points: list[tuple[float, float]], how: str) -> float:
    s, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    lowest = float(s[np.argmin(y)])
    if how == "lowest" or len(set(s)) < 3:
        return lowest
    log_n = lambda w: math.log(count_params(spec.model(w, cell.r)).N)  # noqa: E731
    x = np.array([log_n(w) for w in s])
    a, b, _ = np.polyfit(x, y, 2)
    if a <= 0:
        return lowest
    vertex = min(max(-b / (2 * a), x.min()), x.max())
    return min(spec.s_values(), key=lambda w: abs(log_n(w) - vertex))


def grid_step(budget: float, s_true: float) -> float:
    """The paper grid's spacing around s* at this budget (its end spacing when s* lies outside the grid)."""
    g = PAPER_GRID[budget]
    inside = [b - a for a, b in zip(g, g[1:]) if a <= s_true <= b]
    return max(inside) if inside else (g[1] - g[0] if s_true < g[0] else g[-1] - g[-2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--noise", type=float, default=0.01)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:  # the spec's tracking check needs a writable place, never used
        base = SweepSpec.from_toml("paper", objective="simulate", tracking_uri=f"sqlite:///{tmp}/unused.db")
    cells = base.cells()
    truths = {c.key: truth(base, c) for c in cells}
    print(f"paper replay: {len(cells)} cells, noise {args.noise} nats, {args.seeds} seeds, "
          f"trials per cell = the paper grid's count at that budget ({sum(len(PAPER_GRID[c.budget]) for c in cells)}"
          f" per seed); true s*: " + ", ".join(f"{k} {v[0]:g}" for k, v in truths.items()))
    print(f"{'method':<11} {'read as':<9} {'<=1 grid step':>13} {'<=2 in s':>9} {'regret mean':>11} "
          f"{'p90':>6} {'max':>6}  (millinats)  time")
    for method in METHODS:
        started = time.perf_counter()
        hits = {how: [0, 0] for how in ("lowest", "parabola")}
        regrets = {how: [] for how in hits}
        for seed in range(args.seeds):
            spec = dataclasses.replace(base, seed=seed)
            for cell in cells:
                n = min(len(PAPER_GRID[cell.budget]), len(cell.widths))
                points = observe(method, spec, cell, n, args.noise)
                s_true, l_true = truths[cell.key]
                for how in hits:
                    s = best_width(spec, cell, points, how)
                    hits[how][0] += abs(s - s_true) <= grid_step(cell.budget, s_true) + 1e-9
                    hits[how][1] += abs(s - s_true) <= 2 + 1e-9
                    regrets[how].append(1000 * (loss(spec, cell, s, 0.0) - l_true))
        elapsed = time.perf_counter() - started
        total = args.seeds * len(cells)
        for how in hits:
            r = sorted(regrets[how])
            print(f"{method:<11} {how:<9} {hits[how][0] / total:>13.1%} {hits[how][1] / total:>9.1%} "
                  f"{statistics.fmean(r):>11.2f} {r[int(0.9 * len(r))]:>6.2f} {r[-1]:>6.2f}  "
                  f"{'' if how == 'parabola' else f'{elapsed:.0f} s'}")


if __name__ == "__main__":
    main()
