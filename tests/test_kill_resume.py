"""The driver killed (SIGKILL) at random points, several times, then resumed; compared with the same seeded sweep
run without interruption.

``loopscale search SPEC`` runs as a real subprocess with its own Ray (files under a private RAY_TMPDIR, so what
a killed driver leaves behind is found and killed by PID). Kill points come from a seeded RNG: a moment during
start-up, or after some more trials have finished plus a fraction of a trial. The simulated trials write a
journal (objectives/testing.py), which counts how often each trial really ran. After the last resume:

* every planned trial has exactly one MLflow run, FINISHED; no duplicate and no orphan (RUNNING) run;
* no finished trial was lost: a run FINISHED at a kill is still there, the same run;
* none ran twice: each trial completed exactly once, and none that MLflow held as finished at a kill started
  again afterwards;
* the runs table and the whole analysis equal those of the uninterrupted sweep (the grid sampler makes the set
  of trials independent of timing; the simulated loss depends only on the trial);
* the Optuna studies continued across the kills (each holds its cell's trials, once), and running the
  finished sweep again does nothing.

With the law sampler (one surrogate fitted across all cells, pickled with the searcher) the same holds: its
proposals depend on the order results arrive, so that sweep proposes in rounds (``rounds = true``, two trials at
a time; tests/test_rounds_ray.py shows the order cannot matter then), and a round's results held when a kill
lands must reach the restored surrogate as they would have; a resumed sweep must continue the very surrogate it
had, or its trials would differ.

The suite runs the law sampler at seed 0; the grid sampler (whose trials the stop-and-resume tests of
tests/test_interrupts.py already cover) and extra seeds run on demand:
``LOOPSCALE_KILL_SAMPLERS=grid,law LOOPSCALE_KILL_SEEDS=0,1,2,3 pytest tests/test_kill_resume.py``.

A second test kills a sweep of real training trials whose Tune state was never snapshotted after its start, so
that every trial finished before the kill goes through Tune again on resume: none may train again (its receipt
answers; without receipts this test fails on the rewritten receipt files).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from loopscale.analysis import FitOptions, analyze, load_runs
from loopscale.analysis.store import trial_numbers
from loopscale.search import SweepSpec
from loopscale.search.tracking import ready_store
from loopscale.search.tune.searcher import CellSearcher
from test_resume import processes_using
from test_search import heads, journal_studies
from test_spec import base_spec, to_toml

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("testing_aids")]
REPO = Path(__file__).resolve().parent.parent
KILLS = 3
SEEDS = [int(s) for s in os.environ.get("LOOPSCALE_KILL_SEEDS", "0").split(",")]
SAMPLERS = os.environ.get("LOOPSCALE_KILL_SAMPLERS", "law").split(",")
TRIAL_QUERY = "tags.`loopscale.kind` = 'trial'"
COMPARED = ["stage", "cell", "r", "budget_flops", "width", "s", "N_once", "N_rec", "tokens", "flops_spent",
            "val_loss", "status", "reason"]


def write_sweep(folder: Path, sampler: str = "grid") -> SweepSpec:
    """6 cells x 4 widths (the law sampler: at most, with warmdown branches and information as the paper
    preset, in rounds), each trial ~0.5 s, so that kills land while trials run."""
    folder.mkdir()
    # (the law sampler's budgets closer together: at 1e12 every optimum sits at the narrowest width, out of reach
    # of a 1e13 trial's branches)
    law = ({"branches": True, "information": 1, "budgets": [3e12, 1e13], "rounds": True} if sampler == "law" else
           {"budgets": [1e12, 1e13]})
    spec = base_spec(folder, recurrences=[1, 2, 4], sampler=sampler, trials_per_cell=4, **law,
                     testing={"delay_s": 0.5, "journal": str(folder / "journal.jsonl")},
                     resources={"max_concurrent": 2})
    (folder / "spec.toml").write_text(to_toml(spec))
    return SweepSpec.from_toml(folder / "spec.toml")


class Driver:
    """``python -m search.cli search SPEC [--resume]`` with its output read line by line in the background."""

    def __init__(self, spec: SweepSpec, ray_dir: str, resume: bool, own_group: bool = False):
        """``own_group``: the driver leads a process group of its own (with the Ray it starts), as a batch job's
        or ``timeout``'s command does, so that a test can signal the whole group."""
        env = {**os.environ, "RAY_TMPDIR": ray_dir}  # PYTHONPATH as given: it names the loopscale under test
        command = [sys.executable, "-m", "loopscale.search.cli", "search", spec.source] + (["--resume"] if resume else [])
        self.process = subprocess.Popen(command, cwd=Path(spec.source).parent, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=own_group)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, prefix: str, count: int, timeout_s: float = 180) -> bool:
        """Wait until ``count`` more lines start with ``prefix``; False if the driver ended first."""
        deadline = time.monotonic() + timeout_s
        while count > 0:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                return False
            self.output.append(line)
            count -= line.startswith(prefix)
        return True

    def kill(self, ray_dir: str) -> None:
        """SIGKILL the driver, then every process its Ray left behind (they outlive it with PPID 1)."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        kill_leftovers(ray_dir)


def kill_leftovers(folder: str) -> None:
    """SIGKILL, by PID, every process whose command line names ``folder``: what a Ray started there left."""
    for pid in processes_using(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def ray_dir():
    """A private RAY_TMPDIR (short: Ray's socket paths must stay under 108 bytes), cleaned up afterwards."""
    folder = tempfile.mkdtemp(prefix="lsk", dir="/tmp")
    yield folder
    kill_leftovers(folder)
    shutil.rmtree(folder, ignore_errors=True)


def kill_at_random_point(spec: SweepSpec, ray_dir: str, rng: random.Random, resume: bool, left: int) -> str:
    """Start a driver and SIGKILL it at a point drawn from ``rng``; returns a description of the point."""
    driver = Driver(spec, ray_dir, resume)
    if rng.random() < 0.25:  # somewhere in start-up: imports, Ray, MLflow, Tune's restore
        delay = rng.uniform(0.5, 8.0)
        time.sleep(delay)
        point = f"{delay:.2f} s after launch"
    else:
        more, fraction = rng.randint(0, max(0, left // 4)), rng.uniform(0.0, 1.5)
        assert driver.wait_for("sweep ", 1), "".join(driver.output)  # its banner: MLflow is open
        assert driver.wait_for("[search ", more), "".join(driver.output)
        time.sleep(fraction)
        point = f"{more} trials + {fraction:.2f} s after the banner"
    driver.kill(ray_dir)
    return point


def trial_runs(spec: SweepSpec, view: int = ViewType.ACTIVE_ONLY) -> list:
    db = Path(spec.placement.tracking_uri.removeprefix("sqlite:///"))
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name) if db.exists() else None
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], TRIAL_QUERY, max_results=1000, run_view_type=view)


