"""Every MLflow call of the analysis: reading a sweep's trial runs, logging the analysis run.

How the search lays runs out (search/tracking.py): experiment name = sweep name; one run per trial tagged
``loopscale.kind = trial`` with tags sweep, stage, cell, r, budget, objective, status, reason, ...; metrics =
the numbers the trial returned; params = the trial config flattened (s, r, budget_flops, seed, template.*, ...).

Before MLflow touches a store it is checked (analysis/store.py: the store must exist, reading writes nothing);
every failure is a ValueError with one line, in which a URI's password is shown as ``***``.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, ViewType
from mlflow.tracking import MlflowClient

from .store import (BRANCH_COLUMN, KIND_TAG, SUPPRESS_URLS, check_store, iter_runs, redact, resolve_tracking_uri,
                    runs_query)

NUMERIC_KEYS = ("r", "budget_flops", "width", "n_prelude", "n_recur", "n_coda", "N_once", "N_rec", "N_embed",
                "flops_per_token", "tokens", "flops_spent", "val_loss", "lr", "s", "batch_tokens")
# Where a number lives when the trial logged no metrics (failed runs): a tag of another name.
TAG_FALLBACK = {"r": "r", "budget_flops": "budget"}


def _experiment(client: MlflowClient, name: str, uri: str):
    experiment = client.get_experiment_by_name(name)
    if experiment is None or experiment.lifecycle_stage != "active":
        known = sorted(e.name for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY))
        raise ValueError(f"no experiment {name!r} at {redact(uri)}" + (f"; known: {', '.join(known)}" if known else ""))
    return experiment


def _runs_of_kind(client: MlflowClient, experiment_id: str, kind: str) -> list:
    return list(iter_runs(client, experiment_id, runs_query(kind)))


def read_trial_runs(experiment: str, tracking_uri: str | None) -> tuple[list[dict[str, Any]], str]:
    """Raw rows (one per trial run) of ``experiment`` and the URI they came from."""
    uri = resolve_tracking_uri(tracking_uri)
    check_store(uri)
    try:
        client = MlflowClient(tracking_uri=uri)
        exp = _experiment(client, experiment, uri)
        runs = _runs_of_kind(client, exp.experiment_id, "trial")
    except ValueError:
        raise
    except Exception as err:  # the store's client raises many types (SQLAlchemy, requests, MlflowException)
        raise ValueError(redact(f"cannot read experiment {experiment!r} at {uri}: "
                                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")) from None
    if not runs:
        raise ValueError(f"experiment {experiment!r} at {redact(uri)} has no trial runs")
    return [_row(run, experiment) for run in runs], uri


def read_sweep_spec(experiment: str, tracking_uri: str) -> dict[str, Any] | None:
    """The spec the sweep ran with (its parent run's ``spec.toml``, parsed, with the objective it ran, which
    ``--objective`` may have changed), or None if the store has none."""
    import tempfile
    import tomllib

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = _experiment(client, experiment, tracking_uri)
    sweeps = _runs_of_kind(client, exp.experiment_id, "sweep")
    if not sweeps:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(sweeps[0].info.run_id, "spec.toml", tmp)
        except Exception:  # no artifact (a sweep logged by hand) or an unreachable artifact store
            return None
        spec = tomllib.loads(Path(path).read_text())
    if sweeps[0].data.tags.get("objective"):
        spec["objective"] = sweeps[0].data.tags["objective"]
    return spec


def _row(run, experiment: str) -> dict[str, Any]:
    metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
    row: dict[str, Any] = {
        "run_id": run.info.run_id, "sweep": tags.get("sweep", experiment), "stage": tags.get("stage", "search"),
        "cell": tags.get("cell", ""), "cell_widths": tags.get("cell_widths", ""),
        "objective": tags.get("objective", params.get("objective", "")),
        "seed": params.get("seed"),
    }
    for key in NUMERIC_KEYS:
        value = metrics.get(key, params.get(key))
        if value is None and key in TAG_FALLBACK:
            value = tags.get(TAG_FALLBACK[key])
        row[key] = value
    if "status" in tags:
        row["status"], row["reason"] = tags["status"], tags.get("reason", "")
    elif "val_loss" in metrics:
        row["status"], row["reason"] = "ok", ""
    else:
        row["status"], row["reason"] = "failed", f"no status tag and no val_loss (MLflow run {run.info.status})"
    row.update({k: v for k, v in params.items() if k.startswith("template.")})
    row.update({k: v for k, v in metrics.items() if BRANCH_COLUMN.match(k)})  # warmdown branches (runs.py)
    return row


def log_analysis(experiment: str, tracking_uri: str | None, out_dir: Path, *, metrics: dict[str, float],
                 params: dict[str, Any], tags: dict[str, str]) -> tuple[str, list[str]]:
    """Log ``out_dir`` as the artifacts of a fresh analysis run in ``experiment``.

    Earlier analysis runs of the experiment are deleted (MLflow's soft delete) so the UI shows one current
    analysis. Returns (new run id, replaced run ids).
    """
    uri = resolve_tracking_uri(tracking_uri)
    check_store(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = _experiment(client, experiment, uri)
    try:
        replaced = [run.info.run_id for run in _runs_of_kind(client, exp.experiment_id, "analysis")]
        run_id = client.create_run(exp.experiment_id, run_name="analysis",
                                   tags={KIND_TAG: "analysis", "sweep": experiment, **tags}).info.run_id
    except Exception as err:  # see read_trial_runs
        message = f"cannot log the analysis to {uri}: {type(err).__name__}: {err}".splitlines()[0]
        raise ValueError(redact(message)) from None
    try:
        now = int(time.time() * 1000)
        client.log_batch(run_id,
                         metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if math.isfinite(v)],
                         params=[Param(k, str(v)) for k, v in params.items()])
        client.log_artifacts(run_id, str(out_dir))
        if replaced:
            client.set_tag(run_id, "loopscale.replaces", ",".join(replaced))
        os.environ.setdefault(SUPPRESS_URLS, "true")  # else MLflow prints the run's URL, password included
        client.set_terminated(run_id)
        for old in replaced:  # only once the new run is complete
            client.delete_run(old)
    except Exception as err:
        client.set_terminated(run_id, status="FAILED")
        raise ValueError(redact(f"logging the analysis run {run_id} failed: {type(err).__name__}: {err}"
                                .splitlines()[0])) from None
    return run_id, replaced
