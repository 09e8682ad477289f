"""What proposing in rounds (``rounds = true``, search/tune/cells.py) costs in wall time, and what it buys: the same
trials whichever trial finishes first.

    python tests/benchmarks/bench_rounds.py                    # 5 seeds, 4 slots
    python tests/benchmarks/bench_rounds.py --seeds 10 --workers 8

The sweep: the ``paper`` preset replayed (simulated objective, the law sampler with warmdown branches, as it
ships), driven as Tune drives the searcher (every free slot asked in one step, then the trial that ends first
reports; tests/test_law_sampler.py ``slots``) on ``--workers`` slots. A trial lasts its budget / 1e17 time units
(FLOPs at a fixed speed) times a per-trial factor that stands for a machine's uneven speeds: 1 + ``--jitter`` u,
u uniform in [0, 1) drawn per trial from (seed, cell, width), and the same draws reversed, 1 + jitter (1 - u),
for a second run with another finishing order. Baseline: the sampler without rounds, same seeds, same durations.
Per method: the sweep's end (time units), its ratio to the baseline's, FLOPs spent, trials, and in how many seeds
the two finishing orders gave the same trials. Time units, not seconds: not timing-sensitive.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import optuna  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the searcher's driver

from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.tune.cells import CellTrials  # noqa: E402
from loopscale.search.tune.studies import make_studies  # noqa: E402
from test_law_sampler import slots  # noqa: E402


def jitter(config: dict, seed: int, reverse: bool, size: float) -> float:
    """The trial's speed factor: 1 + size u, u in [0, 1) seeded by (seed, cell, width); reversed: 1 + size (1 - u)."""
    key = f"{seed}|{config['meta']['cell']}|{config['trial']['s']:g}".encode()
    u = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2 ** 64
    return 1 + size * ((1 - u) if reverse else u)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jitter", type=float, default=1.0, help="a trial's duration varies by up to this share")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"paper preset replayed, {args.workers} slots, durations budget / 1e17 x (1 + {args.jitter:g} u), "
          f"{args.seeds} seeds")
    print(f"{'method':>10} {'sweep end':>10} {'vs baseline':>12} {'FLOPs':>9} {'trials':>7} {'same trials':>12}")
    ends: dict[bool, float] = {}
    store = tempfile.mkdtemp()  # the spec's store, never written
    for rounds in (False, True):
        total_end = total_flops = total_trials = same = 0.0
        for seed in range(args.seeds):
            spec = SweepSpec.from_toml("paper", objective="simulate", tracking_uri=f"sqlite:///{store}/unused.db")
            spec = dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, seed=seed, rounds=rounds))
            runs = []
            for reverse in (False, True):
                def duration(config: dict, reverse: bool = reverse) -> float:
                    return config["trial"]["budget_flops"] / 1e17 * jitter(config, seed, reverse, args.jitter)

                runs.append(slots(CellTrials(make_studies(spec, "search", None), rounds=rounds), args.workers,
                                  duration))
            proposed, _, table, end = runs[0]
            total_end += end
            total_flops += float(table.loc[table["branch_of"] == "", "flops_spent"].sum())
            total_trials += len(proposed)
            same += runs[0][0] == runs[1][0]
        ends[rounds] = total_end / args.seeds
        name = "rounds" if rounds else "baseline"
        print(f"{name:>10} {ends[rounds]:>10.1f} {ends[rounds] / ends[False]:>12.2f} "
              f"{total_flops / args.seeds:>9.2e} {total_trials / args.seeds:>7.1f} {int(same):>6} of {args.seeds}",
              flush=True)


if __name__ == "__main__":
    main()
