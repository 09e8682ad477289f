"""Idle core-seconds of a finished sweep (the demo by default), from its trial runs in MLflow.

    loopscale demo && python tests/benchmarks/bench_idle_cores.py                  # the demo in ./loopscale-runs
    python tests/benchmarks/bench_idle_cores.py --experiment NAME --tracking-uri URI --slots 4

The sweep's wall interval is its parent run's; each trial occupies a slot from its run's start to its end
(analysis/occupancy.py). Prints the slot-seconds busy and idle, and how long 0, 1, ... trials ran at once; with one
core per trial (the demo's ``[resources] cpus = 1``) slots are cores. Slots default to the machine's cores.
"""

from __future__ import annotations

import argparse
import os

from mlflow.tracking import MlflowClient

from loopscale.analysis.occupancy import occupancy
from loopscale.analysis.store import resolve_tracking_uri
from loopscale.analysis.tracking import _experiment, _runs_of_kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="demo")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--slots", type=int, default=os.cpu_count())
    args = parser.parse_args()
    uri = resolve_tracking_uri(args.tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = _experiment(client, args.experiment, uri)
    sweep = _runs_of_kind(client, experiment.experiment_id, "sweep")[0]
    trials = [(run.info.start_time / 1e3, run.info.end_time / 1e3)
              for run in _runs_of_kind(client, experiment.experiment_id, "trial") if run.info.end_time]
    start, end = sweep.info.start_time / 1e3, (sweep.info.end_time or max(b for _, b in trials) * 1e3) / 1e3
    print(f"sweep {args.experiment!r}: {len(trials)} trial runs")
    print(occupancy(trials, start, end, args.slots).line())


if __name__ == "__main__":
    main()