def journal(spec: SweepSpec) -> list[dict]:
    path = Path(spec.testing["journal"])
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill: that execution did not complete
            pass
    return entries


def identity(cell: str, s: float) -> tuple[str, float]:
    return cell, float(s)


def journal_identity(entry: dict) -> tuple[str, float]:
    return identity(f"C={entry['budget_flops']:.3g},r={entry['r']}", entry["s"])


def summary_text(analysis) -> str:
    """Every number of the analysis summary, as JSON (where NaN equals NaN), but its wall time."""
    return json.dumps({k: v for k, v in analysis.summary().items() if k != "seconds"}, sort_keys=True, default=str)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_kills_and_resumes_lose_nothing_repeat_nothing_and_fit_the_same(tmp_path, ray_dir, seed, sampler):
    reference = write_sweep(tmp_path / "uninterrupted", sampler)
    sweep = write_sweep(tmp_path / "interrupted", sampler)

    uninterrupted = Driver(reference, ray_dir, resume=False)
    assert not uninterrupted.wait_for("never printed", 1, timeout_s=300)  # read to the end
    assert uninterrupted.process.wait(timeout=30) == 0, "".join(uninterrupted.output)
    planned = {r.data.tags["trial_key"] for r in trial_runs(reference)}
    if sampler == "grid":
        assert planned == {f"search/{c.key}/{n}" for c in sweep.cells() for n in range(1, c.n_trials + 1)}
        assert len(planned) == sweep.planned_trials() == 24
    else:  # cells stop early; the larger budget's after 3 widths at least, the smaller's also fed by branches
        assert 3 * 3 + 3 <= len(planned) <= sweep.planned_trials()
        branched = [r for r in trial_runs(reference) if any(k.startswith("branch0.") for k in trial_numbers(r))]
        assert branched, "no trial recorded a warmdown branch"

    rng = random.Random(seed)
    at_kill: list[tuple[str, dict[str, tuple[str, tuple[str, float]]], int]] = []
    for k in range(KILLS):
        finished = sum(r.info.status == "FINISHED" for r in trial_runs(sweep))
        point = kill_at_random_point(sweep, ray_dir, rng, resume=k > 0, left=len(planned) - finished)
        held = {r.data.tags["trial_key"]: (r.info.run_id, identity(r.data.tags["cell"], r.data.params["s"]))
                for r in trial_runs(sweep) if r.info.status == "FINISHED"}
        at_kill.append((point, held, len(journal(sweep))))
    print(f"seed {seed}: killed at " + "; ".join(f"{p} ({len(h)} trials finished)" for p, h, _ in at_kill))

    resumed = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "search", sweep.source, "--resume"],
                             cwd=tmp_path / "interrupted", capture_output=True, text=True, timeout=300, check=False,
                             env={**os.environ, "RAY_TMPDIR": ray_dir})
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "complete; fit it with" in resumed.stdout

    # one FINISHED run per planned trial, nothing duplicated, nothing orphaned
    runs = trial_runs(sweep)
    assert sorted(r.data.tags["trial_key"] for r in runs) == sorted(planned)
    assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "ok" for r in runs)
    orphans = [(r.data.tags.get("trial_key"), r.info.lifecycle_stage, r.data.params.get("s"))
               for r in trial_runs(sweep, ViewType.ALL) if r.info.status == "RUNNING"]
    assert not orphans, f"RUNNING runs left (trial key, lifecycle, s): {orphans}"
    client = MlflowClient(sweep.placement.tracking_uri)
    experiment = client.get_experiment_by_name(sweep.name)
    parents = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'sweep'")
    assert [p.info.status for p in parents] == ["FINISHED"]

    # no finished trial lost: what MLflow held at each kill is still there, the same run
    final = {r.data.tags["trial_key"]: r.info.run_id for r in runs}
    for point, held, _ in at_kill:
        assert {key: run for key, (run, _) in held.items()} == {key: final[key] for key in held}, point

    # none ran twice: every trial completed exactly once, and none held as finished at a kill started again
    entries = journal(sweep)
    completed = Counter(journal_identity(e) for e in entries if e["event"] == "end")
    every_trial = {identity(r.data.tags["cell"], r.data.params["s"]) for r in runs}
    assert set(completed) == every_trial and set(completed.values()) == {1}, completed
    for point, held, position in at_kill:
        finished_then = {ident for _, ident in held.values()}
        again = [e for e in entries[position:] if e["event"] == "start" and journal_identity(e) in finished_then]
        assert not again, f"ran again after the kill at {point}: {again}"
    starts = sum(e["event"] == "start" for e in entries)
    print(f"seed {seed}: {starts} trial executions started for {len(planned)} trials "
          f"({starts - len(planned)} cut short by the kills and restarted)")
    studies_continued(sweep, runs)

    # running the finished sweep again does nothing
    again = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "search", sweep.source, "--resume"],
                           cwd=tmp_path / "interrupted", capture_output=True, text=True, timeout=120, check=False,
                           env={**os.environ, "RAY_TMPDIR": ray_dir})
    assert again.returncode == 0 and "already complete" in again.stdout, again.stdout + again.stderr[-2000:]
    assert len(trial_runs(sweep)) == len(planned)

    # the analysis equals that of the uninterrupted sweep
    table, expected = load_runs(sweep.name, sweep.placement.tracking_uri), load_runs(reference.name,
                                                                                     reference.placement.tracking_uri)
    pd.testing.assert_frame_equal(table[COMPARED], expected[COMPARED])
    options = FitOptions(n_starts=100, n_bootstrap=20)
    got, want = analyze(table, name="t", options=options), analyze(expected, name="t", options=options)
    assert summary_text(got) == summary_text(want)
    assert got.tables.keys() == want.tables.keys()
    for name in got.tables:
        pd.testing.assert_frame_equal(got.tables[name].drop(columns=["run_id"], errors="ignore"),
                                      want.tables[name].drop(columns=["run_id"], errors="ignore"), obj=name)


