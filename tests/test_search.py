"""Sweeps end to end with real Ray Tune, real Optuna and a real MLflow sqlite store in a temp dir.

One Ray session serves the module (starting Ray costs 5-12 s here); ``run_search`` leaves a running Ray alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import ray
from mlflow.tracking import MlflowClient

from loopscale import objectives
from loopscale.analysis.store import trial_numbers
from loopscale.model import JointLaw, PAPER_LAW, count_params, tokens_for_budget
from loopscale.search import SweepSpec
from loopscale.search.tune.driver import run_search
from test_spec import write_spec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def trial_runs(spec: SweepSpec) -> list:
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    return client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'", max_results=1000)


def heads(spec: SweepSpec, s: float) -> int:
    return round(s * spec.grid.width_unit / spec.grid.head_dim)


def journal_studies(spec: SweepSpec, stage: str = "search") -> dict[str, list[int]]:
    """Cell -> heads of the COMPLETE trials of its study, read back with Optuna's own API from the sweep's
    journal file; every study must have ended (nothing RUNNING or WAITING) and be named ``<sweep>/<stage>/<cell>``."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(Path(spec.placement.storage) / spec.name / "optuna.journal")))
    names = optuna.get_all_study_names(storage)
    assert sorted(names) == sorted(f"{spec.name}/{stage}/{c.key}" for c in spec.cells(stage))
    studies = {name.rpartition("/")[2]: optuna.load_study(study_name=name, storage=storage) for name in names}
    assert all(t.state.name in ("COMPLETE", "FAIL") for study in studies.values() for t in study.trials)
    return {key: sorted(t.params["heads"] for t in study.trials if t.state.name == "COMPLETE")
            for key, study in studies.items()}


def sweep_run(spec: SweepSpec):
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    (run,) = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'sweep'")
    return run


@pytest.mark.slow
def test_simulated_sweep_logs_exactly_the_planned_runs(tmp_path, capsys):
    spec = SweepSpec.from_toml(write_spec(tmp_path, recurrences=[1, 2, 4], trials_per_cell=3))
    outcome = run_search(spec)
    runs = trial_runs(spec)
    cells = {c.key: c for c in spec.cells()}
    assert len(runs) == spec.planned_trials() == 18

    parent = sweep_run(spec)
    assert parent.info.status == "FINISHED" and parent.data.tags["spec_hash"] == spec.spec_hash
    artifacts = [a.path for a in MlflowClient(spec.placement.tracking_uri).list_artifacts(parent.info.run_id)]
    assert sorted(artifacts) == ["flops_spent.json", "spec.toml"]
    assert trial_numbers(parent)["flops_spent"] > 0 and not parent.data.metrics  # one value: no chart

    keys = set()
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, trial_numbers(run)
        cell = cells[tags["cell"]]
        assert run.info.status == "FINISHED" and tags["loopscale.sweep_run"] == parent.info.run_id
        assert (tags["sweep"], tags["stage"], tags["objective"], tags["status"], tags["reason"]) == \
            ("t", "search", "simulate", "ok", "")
        assert tags["r"] == str(cell.r) and float(tags["budget"]) == cell.budget
        assert tags["spec_hash"] == spec.spec_hash and tags["data_fingerprint"] == "simulated"
        assert tags["code_version"]
        keys.add(tags["trial_key"])
        # params are the flattened trial config; metrics are what the objective returns for it
        s = float(params["s"])
        assert s in cell.widths and params["template.depth"] == "6" and params["objective"] == "simulate"
        assert float(params["budget_flops"]) == cell.budget and params["seed"] == "0"
        config = spec.grid.model(s, cell.r)
        p = count_params(config)
        tokens = tokens_for_budget(config, cell.budget, spec.grid.batch_tokens)
        assert (metrics["N_once"], metrics["N_rec"], metrics["tokens"]) == (p.N_once, p.N_rec, tokens)
        expected = objectives.simulate(spec.trial_config(cell, s))["val_loss"]
        assert metrics["val_loss"] == pytest.approx(expected, rel=1e-12)
        assert abs(metrics["val_loss"] - PAPER_LAW.loss(p.N_once, p.N_rec, cell.r, tokens)) < 0.1
    assert len(keys) == len(runs)

    # every cell ran its trials on distinct widths, and its Optuna study holds them
    by_cell: dict[str, list[float]] = {}
    for run in runs:
        by_cell.setdefault(run.data.tags["cell"], []).append(float(run.data.params["s"]))
    assert {k: len(v) for k, v in by_cell.items()} == {k: c.n_trials for k, c in cells.items()}
    assert all(len(set(v)) == len(v) for v in by_cell.values())
    for key, study in outcome.stages["search"].studies.items():
        assert len([t for t in study.trials if t.state.name == "COMPLETE"]) == cells[key].n_trials
    assert journal_studies(spec) == {key: sorted(heads(spec, s) for s in v) for key, v in by_cell.items()}
    out = capsys.readouterr().out
    assert "[search 18/18]" in out and "best val_loss" in out

    # running it again, with or without --resume, is a no-op
    assert run_search(spec).already_complete and run_search(spec, resume=True).already_complete
    assert len(trial_runs(spec)) == 18


