"""The driver-side MLflow logger against a real sqlite store: idempotent by trial key across a crash."""

from __future__ import annotations

import contextlib
import pickle
import sqlite3

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from loopscale.analysis.store import trial_numbers
from loopscale.analysis.tracking import read_trial_runs
from loopscale.objectives import TrialConfig
from loopscale.search import SweepSpec
from loopscale.search import store_template
from loopscale.search.tracking import TrialTracker, discard_stage_runs, open_sweep, ready_store
from test_spec import write_spec

META = {"stage": "search", "cell": "C=1e+12,r=1"}


def config(s: float) -> TrialConfig:
    return TrialConfig(budget_flops=1e12, r=1, s=float(s), objective="simulate", template={"depth": 6},
                       batch_tokens=2048)


def result(loss: float) -> dict:
    return {"val_loss": loss, "steps": 7, "tokens": 3584, "status": "ok", "reason": ""}


def tracker(spec: SweepSpec, experiment_id: str, parent: str) -> TrialTracker:
    t = TrialTracker(experiment_id=experiment_id, parent_run_id=parent, sweep=spec.name,
                     tags={"spec_hash": spec.spec_hash, "code_version": "test", "data_fingerprint": "simulated"},
                     flush_s=0.0)
    t.open()
    return t


def runs(spec: SweepSpec, experiment_id: str, view=ViewType.ACTIVE_ONLY) -> list:
    return MlflowClient(spec.placement.tracking_uri).search_runs([experiment_id], "tags.`loopscale.kind` = 'trial'",
                                                       run_view_type=view)


def test_a_crash_leaves_one_finished_run_per_trial_and_no_orphans(tmp_path):
    spec = SweepSpec.from_toml(write_spec(tmp_path))
    experiment_id, parent = open_sweep(spec, "simulated")
    first = tracker(spec, experiment_id, parent)
    first.start("search/a/1", META, config(2))
    first.finish("search/a/1", result(3.0))
    first.start("search/a/2", META, config(3))
    first.curve("search/a/2", {"train_loss": 4.0, "step": 5})  # flushed at once: the run exists, RUNNING
    first.start("search/a/3", META, config(4))
    first.curve("search/a/3", {"train_loss": 4.5, "step": 5})
    assert sorted(r.info.status for r in runs(spec, experiment_id)) == ["FINISHED", "RUNNING", "RUNNING"]
    assert b"mlflow.db" not in pickle.dumps(first)  # Tune pickles the logger: no store address inside

    # the driver dies; after the restore trial 1 re-runs with the same config (Tune had not saved it as
    # finished), trial 2 restarts, trial 3 was lost and never comes back, and trial 4 is new
    second = tracker(spec, experiment_id, parent)
    for key, s in (("search/a/1", 2), ("search/a/2", 3), ("search/a/4", 5)):
        second.start(key, META, config(s))
        second.curve(key, {"train_loss": 3.9, "step": 5})
        second.finish(key, result(3.1))
    second.close()
    active = runs(spec, experiment_id)
    assert sorted(r.data.tags["trial_key"] for r in active) == ["search/a/1", "search/a/2", "search/a/4"]
    assert all(r.info.status == "FINISHED" for r in active)
    assert not [r for r in runs(spec, experiment_id, ViewType.ALL)
                if r.info.status == "RUNNING" and r.info.lifecycle_stage == "active"]
    by_key = {r.data.tags["trial_key"]: r for r in active}
    assert by_key["search/a/1"].data.metrics["val_loss"] == 3.0  # kept from before the crash, not re-logged
    history = MlflowClient(spec.placement.tracking_uri).get_metric_history(by_key["search/a/2"].info.run_id,
                                                                           "train_loss")
    assert [(m.step, m.value) for m in history] == [(5, 3.9)]  # the restarted trial's curve only

    # a key re-used for a different config (a stage restarted without Tune state) replaces its run
    third = tracker(spec, experiment_id, parent)
    third.start("search/a/4", META, config(6))
    third.finish("search/a/4", {**result(3.3), "status": "diverged", "reason": "loss exploded"})
    third.start("search/a/5", META, config(7))
    third.fail("search/a/5", "ValueError: math domain error")
    third.close()
    by_key = {r.data.tags["trial_key"]: r for r in runs(spec, experiment_id)}
    assert by_key["search/a/4"].data.params["s"] == "6.0"
    assert (by_key["search/a/4"].data.tags["status"], by_key["search/a/4"].info.status) == ("diverged", "FINISHED")
    assert by_key["search/a/4"].data.tags["reason"] == "loss exploded"
    assert (by_key["search/a/5"].data.tags["status"], by_key["search/a/5"].info.status) == ("failed", "FAILED")

    discard_stage_runs(spec.placement.tracking_uri, experiment_id, parent, "search")
    assert runs(spec, experiment_id) == []


