"""What the law sampler's refit costs the driver after each finished trial (run on demand; prints figures).

    python tests/benchmarks/bench_law_refit.py [--repeats 3]

The paper's 116-run grid, simulated with the shipped noise, is fed to one ``LawSurrogate`` run by run (cheap
budgets first, as the sampler orders them); every ``add`` refits the joint law warm-started and re-derives each
cell's predicted optimum and its spread. Printed: the median and maximum seconds of one add at 20-59, 60-99 and
100-116 runs, next to the baseline measured in the same run: analysis' full fit of the same 116 runs without its
bootstrap (``fit_joint_law(n_bootstrap=0)``, 500 cold starts).

Then all the sampler costs the driver in a sweep: the ``paper`` preset as it ships (32 cells, branches, the
information rule, the free-slot rule) through bench_search_quality's sweep on 4 simulated slots, ``--seeds``
seeds, with every ``CellSearcher.suggest`` (a proposal, or None when every open cell holds back) and
``on_trial_complete`` (the refit, the cells' status and the branch bookkeeping) timed. Take the figures on idle
cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loopscale.analysis import fit_joint_law  # noqa: E402
from loopscale.analysis.flops import PAPER_GRID  # noqa: E402
from loopscale.objectives import simulate  # noqa: E402
from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.law_sampler import CellGeometry, LawSurrogate  # noqa: E402
from loopscale.search.tune.searcher import CellSearcher  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search_quality import paper_replay, sweep  # noqa: E402


class TimedSearcher(CellSearcher):
    """CellSearcher that records the seconds of each call Tune makes on the driver (over all its sweeps)."""

    seconds: dict[str, list[float]] = {"suggest": [], "on_trial_complete": []}

    def suggest(self, trial_id: str) -> dict | None:
        started = time.perf_counter()
        try:
            return super().suggest(trial_id)
        finally:
            self.seconds["suggest"].append(time.perf_counter() - started)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        started = time.perf_counter()
        try:
            super().on_trial_complete(trial_id, result, error)
        finally:
            self.seconds["on_trial_complete"].append(time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3, help="sweeps of the shipped preset to time the searcher in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = SweepSpec.from_toml("paper", objective="simulate", tracking_uri=f"sqlite:///{tmp}/unused.db")
    # every width of the grid inside its cell
    spec = dataclasses.replace(spec, grid=dataclasses.replace(spec.grid, tokens_per_param=None))
    cells = [c for c in spec.cells() if c.budget in PAPER_GRID]  # the paper's 24 cells and its 116 runs
    runs = [(c, s, simulate(spec.trial_config(c, s))) for c in cells for s in PAPER_GRID[c.budget]]
    seconds: dict[str, list[float]] = {"20-59": [], "60-99": [], "100+": []}
    for _ in range(args.repeats):
        surrogate = LawSurrogate([CellGeometry.of(spec, c) for c in cells], seed=0, tolerance=spec.sampling.tolerance)
        for n, (cell, s, result) in enumerate(runs, start=1):
            heads = round(s * spec.grid.width_unit / spec.grid.head_dim)
            started = time.perf_counter()
            surrogate.add(cell.key, heads, result["val_loss"])
            took = time.perf_counter() - started
            band = "100+" if n >= 100 else "60-99" if n >= 60 else "20-59" if n >= 20 else None
            if band:
                seconds[band].append(took)
    table = pd.DataFrame([{**r, "stage": "search", "status": "ok"} for _, _, r in runs])
    started = time.perf_counter()
    fit_joint_law(table, n_bootstrap=0)
    baseline = time.perf_counter() - started
    print(f"{len(runs)} runs of the paper grid, {args.repeats} passes; baseline: fit_joint_law without bootstrap "
          f"{baseline:.2f} s")
    for band, values in seconds.items():
        print(f"refit + predictions at {band:>5} runs: median {statistics.median(values):.3f} s, "
              f"max {max(values):.3f} s ({statistics.median(values) / baseline:.1%} of the baseline)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shipped = paper_replay([])
    for seed in range(args.seeds):
        sweep("law+branches", dataclasses.replace(shipped, sampling=dataclasses.replace(shipped.sampling, seed=seed)),
              4, searcher_class=TimedSearcher)
    print(f"the shipped preset's sweep ({len(shipped.cells())} cells, 4 slots, {args.seeds} seeds), per call:")
    for call, values in TimedSearcher.seconds.items():
        values = sorted(values)
        print(f"  {call:<17} {len(values):>4} calls: median {statistics.median(values) * 1e3:.1f} ms, "
              f"90th percentile {values[int(0.9 * (len(values) - 1))] * 1e3:.1f} ms, max {values[-1] * 1e3:.1f} ms "
              f"({statistics.median(values) / baseline:.1%} of the baseline)")


if __name__ == "__main__":
    main()
