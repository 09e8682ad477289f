"""Per-trial orchestration overhead of a sweep on this machine (run on demand; prints figures, asserts nothing).

    python tests/benchmarks/bench_overhead.py [--trials 60]

Measured in one run, each against the same simulated trials:

1. the objective alone: ``objectives.simulate`` called in a loop (the baseline: what a trial itself costs);
2. the MLflow logger alone: ``TrialTracker`` start + finish per trial on a sqlite store (driver-side writes);
3. a whole sweep through ``run_search`` (Ray Tune + the cell searcher + MLflow + progress), two trials side by
   side, with Tune's experiment-state snapshot every 2 s (the simulated default) and after every step (what
   training sweeps use, so a finished trial is never trained again after a crash);
4. starting a local Ray (``ray.init(num_cpus=2)``) and creating a fresh MLflow sqlite store, paid once per sweep;
5. the paper replay end to end, ``loopscale search paper --objective simulate`` as a subprocess;
6. a command's fixed costs as a user pays them: ``loopscale --help`` against a bare interpreter start (the
   baseline), and a small simulated sweep run as ``python -m loopscale.search.cli search``, timed line by line:
   start to its banner (imports, Ray, the store), banner to the first result (Tune starts the trial
   processes), to the last, and its last line to the process's exit (Ray's shutdown, the interpreter's).

Overhead per trial = (sweep wall time) / trials - (objective time per trial); everything else is fixed cost.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import ray  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from loopscale.objectives import simulate  # noqa: E402
from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.tracking import TrialTracker, open_sweep  # noqa: E402
from loopscale.search.tune.driver import run_search  # noqa: E402
from test_spec import write_spec  # noqa: E402


def sweep_spec(tmp: Path, name: str, trials: int) -> SweepSpec:
    """12 cells (3 budgets x 4 recurrences) with trials / 12 trials each, on the tiny CPU template."""
    return SweepSpec.from_toml(write_spec(tmp, f"{name}.toml", name=name, budgets=[1e12, 3e12, 1e13],
                                          recurrences=[1, 2, 4, 8], trials_per_cell=trials // 12,
                                          template={"depth": 10}, widths={"s_min": 1, "s_max": 24}))


def wall_s(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
    return time.perf_counter() - started


def command_phases(spec: SweepSpec) -> dict[str, float]:
    """Seconds from the start of ``loopscale search`` to its banner, its first and last results, its last line
    and its exit."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-u", "-m", "loopscale.search.cli", "search", spec.source],
                               cwd=Path(spec.source).parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    marks: dict[str, float] = {}
    for line in process.stdout:
        now = time.perf_counter() - started
        if line.startswith("sweep ") and "banner" not in marks:
            marks["banner"] = now
        if line.startswith("[search "):
            marks.setdefault("first result", now)
            marks["last result"] = now
        marks["last line"] = now
    process.wait()
    marks["exit"] = time.perf_counter() - started
    return {name: marks[name] for name in ("banner", "first result", "last result", "last line", "exit")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=60)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))

    started = time.perf_counter()
    MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}").search_experiments()  # creates the schema
    store_s = time.perf_counter() - started
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray_s = time.perf_counter() - started

    spec = sweep_spec(tmp, "direct", args.trials)
    configs = [spec.trial_config(c, s) for c in spec.cells() for s in c.widths[:c.n_trials]]
    started = time.perf_counter()
    for config in configs:
        simulate(config)
    objective_s = (time.perf_counter() - started) / len(configs)

    experiment_id, parent = open_sweep(spec, "simulated")
    tracker = TrialTracker(experiment_id=experiment_id, parent_run_id=parent, sweep=spec.name, tags={})
    tracker.open()
    result = simulate(configs[0])
    started = time.perf_counter()
    for i, config in enumerate(configs):
        tracker.start(f"bench/{i}", {"stage": "search", "cell": "bench"}, config)
        tracker.finish(f"bench/{i}", result)
    mlflow_s = (time.perf_counter() - started) / len(configs)

    sweeps = {}
    for period in ("2", "0"):
        spec = sweep_spec(tmp, f"sweep{period}", args.trials)
        os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = period
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            run_search(spec)
        sweeps[period] = (time.perf_counter() - started, spec.planned_trials())
    os.environ.pop("TUNE_GLOBAL_CHECKPOINT_S")
    ray.shutdown()

    started = time.perf_counter()
    replay = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "search", "paper", "--objective", "simulate"],
                            cwd=tmp, capture_output=True, text=True)
    replay_s = time.perf_counter() - started

    bare_s = min(wall_s([sys.executable, "-c", "pass"], tmp) for _ in range(3))
    help_s = min(wall_s([sys.executable, "-m", "loopscale.search.cli", "--help"], tmp) for _ in range(3))
    phases = command_phases(sweep_spec(tmp, "command", 24))

    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end")
    print(f"objective alone (simulate):          {objective_s * 1e3:8.3f} ms per trial  (baseline)")
    print(f"MLflow logger alone (sqlite):        {mlflow_s * 1e3:8.1f} ms per trial")
    for period, label in (("2", "snapshot every 2 s (simulate)"), ("0", "snapshot every step (train)")):
        wall, trials = sweeps[period]
        per_trial = wall / trials
        print(f"whole sweep, {label:<30} {per_trial * 1e3:6.0f} ms per trial wall ({trials} trials, "
              f"{wall:.1f} s, 2 side by side) -> overhead {(per_trial - objective_s) * 1e3:.0f} ms/trial, "
              f"{per_trial / objective_s:,.0f}x the objective")
    print(f"fixed per sweep: ray.init {ray_s:.1f} s, fresh MLflow sqlite store {store_s:.1f} s")
    print(f"paper replay, loopscale search paper --objective simulate: {replay_s:.1f} s wall "
          f"(exit {replay.returncode}; {replay.stdout.count('[search ')} trials)")
    print(f"loopscale --help: {help_s:.2f} s wall, {help_s / bare_s:.0f}x a bare interpreter start "
          f"({bare_s:.2f} s; baseline); best of 3")
    marks = list(phases.items())
    print("a 24-trial simulated sweep, as a command: " + ", ".join(
        f"{name} {t - (marks[i - 1][1] if i else 0.0):.1f} s" for i, (name, t) in enumerate(marks))
          + f" (each since the previous mark; {phases['exit']:.1f} s in all)")


if __name__ == "__main__":
    main()