def history(spec: SweepSpec, run) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(spec.placement.tracking_uri).get_metric_history(run.info.run_id,
                                                                                         "train_loss")]


def test_a_trial_retried_after_its_receipt_finishes_the_run_it_streamed(tmp_path):
    # Tune retries a trial whose first attempt trained to the end (a failure while Tune stopped it): the retry
    # reports the receipt at once, with no curve of its own
    spec = SweepSpec.from_toml(write_spec(tmp_path))
    experiment_id, parent = open_sweep(spec, "simulated")
    t = tracker(spec, experiment_id, parent)
    t.start("search/a/1", META, config(2))
    for step in (1, 10, 20):
        t.curve("search/a/1", {"train_loss": 5.0 - step / 10, "step": step})
    t.start("search/a/1", META, config(2))  # the retry
    t.finish("search/a/1", {**result(3.0), "steps": 20, "train_loss": 3.0})
    t.close({"search/a/1"})
    (run,) = runs(spec, experiment_id, ViewType.ALL)  # one run ever, none deleted
    assert (run.info.lifecycle_stage, run.info.status) == ("active", "FINISHED")
    assert history(spec, run) == [(1, 4.9), (10, 4.0), (20, 3.0)]  # each step once: the final one is streamed
    assert run.data.metrics["train_loss"] == 3.0

    # a retry that trains again streams from its first step: its run replaces the earlier attempt's
    t.start("search/a/2", META, config(3))
    t.curve("search/a/2", {"train_loss": 4.0, "step": 10})
    t.start("search/a/2", META, config(3))
    t.curve("search/a/2", {"train_loss": 4.4, "step": 1})
    t.finish("search/a/2", result(3.5))
    by_key = {r.data.tags["trial_key"]: r for r in runs(spec, experiment_id)}
    assert history(spec, by_key["search/a/2"]) == [(1, 4.4)]


def test_a_run_outlives_a_killed_driver_when_its_trial_had_ended(tmp_path):
    # the driver dies after Tune ended a trial but before its run ended; the resumed stage ends with the trial
    # ended in Tune (not restarted) and logs its receipt into the run that streamed its curve
    spec = SweepSpec.from_toml(write_spec(tmp_path))
    experiment_id, parent = open_sweep(spec, "simulated")
    first = tracker(spec, experiment_id, parent)
    first.start("search/a/1", META, config(2))
    first.curve("search/a/1", {"train_loss": 4.0, "step": 10})
    first.start("search/a/2", META, config(3))
    first.curve("search/a/2", {"train_loss": 4.2, "step": 10})  # never comes back
    (streamed,) = [r for r in runs(spec, experiment_id) if r.data.tags["trial_key"] == "search/a/1"]

    resumed = tracker(spec, experiment_id, parent)
    resumed.close({"search/a/1"})
    reconcile = tracker(spec, experiment_id, parent)
    reconcile.start("search/a/1", META, config(2))
    reconcile.finish("search/a/1", {**result(3.0), "steps": 10, "train_loss": 4.0})  # its curve ended there
    (run,) = runs(spec, experiment_id)
    assert (run.info.run_id, run.info.status, run.info.start_time) == (streamed.info.run_id, "FINISHED",
                                                                       streamed.info.start_time)
    assert history(spec, run) == [(10, 4.0)]
    assert [r.data.tags["trial_key"] for r in runs(spec, experiment_id, ViewType.DELETED_ONLY)] == ["search/a/2"]


