"""A sweep stopped in the middle, then ``loopscale search SPEC --resume`` into another store; and the helpers
that find and kill what a stopped driver leaves behind. (kill -9 then --resume into the same store, several
times, is tests/test_kill_resume.py.)

The driver runs as a real subprocess (the CLI) with its own Ray, whose files live under a private RAY_TMPDIR:
every process left behind by the killed driver is found by that path and killed by PID afterwards.
"""

from __future__ import annotations

import os
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
