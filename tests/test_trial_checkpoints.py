"""A real training trial killed in the middle, with Ray and MLflow, resumes from its Tune checkpoint
(search/tune/trial.py, objectives/checkpoint.py): the driver and its Ray SIGKILLed then ``--resume``, and
the trial's worker killed while the driver lives (Tune's retry). Either way the sweep ends with one MLflow run
for the trial that records the resume, a loss curve with every step once, and the validation loss of the same
trial trained without interruption."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from ray import tune

from loopscale.analysis.store import trial_numbers
from loopscale.objectives import TrialConfig, train
from loopscale.search import SweepSpec
from test_kill_resume import Driver, kill_leftovers, ray_dir, trial_runs  # noqa: F401 (fixture)
from test_spec import base_spec, to_toml

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("testing_aids")]
HELD = "held"  # while this file is in the sweep's folder, its trial, trained, does not return ([testing] hold_end)


def write_sweep(folder: Path, budget: float = 8e10, log_every: int = 2, held: bool = True,
                **resources) -> SweepSpec:
    """One training trial (8e10 FLOPs: ~230 steps), a checkpoint every half second of its training unless
    ``resources`` say otherwise. ``held``: the trial waits after training, before it returns, until the test
    removes ``HELD`` (``release``): a kill after its first checkpoint then lands before it has finished, however
    fast a machine trains it (on a loaded one the checkpoint was seen late, after the trial had ended)."""
    folder.mkdir()
    aids = {"testing": {"hold_end": str(folder / HELD)}} if held else {}
    if held:
        (folder / HELD).touch()
    (folder / "spec.toml").write_text(to_toml(base_spec(
        folder, objective="train", budgets=[budget], recurrences=[2], trials_per_cell=1, sampler="grid",
        val_tokens=2048, data={"source": "kjv"}, recipe={"log_every": log_every, "compile": False},
        widths={"s_min": 2, "s_max": 2}, resources={"checkpoint_s": 0.5, **resources}, **aids)))
    return SweepSpec.from_toml(folder / "spec.toml")


def release(spec: SweepSpec) -> None:
    """Let the held trial return (``write_sweep``)."""
    (Path(spec.source).parent / HELD).unlink()


def first_checkpoint(spec: SweepSpec, driver: Driver, timeout_s: float = 240) -> None:
    """Wait until Tune's saved experiment state (a snapshot every 2 s) holds the trial's first checkpoint: what a
    resumed driver restores from."""
    path = f"{spec.placement.storage}/{spec.name}/search"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert driver.process.poll() is None, "the driver ended before the trial's first checkpoint"
        try:
            if any(t.checkpoint is not None for t in tune.ExperimentAnalysis(path).trials):
                return
        except (ValueError, OSError):  # no state yet, or one being written
            pass
        time.sleep(0.1)
    raise AssertionError("no trial checkpoint in Tune's state")


def training(spec: SweepSpec, driver: Driver, timeout_s: float = 240) -> None:
    """Wait until Tune's saved experiment state holds a progress report of the trial: it trains."""
    path = f"{spec.placement.storage}/{spec.name}/search"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert driver.process.poll() is None, "the driver ended before the trial trained"
        try:
            if any("step" in (t.last_result or {}) for t in tune.ExperimentAnalysis(path).trials):
                return
        except (ValueError, OSError):  # no state yet, or one being written
            pass
        time.sleep(0.1)
    raise AssertionError("the trial never reported progress")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def ray_worker(driver: Driver, title: str) -> int:
    """The PID of the driver's Ray worker whose process title starts with ``title``: ``ray::ImplicitFunc`` runs
    a Tune trial, ``ray::RayTrainWorker`` one worker of a data-parallel trial."""
    for pid in descendants(driver.process.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith(title):
            return pid
    raise AssertionError(f"no Ray worker {title}")


def finished_sweep(spec: SweepSpec, driver: Driver) -> None:
    assert not driver.wait_for("never printed", 1, timeout_s=400)  # read to the end
    assert driver.process.wait(timeout=30) == 0, "".join(driver.output)


_TRAINED: dict[str, tuple[dict, list[dict]]] = {}


def trained_once(params: dict) -> tuple[dict, list[dict]]:
    """The result and progress reports of the trial ``params`` trained without interruption in this process, once
    per worker for every test resuming the same trial (where its data cache lives, and its test aids of timing,
    change nothing it computes)."""
    key = json.dumps({k: v for k, v in params.items() if k not in ("cache_dir", "testing")}, sort_keys=True,
                     default=str)
    if key not in _TRAINED:
        reports: list[dict] = []
        _TRAINED[key] = train(TrialConfig.from_params(params), report=reports.append), reports
    return _TRAINED[key]


def check_resumed_run(spec: SweepSpec, tolerance: dict | None = None) -> None:
    """One FINISHED run that resumed after step 0, every curve step once, and the uninterrupted val_loss (and
    curve) of the same trial trained in one process, to ``tolerance`` (pytest.approx's; 1e-6 by default)."""
    tolerance = tolerance or {"abs": 1e-6}
    runs = trial_runs(spec)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", [r.info for r in runs]
    run = runs[0]
    assert run.data.tags["status"] == "ok"
    assert int(run.data.tags["loopscale.resumed_from_step"]) > 0 and trial_numbers(run)["resumes"] >= 1
    assert trial_numbers(run)["flops_lost"] >= 0
    trials = tune.ExperimentAnalysis(f"{spec.placement.storage}/{spec.name}/search").trials
    uninterrupted, reports = trained_once(trials[0].config["trial"])
    assert run.data.metrics["val_loss"] == pytest.approx(uninterrupted["val_loss"], **tolerance)
    assert trial_numbers(run)["tokens"] == uninterrupted["tokens"]
    assert trial_numbers(run)["flops_spent"] == uninterrupted["flops_spent"]

    # every report's step once, with the uninterrupted trial's loss; the last is the final step's train_loss
    history = MlflowClient(spec.placement.tracking_uri).get_metric_history(run.info.run_id, "train_loss")
    logged = sorted((m.step, m.value) for m in history)
    expected = sorted((r["step"], r["train_loss"]) for r in reports)
    assert expected[-1] == (uninterrupted["steps"], uninterrupted["train_loss"])
    assert [step for step, _ in logged] == [step for step, _ in expected]
    assert [value for _, value in logged] == pytest.approx([value for _, value in expected], **tolerance)
    left = [*Path(spec.placement.storage).glob(f"{spec.name}/search/*/checkpoint_*"),
            *Path(spec.placement.storage).glob(f"{spec.name}/search/data-parallel/*.state")]
    assert not left, f"checkpoints left after logging: {left}"


def test_a_trial_whose_driver_is_killed_resumes_from_its_checkpoint(tmp_path, ray_dir):
    spec = write_sweep(tmp_path / "killed")
    first = Driver(spec, ray_dir, resume=False)
    first_checkpoint(spec, first)
    first.kill(ray_dir)
    assert not trial_runs(spec) or trial_runs(spec)[0].info.status == "RUNNING"  # killed mid-trial
    release(spec)
    finished_sweep(spec, Driver(spec, ray_dir, resume=True))
    check_resumed_run(spec)


def test_a_trial_whose_worker_is_killed_resumes_from_its_checkpoint(tmp_path, ray_dir):
    spec = write_sweep(tmp_path / "retried", retries=1)
    driver = Driver(spec, ray_dir, resume=False)
    first_checkpoint(spec, driver)
    os.kill(ray_worker(driver, "ray::ImplicitFunc"), signal.SIGKILL)
    release(spec)
    finished_sweep(spec, driver)
    check_resumed_run(spec)


def test_a_trial_stopped_by_sigterm_checkpoints_first_and_resumes_there(tmp_path, ray_dir):
    # no periodic checkpoint within the test: the one it resumes from is the one taken on the signal
    spec = write_sweep(tmp_path / "preempted", held=False, checkpoint_s=3600)
    first = Driver(spec, ray_dir, resume=False)
    training(spec, first)
    first.process.send_signal(signal.SIGTERM)
    assert not first.wait_for("never printed", 1, timeout_s=120)
    assert first.process.wait(timeout=30) == 128 + signal.SIGTERM, "".join(first.output)
    assert any("take a checkpoint before the sweep stops" in line for line in first.output), "".join(first.output)
    finished_sweep(spec, Driver(spec, ray_dir, resume=True))
    check_resumed_run(spec)


def test_a_sigterm_to_the_whole_process_group_stops_the_driver_and_the_sweep_resumes(tmp_path, ray_dir):
    """``timeout``, ``kill -- -PGID`` and batch systems signal every process of the group: Ray's own processes end
    with the driver's, so the checkpoint request cannot reach the trial. The driver ends (non-zero) either way,
    within seconds (a Ray it started waits 5 s, not Ray's default 60 s, for a store that cannot come back), never
    spinning on the request, and --resume finishes the trial from its last periodic checkpoint. Which way it ends is a race the signal sets up, not the driver: its
    callback asks for checkpoints and gives up in 2 s ("did not take the checkpoint request"), or Ray's loss
    (Tune resubmitting lost objects, the driver's core worker losing its raylet) ends it first."""
    spec = write_sweep(tmp_path / "group")
    first = Driver(spec, ray_dir, resume=False, own_group=True)
    first_checkpoint(spec, first)
    os.killpg(first.process.pid, signal.SIGTERM)
    # (a bound of seconds, loose for a loaded machine, and below the 60 s the driver waited before)
    assert not first.wait_for("never printed", 1, timeout_s=45), "".join(first.output)
    assert first.process.wait(timeout=30) != 0
    kill_leftovers(ray_dir)
    release(spec)
    finished_sweep(spec, Driver(spec, ray_dir, resume=True))
    check_resumed_run(spec)


def test_a_data_parallel_trial_whose_worker_is_killed_resumes_from_rank_0s_checkpoint(tmp_path, ray_dir):
    # ~58 steps, few reports: each crosses Ray Train's controller, about a second apiece
    spec = write_sweep(tmp_path / "two", budget=2e10, log_every=10, workers=2, retries=1)
    driver = Driver(spec, ray_dir, resume=False)
    states = Path(spec.placement.storage) / spec.name / "search" / "data-parallel"
    deadline = time.monotonic() + 300
    while not list(states.glob("*.state/trial_state.pt")):
        assert driver.process.poll() is None and time.monotonic() < deadline, "".join(driver.output)
        time.sleep(0.05)
    os.kill(ray_worker(driver, "ray::RayTrainWorker"), signal.SIGKILL)
    release(spec)
    finished_sweep(spec, driver)
    # two workers sum their gradients in another order than one process: the data-parallel tolerance
    check_resumed_run(spec, {"rel": 1e-4})
