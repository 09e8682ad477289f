"""A clean sweep of real training (real Ray Tune, Optuna, MLflow and torch) leaves one run per trial: never a
deleted or re-created run, each FINISHED with every point of its streamed ``train_loss`` curve and a duration
that spans its training.

The sweep is the demo's (its template, the law sampler, warmdown branches from the recipe) shrunk to two
budgets and two r. Each larger-budget trial branches into the smaller budget at its own width, which the
smaller cell may not have (there only s = 1 fits the budget): such a branch cannot enter the law the sampler
fits, and when it did, the searcher raised inside Tune's end of the trial, Tune retried the trial, the retry
reported its receipt, and its streamed run was replaced by one with the final point only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from loopscale.analysis.store import trial_numbers
from loopscale.search import SweepSpec
from loopscale.search.tune.driver import run_search

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOG_EVERY = 10
SPEC = f"""
name = "clean"
objective = "train"
seed = 0
budgets = [1e10, 4.5e10]
recurrences = [1, 2]
seq_len = 128
batch_tokens = 4096
val_tokens = 4096
trials_per_cell = 3
sampler = "law"
min_steps = 10
first_guess_tokens_per_param = 50

[template]
depth = 8
prelude = 2
coda = 2
width_unit = 8
head_dim = 8
injection = "hyperconnect"

[widths]
s_min = 1
s_max = 32
tokens_per_param = [3, 1000]

[data]
source = "kjv"

[recipe]
optimizer = "muonh"
base_lr = 0.02
ref_batch = 4096
log_every = {LOG_EVERY}
schedule = "wsd"
branch_budgets = [1e10]

[resources]
cpus = 1
retries = 1
"""


def streamed_steps(steps: int) -> set[int]:
    """The steps at which a training trial of ``steps`` steps reports its loss (objectives/training.py)."""
    return {1, steps, *range(LOG_EVERY, steps + 1, LOG_EVERY)}


def test_a_clean_sweep_keeps_every_streamed_run(tmp_path: Path):
    path = tmp_path / "clean.toml"
    path.write_text(f'tracking_uri = "sqlite:///{tmp_path}/mlflow.db"\nstorage = "{tmp_path}/tune"\n' + SPEC)
    spec = SweepSpec.from_toml(str(path))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        outcome = run_search(spec)
    finally:
        ray.shutdown()

    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    query = "tags.`loopscale.kind` = 'trial'"
    assert client.search_runs([experiment.experiment_id], query, run_view_type=ViewType.DELETED_ONLY) == []
    runs = client.search_runs([experiment.experiment_id], query, max_results=1000)
    keys = sorted(r["trial_key"] for r in outcome.stages["search"].results)
    assert sorted(r.data.tags["trial_key"] for r in runs) == keys
    assert any(trial_numbers(r)["width"] > 8 and r.data.tags["budget"] == "4.5e+10" for r in runs), \
        "no trial branched at a width its branch's cell lacks: the sweep does not test what it means to"
    for run in runs:
        key, metrics = run.data.tags["trial_key"], trial_numbers(run)
        assert (run.info.status, run.data.tags["status"]) == ("FINISHED", "ok"), key
        curve = client.get_metric_history(run.info.run_id, "train_loss")
        assert {m.step for m in curve} == streamed_steps(int(metrics["steps"])), key
        assert len(curve) == len(streamed_steps(int(metrics["steps"]))), key  # each step once, the last one too
        assert run.info.end_time - run.info.start_time >= 1000 * metrics["wall_s"], key
