"""Many writers, one sqlite MLflow store: zero errors, zero lost metrics.

1. A sweep runs 8 trials side by side (Ray is told of 8 CPUs, the spec allows 8 at once); the driver logs them
   all through ``search.tracking`` while they overlap (the journal of the simulated trials proves they did).
2. 8 sweeps in 8 processes log at the same time into one fresh store, each through its own ``open_sweep`` and
   ``TrialTracker`` (several users, or several sweeps of one user, sharing the default store), every curve point
   written on its own so that the writes really interleave.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import shutil
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from loopscale.analysis.store import trial_numbers
from loopscale.objectives import METRIC_KEYS, simulate
from loopscale.search import SweepSpec
from loopscale.search.tracking import TrialTracker, flatten_params, open_sweep
from test_spec import write_spec

# Ray is imported inside the Ray test only: the 8 writer processes import this module, and Ray would double
# the start-up each of them pays on 2 cores.

pytestmark = pytest.mark.integration
WRITERS = 8
QUERY = "tags.`loopscale.kind` = 'trial'"


def logged_metrics(result: dict) -> set[str]:
    """The numbers a trial's run must hold: every finite number of its final result."""
    return {k for k in METRIC_KEYS if isinstance(result.get(k), (int, float)) and math.isfinite(result[k])}


@pytest.fixture
def ray_with_8_cpus():
    import ray

    from test_kill_resume import kill_leftovers

    folder = tempfile.mkdtemp(prefix="lsc", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    ray.init(num_cpus=WRITERS, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             _temp_dir=folder)
    yield
    ray.shutdown()
    kill_leftovers(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_eight_trials_side_by_side_log_everything(tmp_path, ray_with_8_cpus, testing_aids):
    from loopscale.search.tune.driver import run_search

    journal = tmp_path / "journal.jsonl"
    spec = SweepSpec.from_toml(write_spec(
        tmp_path, budgets=[1e12, 1e13], recurrences=[1, 2], sampler="grid", trials_per_cell=4,
        widths={"s_min": 1, "s_max": 4}, testing={"rendezvous": WRITERS, "journal": str(journal)},
        resources={"max_concurrent": WRITERS}))
    run_search(spec)

    # they did overlap: the first 8 trials each waited until all 8 had started (the rendezvous), so at one moment
    # 8 trials were between their start and their end; never more (max_concurrent)
    events = sorted((e["time"], e["event"] == "start") for e in map(json.loads, journal.read_text().splitlines()))
    running = peak = 0
    for _, started in events:
        running += 1 if started else -1
        peak = max(peak, running)
    assert peak == WRITERS and len(events) == 2 * spec.planned_trials() == 32

    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([experiment.experiment_id], QUERY, max_results=1000)
    assert len(runs) == 16 and len({r.data.tags["trial_key"] for r in runs}) == 16
    cells = {c.key: c for c in spec.cells()}
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok"
        config = spec.trial_config(cells[run.data.tags["cell"]], float(run.data.params["s"]))
        expected = simulate(dataclasses.replace(config, testing=None))  # the same trial without its aids
        assert run.data.params == flatten_params(config.to_params())
        numbers = trial_numbers(run)
        assert set(numbers) == logged_metrics(expected)
        assert all(numbers[k] == pytest.approx(expected[k], rel=1e-12) for k in numbers)


def _log_a_sweep(folder: str, index: int, start, errors) -> None:
    """One process: a sweep of its own in the shared store, 5 trials with a 10-point curve each, every point
    written at once (flush_s = 0)."""
    try:
        tmp = Path(folder)
        spec = SweepSpec.from_toml(write_spec(tmp, f"w{index}.toml", name=f"w{index}", budgets=[1e12],
                                              recurrences=[1], tracking_uri=f"sqlite:///{tmp / 'shared.db'}"))
        (cell,) = spec.cells()
        start.wait()  # all 8 begin together
        experiment_id, parent = open_sweep(spec, "simulated")
        tracker = TrialTracker(experiment_id=experiment_id, parent_run_id=parent, sweep=spec.name,
                               tags={"spec_hash": spec.spec_hash}, flush_s=0.0)
        tracker.open()
        for n, s in enumerate(cell.widths[:5], start=1):
            key, config = f"search/{cell.key}/{n}", spec.trial_config(cell, s)
            tracker.start(key, {"stage": "search", "cell": cell.key}, config)
            for step in range(1, 11):
                tracker.curve(key, {"train_loss": 10.0 / step + index, "step": step})
            tracker.finish(key, simulate(config))
        tracker.close()
    except BaseException as exc:  # reported to the test, which fails on any
        errors.put(f"writer {index}: {type(exc).__name__}: {exc}")
        raise


@pytest.mark.slow
def test_eight_processes_log_into_one_fresh_store_at_once(tmp_path):
    context = multiprocessing.get_context("spawn")  # separate interpreters, like separate drivers
    start, errors = context.Barrier(WRITERS), context.Queue()
    writers = [context.Process(target=_log_a_sweep, args=(str(tmp_path), i, start, errors)) for i in range(WRITERS)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=300)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not failures and [w.exitcode for w in writers] == [0] * WRITERS, failures

    client = MlflowClient(f"sqlite:///{tmp_path / 'shared.db'}")
    for index in range(WRITERS):
        spec = SweepSpec.from_toml(tmp_path / f"w{index}.toml")
        (cell,) = spec.cells()
        experiment = client.get_experiment_by_name(spec.name)
        runs = client.search_runs([experiment.experiment_id], QUERY, max_results=1000)
        assert sorted(r.data.tags["trial_key"] for r in runs) == [f"search/{cell.key}/{n}" for n in range(1, 6)]
        for run in runs:
            assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok"
            result = simulate(spec.trial_config(cell, float(run.data.params["s"])))
            assert set(trial_numbers(run)) == logged_metrics(result)
            curve = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train_loss"))
            expected = [(step, 10.0 / step + index) for step in range(1, 11)]
            assert curve == sorted([*expected, (result["steps"], result["train_loss"])])  # + the final value