def schema(database) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(database)) as db:
        return db.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_a_new_store_copied_from_the_cached_empty_one_equals_one_mlflow_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    built, copied = tmp_path / "a" / "mlflow.db", tmp_path / "b" / "mlflow.db"
    ready_store(f"sqlite:///{built}")  # no template yet: MLflow migrates, and the empty store is kept
    template = store_template.template_path()
    assert template.is_file() and str(template).startswith(str(tmp_path / "cache"))
    with contextlib.closing(sqlite3.connect(template)) as db:
        assert db.execute("SELECT count(*) FROM experiments").fetchone() == (0,)

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # MLflow puts Default's artifacts under the opener's folder
    ready_store(f"sqlite:///{copied}")
    assert schema(copied) == schema(built)
    default = MlflowClient(f"sqlite:///{copied}").get_experiment("0")
    assert default.name == "Default"
    assert default.artifact_location == str(tmp_path / "elsewhere" / "mlruns" / "0")
    client = MlflowClient(f"sqlite:///{copied}")  # and it is a working store
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "val_loss", 3.0)
    assert client.get_run(run.info.run_id).data.metrics == {"val_loss": 3.0}


def test_a_trial_charts_only_its_losses_and_keeps_its_other_numbers_in_one_tag(tmp_path):
    """The UI draws a chart per metric: a trial's run holds train_loss and val_loss as metrics and every
    single-valued number (sizes, tokens, FLOPs, branches' values) in the numbers tag, read back at full
    precision, as the analysis reads them; a run logged the old way (all metrics) reads the same."""
    spec = SweepSpec.from_toml(write_spec(tmp_path))
    experiment_id, parent = open_sweep(spec, "simulated")
    t = tracker(spec, experiment_id, parent)
    t.start("search/a/1", META, config(2))
    t.curve("search/a/1", {"train_loss": 4.0, "step": 5})
    final = {**result(3.0), "steps": 7, "train_loss": 3.5, "N": 12345, "lr": 0.1 / 3, "branch0.val_loss": 3.25}
    many = {f"module.gate{i}": i / 7 for i in range(400)}  # past MLflow's tag length: the tag continues
    t.finish("search/a/1", {**final, **many})
    (run,) = runs(spec, experiment_id)
    assert set(run.data.metrics) == {"train_loss", "val_loss"} and "loopscale.numbers.1" in run.data.tags
    assert trial_numbers(run) == {k: v for k, v in {**final, **many}.items() if k not in ("status", "reason")}

    old = MlflowClient(spec.placement.tracking_uri).create_run(experiment_id, tags={
        "loopscale.kind": "trial", "sweep": spec.name, "stage": "search", "cell": META["cell"], "status": "ok"})
    for key in ("val_loss", "steps", "tokens", "N", "lr", "branch0.val_loss"):
        MlflowClient(spec.placement.tracking_uri).log_metric(old.info.run_id, key, float(final[key]), step=7)
    rows = {row["run_id"]: row for row in read_trial_runs(spec.name, spec.placement.tracking_uri)[0]}
    assert rows[run.info.run_id]["branch0.val_loss"] == rows[old.info.run_id]["branch0.val_loss"] == 3.25
    assert rows[run.info.run_id]["tokens"] == rows[old.info.run_id]["tokens"] == 3584
    assert rows[run.info.run_id]["lr"] == rows[old.info.run_id]["lr"] == 0.1 / 3


def test_a_sweep_opens_as_training_runs_and_an_older_one_is_tagged_when_reused(tmp_path):
    """MLflow 3 reads an experiment's kind from its tag (training, not GenAI): a new sweep's experiment has it,
    and one made before the tag existed gets it when the sweep resumes into it."""
    spec = SweepSpec.from_toml(write_spec(tmp_path))
    client = MlflowClient(spec.placement.tracking_uri)
    experiment_id, _ = open_sweep(spec, "simulated")
    assert client.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    client.delete_experiment_tag(experiment_id, "mlflow.experimentKind")
    assert open_sweep(spec, "simulated")[0] == experiment_id
    assert client.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_storage_path_with_a_password_is_not_recorded_on_the_parent_run(tmp_path):
    from loopscale.search.tracking import FOLDER_TAGS, folder_tags

    plain = folder_tags(SweepSpec.from_toml(write_spec(tmp_path)))
    assert plain[FOLDER_TAGS["storage"]] and plain[FOLDER_TAGS["cache_dir"]]
    secret = folder_tags(SweepSpec.from_toml(write_spec(tmp_path, storage="s3://alice:hunter2@bucket/tune")))
    assert FOLDER_TAGS["storage"] not in secret and "hunter2" not in repr(secret)
    assert secret[FOLDER_TAGS["cache_dir"]] == plain[FOLDER_TAGS["cache_dir"]]