def test_existing_state_needs_resume_and_the_same_spec(tmp_path):
    path = write_spec(tmp_path, budgets=[1e12], recurrences=[1], trials_per_cell=1)
    spec = SweepSpec.from_toml(path)
    state = Path(spec.placement.storage) / spec.name / "sweep.json"
    state.parent.mkdir(parents=True)
    state.write_text(f'{{"spec_hash": "{spec.spec_hash}", "complete": false}}')
    with pytest.raises(ValueError, match="pass --resume"):
        run_search(spec)
    other = SweepSpec.from_toml(write_spec(tmp_path, "b.toml", budgets=[1e12], recurrences=[1], trials_per_cell=2))
    with pytest.raises(ValueError, match="different spec"):
        run_search(other, resume=True)
    assert not Path(spec.placement.tracking_uri.removeprefix("sqlite:///")).exists()  # refused before touching MLflow


@pytest.mark.slow
def test_failing_trials_are_retried_logged_and_do_not_stop_the_sweep(tmp_path):
    # A law whose loss turns negative for large models: those simulated trials raise (log of a negative loss).
    law = {**PAPER_LAW.to_dict(), "E": -8.5}
    spec = SweepSpec.from_toml(write_spec(tmp_path, budgets=[1e13], recurrences=[1, 2], trials_per_cell=3,
                                          sampler="grid", simulate={"law": law, "noise": 0.0, "cell_noise": 0.0,
                                                                           "misspec": 0.0},
                                          resources={"retries": 1}))
    run_search(spec)
    runs = trial_runs(spec)
    assert len(runs) == spec.planned_trials() == 6
    doomed = JointLaw(**law)
    failed = 0
    for run in runs:
        s, r = float(run.data.params["s"]), int(run.data.params["r"])
        config = spec.grid.model(s, r)
        p = count_params(config)
        negative = doomed.loss(p.N_once, p.N_rec, r, tokens_for_budget(config, 1e13, spec.grid.batch_tokens)) <= 0
        if negative:
            failed += 1
            assert (run.info.status, run.data.tags["status"]) == ("FAILED", "failed")
            assert "math domain error" in run.data.tags["reason"]
        else:
            assert (run.info.status, run.data.tags["status"]) == ("FINISHED", "ok")
            assert math.isfinite(run.data.metrics["val_loss"])
    assert 0 < failed < len(runs)
    # each failed trial ran twice (one retry) before it was given up
    errors = list(Path(spec.placement.storage, spec.name, "search").glob("*/error.txt"))
    assert len(errors) == failed and all("Failure # 2" in e.read_text() for e in errors)


@pytest.mark.slow
def test_tiny_real_training_sweep(tmp_path):
    # calibration of the LM head's rate on a 2-point grid: a sane rate and an absurd one that diverges; the sane
    # one is transferred to the search trials (ref_batch = the batch: the rates act as written, no batch transfer)
    spec = SweepSpec.from_toml(write_spec(
        tmp_path, objective="train", budgets=[4e9], recurrences=[2], trials_per_cell=2, sampler="grid",
        val_tokens=2048, data={"source": "kjv"}, recipe={"log_every": 2, "ref_batch": 512}, widths={"s_min": 1, "s_max": 3},
        calibrate={"budget": 4e9, "s": 2, "r": 2, "trials": 2, "low": 0.004, "high": 1e4, "param": "head_lr"}))
    outcome = run_search(spec)
    runs = trial_runs(spec)
    assert len(runs) == spec.planned_trials() == 4
    fingerprint = objectives.prepare_data(spec.training.data, spec.grid.seq_len, spec.placement.cache_dir,
                                          spec.training.val_tokens)
    sane, absurd = sorted((r for r in runs if r.data.tags["stage"] == "calibrate"),
                          key=lambda r: float(r.data.params["recipe.head_lr"]))
    assert float(sane.data.params["recipe.head_lr"]) == pytest.approx(0.004)
    assert float(absurd.data.params["recipe.head_lr"]) == pytest.approx(1e4)
    assert sane.data.tags["status"] == "ok" and absurd.data.tags["status"] == "diverged"
    assert absurd.info.status == "FINISHED" and absurd.data.tags["reason"]
    assert outcome.stages["calibrate"].best()["trial"]["recipe"]["head_lr"] == pytest.approx(0.004)
    client = MlflowClient(spec.placement.tracking_uri)
    for run in runs:
        assert run.data.tags["objective"] == "train" and run.data.tags["data_fingerprint"] == fingerprint
        if run.data.tags["stage"] == "search":
            assert float(run.data.params["recipe.head_lr"]) == pytest.approx(0.004)  # the calibrated rate
            assert run.data.tags["status"] == "ok" and trial_numbers(run)["flops_spent"] <= 4e9
            curve = client.get_metric_history(run.info.run_id, "train_loss")
            assert len({m.step for m in curve}) >= 3  # the training curve reached MLflow


@pytest.mark.slow
def test_a_remote_tracking_server_gets_the_same_layout(tmp_path):
    from servers import mlflow_server

    with mlflow_server(f"sqlite:///{tmp_path / 'server.db'}", str(tmp_path / "server-artifacts")) as url:
        spec = SweepSpec.from_toml(write_spec(tmp_path, tracking_uri=url, budgets=[1e12], trials_per_cell=2))
        run_search(spec)
        runs = trial_runs(spec)
        assert len(runs) == spec.planned_trials() == 4
        assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "ok" for r in runs)
        parent = sweep_run(spec)
        artifacts = [a.path for a in MlflowClient(url).list_artifacts(parent.info.run_id)]
        assert artifacts == ["flops_spent.json", "spec.toml"]
    assert not (tmp_path / "mlflow.db").exists()  # nothing went to a local store
