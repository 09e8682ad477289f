"""How close ``loopscale plan``'s wall-time estimate comes to the command it plans, part by part (run on demand;
prints figures, asserts nothing). The probe and the sweep share the machine with anything else: take the figure
on idle cores, or compare only estimate and sweep run at the same load (both printed with the load average).

    python tests/benchmarks/bench_plan_estimate.py [--set KEY=VALUE ...] [--full]

Plans and then runs the demo preset, by default cut down with ``--set`` to a few minutes (two budgets, r = 1
and 2, two trials per cell, two calibration trials: a calibration stage, a search stage with warmdown branches
and a last long trial, then the analysis); more ``--set`` items change it further (``--full`` runs the whole
demo). Prints each part of the estimate (start, each stage, the analysis) against the same part measured
(the stages' own "in H:MM:SS" lines, ``loopscale analyze`` timed alone), the whole command's ratio, and each
trial's measured seconds against the step model's price from the same probe.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

from mlflow.tracking import MlflowClient

from loopscale.analysis.store import trial_numbers
from loopscale.search import SweepSpec
from loopscale.search.plan.probe import measure_throughput
from loopscale.search.plan.render import render_estimate
from loopscale.search.plan.walltime import estimate, trial_seconds

SMALL = ["budgets=[6e10, 2e11]", "recurrences=[1, 2]", "trials_per_cell=2", "calibrate.trials=2"]
STAGE_LINE = re.compile(r"^(calibrate|search): \d+/\d+ trials, .* in (\d+):(\d\d):(\d\d)$", re.M)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--full", action="store_true", help="the whole demo preset, no cuts")
    args = parser.parse_args()
    sets = ([] if args.full else SMALL) + args.sets
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        spec = SweepSpec.from_toml("demo", sets, tracking_uri=uri, storage=f"{tmp}/tune", cache_dir=f"{tmp}/cache")
        started = time.perf_counter()
        throughput = measure_throughput(spec)
        probe_s = time.perf_counter() - started
        parts = estimate(spec, throughput)
        print(f"probe: {probe_s:.1f} s; step {throughput.step_s * 1e3:.0f} ms + FLOPs at "
              f"{throughput.flops_per_s / 1e9:.2f} GFLOP/s, {throughput.side_by_side} at once ({throughput.shape})")
        print("\n".join(render_estimate(spec, parts)), flush=True)

        argv = [sys.executable, "-m", "loopscale.search.cli", "search", "demo", "--tracking-uri", uri]
        argv += [a for item in sets for a in ("--set", item)]
        argv += ["--set", f'storage="{tmp}/tune"', "--set", f'cache_dir="{tmp}/cache"']
        started = time.perf_counter()
        out = subprocess.run(argv, check=True, cwd=tmp, capture_output=True, text=True).stdout
        search_s = time.perf_counter() - started
        started = time.perf_counter()
        analyzed = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "analyze", "--experiment",
                                   spec.name, "--tracking-uri", uri], cwd=tmp, capture_output=True, text=True)
        analysis_s = time.perf_counter() - started
        print(f"load average after the sweep and analysis: {os.getloadavg()}")

        stages = {m[1]: int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4]) for m in STAGE_LINE.finditer(out)}
        print(f"{'part':<12} {'estimate':>9} {'measured':>9} {'est/meas':>9}")
        rows = [("start+rest", parts.start_s, search_s - sum(stages.values()))]
        rows += [(stage, parts.stages[stage][0], stages.get(stage, float("nan"))) for stage in parts.stages]
        rows += [("search cmd", parts.sweep_s[0], search_s)]
        rows += [("analysis", parts.analysis_s, analysis_s if analyzed.returncode == 0 else float("nan"))]
        rows += [("whole", parts.total_s[0], search_s + analysis_s)]
        for name, est, measured in rows:
            print(f"{name:<12} {est:>8.0f}s {measured:>8.0f}s {est / measured:>9.2f}")
        if analyzed.returncode:
            print(f"analyze failed (exit {analyzed.returncode}): {analyzed.stderr.strip().splitlines()[-1:]}")

        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(spec.name)
        cells = {(stage, c.key): c for stage in ("calibrate", "search") for c in spec.cells(stage)}
        for run in client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'"):
            m, cell = trial_numbers(run), cells[run.data.tags["stage"], run.data.tags["cell"]]
            priced = trial_seconds(spec, cell, m["s"], throughput)
            print(f"  {run.info.run_name:<30} trial {m['wall_s']:6.1f} s, priced {priced:6.1f} s "
                  f"({priced / m['wall_s']:.2f}x)")


if __name__ == "__main__":
    main()