def studies_continued(sweep: SweepSpec, runs: list) -> None:
    """The Optuna studies continued across the kills: each holds every trial of its cell, those before a kill
    included, drawn without replacement; and Optuna's own storage holds exactly those trials (what a killed
    attempt added after Tune's last snapshot was replaced when the resumed searcher took over)."""
    searcher = CellSearcher([])
    searcher.restore_from_dir(str(Path(sweep.placement.storage) / sweep.name / "search"))
    widths: dict[str, list[float]] = {}
    for run in runs:
        widths.setdefault(run.data.tags["cell"], []).append(float(run.data.params["s"]))
    for key, study in searcher.studies().items():
        completed = [t for t in study.trials if t.state.name == "COMPLETE"]
        assert sorted(t.params["heads"] for t in completed) == sorted(round(s) for s in widths[key])
        assert len(set(widths[key])) == len(widths[key])
    assert journal_studies(sweep) == {key: sorted(heads(sweep, s) for s in v) for key, v in widths.items()}


def tables_in(database: Path) -> int:
    """How many tables a sqlite file holds so far (0 while it cannot be read)."""
    try:
        with contextlib.closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True, timeout=0.1)) as db:
            return db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_a_driver_killed_while_it_creates_the_store_leaves_none_half_built(tmp_path):
    # MLflow builds a new sqlite store in dozens of migrations, one transaction each; a driver killed between two
    # of them used to leave a store that no later run could open. Kill the creator in the middle, then open it.
    database = tmp_path / "runs" / "mlflow.db"
    uri = f"sqlite:///{database}"
    # (a user cache without an empty store to copy: MLflow migrates, see search/store_template.py)
    creator = subprocess.Popen([sys.executable, "-c",
                                f"from loopscale.search.tracking import ready_store; ready_store({uri!r})"],
                               env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    deadline, building = time.monotonic() + 120, []
    while not (building and tables_in(building[0])) and creator.poll() is None:  # the first migrations are in
        assert time.monotonic() < deadline, "the store was never started"
        building = list(database.parent.glob("mlflow.db.*.new"))
        time.sleep(0.002)
    creator.send_signal(signal.SIGKILL)
    creator.wait(timeout=30)
    assert creator.returncode == -signal.SIGKILL, "the creator finished before it could be killed"
    assert not database.exists() and building[0].exists()  # killed half-way: the store never took its name

    ready_store(uri)  # the next driver
    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["Default"]
    assert not list(database.parent.glob("mlflow.db.*.new"))  # the half-built leftover was cleared


def test_training_trials_finished_before_a_kill_are_not_trained_again(tmp_path, ray_dir):
    """Tune snapshots its state every 2 s, so after a kill it restarts trials that finished since its last
    snapshot; their receipts must answer for them. Here the first driver snapshots only once (a one-hour
    period), so EVERY trial finished before the kill is restarted on resume: each must come back as the same
    MLflow run with the same measurements, its receipt untouched (a trial that runs again rewrites it)."""
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "spec.toml").write_text(to_toml(base_spec(
        folder, objective="train", budgets=[4e9], recurrences=[1, 2], trials_per_cell=2, sampler="grid",
        val_tokens=2048, data={"source": "kjv"}, recipe={"log_every": 2}, widths={"s_min": 1, "s_max": 3})))
    spec = SweepSpec.from_toml(folder / "spec.toml")
    receipts = Path(spec.placement.storage) / spec.name / "search" / "receipts"

    os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = "3600"
    try:
        first = Driver(spec, ray_dir, resume=False)
    finally:
        del os.environ["TUNE_GLOBAL_CHECKPOINT_S"]
    assert first.wait_for("[search ", 2, timeout_s=240), "".join(first.output)
    first.kill(ray_dir)
    held = {r.data.tags["trial_key"]: (r.info.run_id, trial_numbers(r)["wall_s"], r.data.metrics["val_loss"])
            for r in trial_runs(spec) if r.info.status == "FINISHED"}
    written = {p.name: p.stat().st_mtime_ns for p in receipts.iterdir()}
    assert len(held) >= 2 and len(written) >= len(held)

    resumed = Driver(spec, ray_dir, resume=True)
    assert not resumed.wait_for("never printed", 1, timeout_s=300)  # read to the end
    assert resumed.process.wait(timeout=30) == 0, "".join(resumed.output)
    lines = [line for line in resumed.output if line.startswith("[search ")]
    assert lines[0].startswith("[search 1/4]")  # nothing was in the snapshot: every trial went through Tune again

    runs = trial_runs(spec)
    assert sorted(r.data.tags["trial_key"] for r in runs) == sorted(f"search/{c.key}/{n}" for c in spec.cells()
                                                                      for n in (1, 2))
    assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "ok" for r in runs)
    after = {r.data.tags["trial_key"]: (r.info.run_id, trial_numbers(r)["wall_s"], r.data.metrics["val_loss"])
             for r in runs}
    assert {key: after[key] for key in held} == held  # the same runs, the same measurements
    assert {name: (receipts / name).stat().st_mtime_ns for name in written} == written  # no receipt rewritten
