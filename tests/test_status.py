"""``loopscale status NAME`` from another terminal while a real sweep runs, after its driver is killed, and once
it is resumed to the end: the state and the driver, the trials against the plan, each cell's best run, and the
driver's lock read but never taken."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from loopscale.analysis import numbers
from loopscale.analysis.store import trial_numbers
from loopscale.search import SweepSpec
from test_resume import ray_tmp, start_until_finished  # noqa: F401 (a fixture)
from test_spec import write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("testing_aids")]


def status(spec: SweepSpec, cwd: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "status", spec.name, "--tracking-uri",
                           spec.placement.tracking_uri], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_status_follows_a_sweep_while_it_runs_after_a_kill_and_once_resumed(tmp_path, ray_tmp):
    hold = tmp_path / "hold"  # while it exists, trials wait: the sweep is still running when status looks
    spec_path = write_spec(tmp_path, budgets=[1e12, 1e13], recurrences=[1, 2], trials_per_cell=3,
                           testing={"delay_s": 1.0, "hold": str(hold)})
    spec = SweepSpec.from_toml(spec_path)
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    elsewhere = tmp_path / "another-terminal"
    elsewhere.mkdir()
    command = [sys.executable, "-m", "loopscale.search.cli", "search", str(spec_path)]
    planned = spec.planned_trials()

    driver, finished = start_until_finished(command, tmp_path, env, 3)
    hold.touch()
    try:
        assert finished == 3, "the sweep never got going"
        lock = Path(spec.placement.storage) / spec.name / "driver.lock"
        held = lock.read_text()
        lines = status(spec, elsewhere, env)
        assert lines[0] == f"sweep {spec.name}: running (driver pid {driver.pid} on host {socket.gethostname()})"
        ended = int(lines[1].split()[1])
        assert 3 <= ended < planned and lines[1].startswith(f"trials: {ended} of {planned} planned ended")
        assert any(line.startswith("ETA: ") for line in lines)
        assert lock.read_text() == held  # read, not taken
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        hold.unlink()

    lines = status(spec, elsewhere, env)
    assert lines[0] == (f"sweep {spec.name}: stopped before its last trial: `loopscale search <its spec> --resume` "
                        "finishes it")
    assert not any(line.startswith("ETA: ") for line in lines)

    resumed = subprocess.run(command + ["--resume"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = status(spec, elsewhere, env)
    assert lines[0] == f"sweep {spec.name}: finished"
    assert lines[1] == f"trials: {planned} of {planned} planned ended (search {planned}), 0 cut off, 0 failed"

    client = MlflowClient(spec.placement.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(spec.name).experiment_id],
                              "tags.`loopscale.kind` = 'trial'", max_results=1000)
    spent = sum(trial_numbers(run)["flops_spent"] for run in runs)
    assert lines[2].startswith(f"FLOPs spent: {numbers.flops(spent)}; ran ")
    table = {line.split()[0]: line.split()[1:] for line in lines[4:]}
    assert len(table) == len(spec.cells())
    for cell in spec.cells():
        own = [run for run in runs if run.data.tags["cell"] == cell.key]
        best = min(own, key=lambda run: run.data.metrics["val_loss"])
        assert table[cell.key] == [str(len(own)), numbers.loss(best.data.metrics["val_loss"]),
                                   str(int(trial_numbers(best)["width"])), numbers.count(trial_numbers(best)["N"])]


def test_status_of_an_unknown_sweep_is_one_line(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("other")
    done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "status", "nope", "--tracking-uri", uri],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"loopscale: error: no experiment 'nope' at {uri}; known: Default, other\n"
