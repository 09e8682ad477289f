"""Data-parallel trials: ``[resources] workers = 2`` trains each trial on two Ray Train workers (TorchTrainer
inside the Tune trial, gloo on CPU) and must give the one-worker trial's loss curve at the same global batch, to
floating-point tolerance, logged to MLflow in the same layout; and a trial may span two Ray nodes.

Ray Train starts a controller and a worker group per trial: about 30-60 s per sweep on 2 cores, hence slow.
A spec whose workers cannot share the batch, or that no Ray here could ever hold, is one error line."""

from __future__ import annotations

import math
import os

import pytest
from mlflow.tracking import MlflowClient

from loopscale.analysis.store import trial_numbers
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from test_cluster import cluster  # noqa: F401 (a fixture)
from test_spec import write_spec



def tiny_training_sweep(tmp_path, name, workers, **overrides):
    """One cell, one width (s = 2, width 32, r = 2): a 14-step trial of 8 rows of 64 tokens per step."""
    spec = dict(name=name, objective="train", budgets=[5e9], recurrences=[2], trials_per_cell=1, sampler="grid",
                widths={"s_min": 2, "s_max": 2}, val_tokens=2048, template={"vocab_size": 256},
                data={"source": "kjv"}, recipe={"base_lr": 0.04, "ref_batch": 512, "log_every": 2},
                resources={"cpus": 1, "workers": workers, "retries": 0})
    return write_spec(tmp_path, f"{name}.toml", **{**spec, **overrides})


def trial_run(tracking_uri, name):
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    (run,) = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'")
    curve = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train_loss")]
    return run, sorted(curve)


@pytest.mark.integration
@pytest.mark.slow
def test_two_workers_reproduce_the_one_worker_curve_and_layout(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name, workers in (("one", 1), ("two", 2)):
        path = tiny_training_sweep(tmp_path, name, workers, tracking_uri=uri)
        assert main(["search", str(path)]) == 0, capsys.readouterr().err
    one, one_curve = trial_run(uri, "one")
    two, two_curve = trial_run(uri, "two")
    assert one.data.tags["status"] == two.data.tags["status"] == "ok"
    # the same optimizer steps, tokens and FLOPs: global batch and accounting do not depend on the workers
    for key in ("steps", "tokens", "flops_spent", "budget_flops", "N", "flops_per_token"):
        assert trial_numbers(one)[key] == trial_numbers(two)[key], key
    assert len(one_curve) == len(two_curve) >= 6
    for (step_1, loss_1), (step_2, loss_2) in zip(one_curve, two_curve):
        assert step_1 == step_2 and math.isclose(loss_1, loss_2, rel_tol=1e-4), (step_1, loss_1, loss_2)
    assert math.isclose(one.data.metrics["val_loss"], two.data.metrics["val_loss"], rel_tol=1e-4)
    assert one_curve[-1][1] < one_curve[0][1] - 0.5  # it learned: the curves compared are not flat
    # the same MLflow layout: params, metrics and tags by name
    assert set(one.data.params) == set(two.data.params)
    assert set(one.data.metrics) == set(two.data.metrics)
    assert set(one.data.tags) - {"mlflow.runName"} == set(two.data.tags) - {"mlflow.runName"}
    assert len(two.data.tags["node"].split(",")) == 2  # the node of each worker, in rank order


@pytest.mark.integration
@pytest.mark.slow
def test_a_trial_spans_two_ray_nodes(tmp_path, cluster, capsys):  # noqa: F811 (the fixture)
    """Head with no CPU and two 1-CPU nodes: a 2-worker trial of 1 CPU per worker must use both nodes."""
    ray_cluster, workers = cluster
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = tiny_training_sweep(tmp_path, "spread", 2, tracking_uri=uri)
    assert main(["search", str(path), "--address", ray_cluster.address]) == 0, capsys.readouterr().err
    run, curve = trial_run(uri, "spread")
    assert run.data.tags["status"] == "ok" and len(curve) >= 6
    assert set(run.data.tags["node"].split(",")) == {w.node_id for w in workers}
    assert SweepSpec.from_toml(path).placement.workers == 2


@pytest.mark.integration
@pytest.mark.slow
def test_a_failing_data_parallel_trial_fails_like_any_trial(tmp_path, capsys):
    """A worker that raises (here: a micro-batch of 3 rows, which no worker's share of 4 rows splits into) fails
    its trial as a one-worker trial fails: the sweep goes on, the run is FAILED with the worker's one line."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = tiny_training_sweep(tmp_path, "broken", 2, tracking_uri=uri,
                               recipe={"base_lr": 0.04, "ref_batch": 512, "log_every": 2, "micro_batch": 192})
    assert main(["search", str(path)]) == 0, capsys.readouterr().err
    run, _ = trial_run(uri, "broken")
    assert run.info.status == "FAILED" and run.data.tags["status"] == "failed"
    reason = run.data.tags["reason"]
    assert "recipe.micro_batch 192 must be a multiple of seq_len 64 and divide batch_tokens 256" in reason, reason
    assert "\n" not in reason


def test_workers_that_cannot_share_the_batch_are_one_line(tmp_path, capsys):
    path = tiny_training_sweep(tmp_path, "uneven", 3)  # 8 sequences per step
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is 8 sequences, which [resources] workers = 3 cannot share equally" in err and err.count("\n") == 1


@pytest.mark.integration
def test_more_workers_than_this_machine_holds_is_one_line(tmp_path, capsys):
    workers = os.cpu_count() + 1  # the local Ray a sweep starts has one CPU per core
    path = tiny_training_sweep(tmp_path, "toomany", workers, batch_tokens=64 * workers)
    assert main(["search", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"asks for {workers} workers of cpus = 1" in err and "no trial could ever start" in err
    assert not (tmp_path / "mlflow.db").exists()
