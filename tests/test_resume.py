"""kill -9 of the driver in the middle of a sweep, then ``loopscale search SPEC --resume``.

The driver runs as a real subprocess (the CLI) with its own Ray, whose files live under a private RAY_TMPDIR:
every process left behind by the killed driver is found by that path and killed by PID afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import queue
import tempfile
import threading
import time
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from loopscale.search import SweepSpec
from loopscale.search.tune.searcher import CellSearcher
from test_search import heads, journal_studies
from test_spec import write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def processes_using(path: str) -> list[int]:
    """PIDs of the processes whose command line mentions ``path`` (Ray's session files)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if path in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.fixture
def ray_tmp():
    path = tempfile.mkdtemp(prefix="lsr", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    yield path
    for pid in processes_using(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(path, ignore_errors=True)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)  # end of output


def start_until_finished(command: list[str], cwd: Path, env: dict[str, str],
                         trials: int) -> tuple[subprocess.Popen, int]:
    """The driver ``command`` started, once it has printed the progress lines of ``trials`` finished trials (or
    ended, or 240 s passed); with how many it printed."""
    driver = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str | None] = queue.Queue()  # read on a thread: a driver that hangs cannot hang the test
    threading.Thread(target=_pump, args=(driver.stdout, lines), daemon=True).start()
    finished, deadline = 0, time.monotonic() + 240
    while finished < trials:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        finished += line.startswith("[search ")
    return driver, finished


def test_kill_9_then_resume_finishes_each_trial_exactly_once(tmp_path, ray_tmp):
    spec_path = write_spec(tmp_path, budgets=[1e12, 1e13], recurrences=[1, 2, 4], trials_per_cell=4)
    spec = SweepSpec.from_toml(spec_path)
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}  # the package as this process imports it (PYTHONPATH kept)
    command = [sys.executable, "-m", "loopscale.search.cli", "search", str(spec_path)]

    driver, finished = start_until_finished(command, tmp_path, env, 9)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    assert finished == 9, "the sweep never got going"

    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    query = "tags.`loopscale.kind` = 'trial'"
    before = {r.data.tags["trial_key"]: r.info.run_id
              for r in client.search_runs([experiment.experiment_id], query, max_results=1000)
              if r.info.status == "FINISHED"}
    assert 9 <= len(before) < spec.planned_trials()

    resumed = subprocess.run(command + ["--resume"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"[search {spec.planned_trials()}/{spec.planned_trials()}]" in resumed.stdout

    runs = client.search_runs([experiment.experiment_id], query, max_results=1000)
    every = client.search_runs([experiment.experiment_id], query, max_results=1000, run_view_type=ViewType.ALL)
    planned = {f"search/{c.key}/{n}" for c in spec.cells() for n in range(1, c.n_trials + 1)}
    assert sorted(r.data.tags["trial_key"] for r in runs) == sorted(planned)  # each trial exactly once
    assert all(r.info.status == "FINISHED" for r in runs)
    assert not [r for r in every if r.info.status == "RUNNING" and r.info.lifecycle_stage == "active"]
    # a trial finished before the kill keeps its run: it was neither logged again nor replaced
    assert all(before[key] in {r.info.run_id for r in runs} for key in before)

    # the Optuna studies continued across the kill: each holds every trial of its cell, pre-crash ones included
    searcher = CellSearcher([])
    searcher.restore_from_dir(str(Path(spec.placement.storage) / spec.name / "search"))
    widths: dict[str, list[float]] = {}
    for run in runs:
        widths.setdefault(run.data.tags["cell"], []).append(float(run.data.params["s"]))
    for key, study in searcher.studies().items():
        completed = [t for t in study.trials if t.state.name == "COMPLETE"]
        assert sorted(t.params["heads"] for t in completed) == sorted(round(s) for s in widths[key])
        assert len(set(widths[key])) == len(widths[key])  # still without replacement
    # and Optuna's own storage holds exactly those trials: what the killed attempt added after Tune's last
    # snapshot was replaced when the resumed searcher took over
    assert journal_studies(spec) == {key: sorted(heads(spec, s) for s in v) for key, v in widths.items()}
    parent = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'sweep'")
    assert [p.info.status for p in parent] == ["FINISHED"]

    # and running the finished sweep again does nothing
    again = subprocess.run(command + ["--resume"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and re.search(r"already complete", again.stdout)
    assert len(client.search_runs([experiment.experiment_id], query, max_results=1000)) == len(planned)


def trial_keys(tracking_uri: str, name: str, view=ViewType.ACTIVE_ONLY) -> list[tuple[str, str]]:
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'", max_results=1000,
                              run_view_type=view)
    return sorted((r.data.tags["trial_key"], r.info.status) for r in runs)


def test_a_sweep_resumed_into_another_store_logs_each_trial_there_once(tmp_path, ray_tmp):
    spec_path = write_spec(tmp_path, budgets=[1e12, 1e13], recurrences=[1, 2, 4], trials_per_cell=4)
    spec = SweepSpec.from_toml(spec_path)
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    command = [sys.executable, "-m", "loopscale.search.cli", "search", str(spec_path)]
    driver, finished = start_until_finished(command, tmp_path, env, 9)
    driver.send_signal(signal.SIGINT)
    assert driver.wait(timeout=120) == 130 and finished == 9
    before = [key for key, status in trial_keys(spec.placement.tracking_uri, spec.name) if status == "FINISHED"]
    assert 9 <= len(before) < spec.planned_trials()

    other = f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    planned = sorted(f"search/{c.key}/{n}" for c in spec.cells() for n in range(1, c.n_trials + 1))
    resumed = subprocess.run(command + ["--resume", "--tracking-uri", other], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # the finished trials logged again there from their receipts, the rest run: each trial once
    assert trial_keys(other, spec.name, ViewType.ALL) == [(key, "FINISHED") for key in planned]
    assert [key for key, _ in trial_keys(spec.placement.tracking_uri, spec.name)] == before  # the first store as it was

    # a finished sweep whose store was deleted: --resume logs its runs there again, from the receipts
    shutil.rmtree(tmp_path / "other")
    plain = subprocess.run(command + ["--tracking-uri", other], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
    assert plain.returncode == 2 and "holds none of its runs; pass --resume" in plain.stderr
    again = subprocess.run(command + ["--resume", "--tracking-uri", other], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert trial_keys(other, spec.name, ViewType.ALL) == [(key, "FINISHED") for key in planned]
    done = subprocess.run(command + ["--resume", "--tracking-uri", other], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "already complete" in done.stdout
