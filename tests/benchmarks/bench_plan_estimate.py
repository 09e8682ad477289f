"""How close ``loopscale plan``'s wall-time estimate comes to the sweep it plans (run on demand; prints figures,
asserts nothing). Take the figure on idle cores: the probe and the sweep share the machine with anything else.

    python tests/benchmarks/bench_plan_estimate.py [--set KEY=VALUE ...]

Plans and then runs the demo preset, by default cut down with ``--set`` to a few minutes (one budget, r = 1
and 2, two trials per cell, one calibration trial); more ``--set`` items change it further (``--full`` runs the
whole demo). Prints the estimate, the measured wall time of ``loopscale search`` and their ratio, and each
trial's measured training seconds against two prices from the same probe: the step-time model's (a fixed cost
per step plus FLOPs at a rate) and one FLOP rate for every width (the rate of the middle cell's first guess,
the estimate ``plan`` used before), so the comparison of the two models does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from loopscale.model import flops_per_token
from loopscale.search import SweepSpec
from loopscale.search.plan import estimate_seconds, measure_throughput

SMALL = ["budgets=[3e11]", "recurrences=[1, 2]", "trials_per_cell=2", "calibrate.trials=1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--full", action="store_true", help="the whole demo preset, no cuts")
    args = parser.parse_args()
    sets = ([] if args.full else SMALL) + args.sets
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        spec = SweepSpec.from_toml("demo", sets, tracking_uri=uri, storage=f"{tmp}/tune", cache_dir=f"{tmp}/cache")
        started = time.perf_counter()
        throughput = measure_throughput(spec)
        probe_s = time.perf_counter() - started
        estimate = estimate_seconds(spec, throughput)
        print(f"probe: {probe_s:.1f} s; step {throughput.step_s * 1e3:.0f} ms + FLOPs at "
              f"{throughput.flops_per_s / 1e9:.2f} GFLOP/s ({throughput.shape})")
        argv = [sys.executable, "-m", "loopscale.search.cli", "search", "demo", "--tracking-uri", uri]
        argv += [a for item in sets for a in ("--set", item)]
        argv += ["--set", f'storage="{tmp}/tune"', "--set", f'cache_dir="{tmp}/cache"']
        started = time.perf_counter()
        subprocess.run(argv, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
        measured = time.perf_counter() - started
        print(f"estimate {estimate:.0f} s, measured {measured:.0f} s, estimate / measured = {estimate / measured:.2f}")
        middle = spec.cells()[len(spec.cells()) // 2]
        guess_flops = flops_per_token(spec.model(middle.first_guess, middle.r)) * spec.batch_tokens
        one_rate = guess_flops / throughput.step_seconds(guess_flops)
        print(f"one rate for every width (s={middle.first_guess:g} r={middle.r}): {one_rate / 1e9:.2f} GFLOP/s")
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(spec.name)
        for run in client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'"):
            m = run.data.metrics
            config = spec.model(m["s"], int(m["r"]))
            step_flops = flops_per_token(config) * spec.batch_tokens
            priced = m["steps"] * throughput.step_seconds(step_flops)
            flat = m["steps"] * step_flops / one_rate
            trained = m["tokens"] / m["tokens_per_s"]
            print(f"  {run.info.run_name:<28} trained {trained:6.1f} s, step model {priced:6.1f} s "
                  f"({priced / trained:.2f}x), one rate {flat:6.1f} s ({flat / trained:.2f}x); "
                  f"whole trial {m['wall_s']:.1f} s")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
