"""Every MLflow call of the analysis: reading a sweep's trial runs, logging the analysis run.

How the search lays runs out (docs/architecture.md): experiment name = sweep name; one run per trial tagged
``loopscale.kind = trial`` with tags sweep, stage, cell, r, budget, objective, status, reason, ...; the numbers
the trial returned (``store.trial_numbers``: its loss metrics and the single-valued numbers' tag, or all as
metrics in an older sweep); params = the trial config flattened (s, r, budget_flops, seed, template.*, ...).

Before MLflow touches a store it is checked (analysis/store.py: the store must exist, reading writes nothing);
every failure is a ValueError with one line, in which a URI's password is shown as ``***``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, ViewType
from mlflow.tracking import MlflowClient

from .downstream.columns import DOWNSTREAM_COLUMN
from .store import (BRANCH_COLUMN, CALIBRATION_TAG, EVAL_COLUMN, KIND_TAG, NUMBERS_TAG, SUPPRESS_URLS, DamagedNumbers,
                    check_store, iter_runs, redact, resolve_tracking_uri, runs_query, trial_numbers)

NUMERIC_KEYS = ("r", "budget_flops", "width", "n_prelude", "n_recur", "n_coda", "N_once", "N_rec", "N_embed",
                "flops_per_token", "tokens", "flops_spent", "val_loss", "lr", "s", "batch_tokens")
# Where a number lives when the trial logged no metrics (failed runs): a tag of another name.
TAG_FALLBACK = {"r": "r", "budget_flops": "budget"}
PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
# A run whose numbers tag does not read back (``store.DamagedNumbers``) is set aside: this status and reason in the
# table (the excluded runs count them together), and on stderr a line naming it and saying what is wrong
DAMAGED = "damaged"
DAMAGED_REASON = f"its {NUMBERS_TAG} tag does not read back as an object of numbers"


def _experiment(client: MlflowClient, name: str, uri: str):
    experiment = client.get_experiment_by_name(name)
    if experiment is None or experiment.lifecycle_stage != "active":
        known = sorted(e.name for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY))
        raise ValueError(f"no experiment {name!r} at {redact(uri)}" + (f"; known: {', '.join(known)}" if known else ""))
    return experiment


def _runs_of_kind(client: MlflowClient, experiment_id: str, kind: str) -> list:
    return list(iter_runs(client, experiment_id, runs_query(kind)))


def read_trial_runs(experiment: str, tracking_uri: str | None) -> tuple[list[dict[str, Any]], str]:
    """Raw rows (one per trial run) of ``experiment`` and the URI they came from; a line on stderr for each run
    set aside as ``DAMAGED``."""
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
    rows = []
    for run in runs:
        try:
            numbers = trial_numbers(run)
        except DamagedNumbers as exc:  # one line, whichever command reads the sweep; the table lists it as excluded
            print(f"loopscale: warning: set aside {exc}", file=sys.stderr, flush=True)
            numbers = None
        rows.append(_row(run, experiment, numbers))
    return rows, uri


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
    os.environ.setdefault(PROGRESS_BAR, "false")  # else a bar on stderr, before the line analyze opens with
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(sweeps[0].info.run_id, "spec.toml", tmp)
        except Exception:  # no artifact (a sweep logged by hand) or an unreachable artifact store
            return None
        spec = tomllib.loads(Path(path).read_text())
    if sweeps[0].data.tags.get("objective"):
        spec["objective"] = sweeps[0].data.tags["objective"]
    return spec


def read_sweep_calibration(experiment: str, tracking_uri: str) -> dict[str, Any] | None:
    """The calibration's choice as the sweep recorded it on its run (``CALIBRATION_TAG``: the rate, its
    interval, whether the trials told it apart; analysis/calibration.py), or None where it recorded none."""
    client = MlflowClient(tracking_uri=tracking_uri)
    sweeps = _runs_of_kind(client, _experiment(client, experiment, tracking_uri).experiment_id, "sweep")
    text = sweeps[0].data.tags.get(CALIBRATION_TAG) if sweeps else None
    return json.loads(text) if text else None


def read_sweep_progress(experiment: str, tracking_uri: str) -> dict[str, Any] | None:
    """Where the sweep behind ``experiment`` stands, from its parent run: None when it finished (or the store
    holds no sweep run), else {"planned": trials planned or None, "ended": trial runs ended, "running": trial
    runs still RUNNING, "storage": the spec's ``storage`` or None}."""
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = _experiment(client, experiment, tracking_uri)
    sweeps = _runs_of_kind(client, exp.experiment_id, "sweep")
    if not sweeps or sweeps[0].info.status == "FINISHED":
        return None
    trials = _runs_of_kind(client, exp.experiment_id, "trial")
    running = sum(run.info.status == "RUNNING" for run in trials)
    planned = sweeps[0].data.params.get("planned_trials")
    spec = read_sweep_spec(experiment, tracking_uri) or {}
    return {"planned": int(planned) if planned else None, "ended": len(trials) - running, "running": running,
            "storage": spec.get("storage")}


def _row(run, experiment: str, numbers: dict[str, float] | None) -> dict[str, Any]:
    """A trial run as a raw row from its ``numbers`` (``store.trial_numbers``); None where they are damaged: then
    status ``DAMAGED``, and only what its params and tags hold."""
    metrics, params, tags = numbers or {}, run.data.params, run.data.tags
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
    if numbers is None:
        row["status"], row["reason"] = DAMAGED, DAMAGED_REASON
    elif "status" in tags:
        row["status"], row["reason"] = tags["status"], tags.get("reason", "")
    elif "val_loss" in metrics:
        row["status"], row["reason"] = "ok", ""
    else:
        row["status"], row["reason"] = "failed", f"no status tag and no val_loss (MLflow run {run.info.status})"
    row.update({k: v for k, v in params.items() if k.startswith("template.")})
    row.update({k: v for k, v in metrics.items() if BRANCH_COLUMN.match(k)})  # warmdown branches (runs.py)
    row.update({k: v for k, v in metrics.items() if EVAL_COLUMN.match(k)})  # evaluations at other r (depth.py)
    row.update({k: v for k, v in metrics.items() if DOWNSTREAM_COLUMN.match(k)})  # task scores (downstream/)
    return row


def log_analysis(experiment: str, tracking_uri: str | None, out_dir: Path, *, metrics: dict[str, float],
                 params: dict[str, Any], tags: dict[str, str]) -> tuple[str, list[str]]:
    """Log ``out_dir`` as the artifacts of a fresh analysis run in ``experiment``, replacing the earlier ones.

    A reader sees the old analysis or the new one, never two finished and never one left RUNNING: the new run
    gets its metrics, params and artifacts first, then it is marked FINISHED and the earlier ones deleted
    (MLflow's soft delete; the UI shows one current analysis). SIGINT and SIGTERM are held off for the whole
    exchange: one that came meanwhile, like a failure, ends the new run KILLED (FAILED) and deletes it, keeping
    the old, and is then delivered. An earlier run left RUNNING (its analyze was killed) is marked KILLED before
    it is deleted. Returns (new run id, replaced run ids).
    """
    uri = resolve_tracking_uri(tracking_uri)
    check_store(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = _experiment(client, experiment, uri)
    run_id = ""
    # Signals are held for the whole exchange with the store: a SIGINT inside SQLAlchemy's commit left sqlite
    # locked and the run half-written; held, it waits for the calls in flight (seconds) and then acts.
    with _signals_held() as came:
        try:
            try:
                earlier = _runs_of_kind(client, exp.experiment_id, "analysis")
                run_id = client.create_run(exp.experiment_id, run_name="analysis",
                                           tags={KIND_TAG: "analysis", "sweep": experiment, **tags}).info.run_id
            except Exception as err:  # see read_trial_runs
                raise ValueError(redact(f"cannot log the analysis to {uri}: {type(err).__name__}: {err}"
                                        .splitlines()[0])) from None
            replaced = [run.info.run_id for run in earlier]
            now = int(time.time() * 1000)
            client.log_batch(run_id,
                             metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if math.isfinite(v)],
                             params=[Param(k, str(v)) for k, v in params.items()])
            client.log_artifacts(run_id, str(out_dir))
            if replaced:
                client.set_tag(run_id, "loopscale.replaces", ",".join(replaced))
            os.environ.setdefault(SUPPRESS_URLS, "true")  # else MLflow prints the run's URL, password included
            if came:  # interrupted while logging: the old analysis stays; the signal is delivered on leaving
                _discard(client, run_id, "KILLED")
                return run_id, []
            _commit(client, run_id, earlier)
        except Exception as exc:
            if run_id:
                _discard(client, run_id, "FAILED")
            if isinstance(exc, ValueError):
                raise
            raise ValueError(redact(f"logging the analysis run {run_id} failed: {type(exc).__name__}: {exc}"
                                    .splitlines()[0])) from None
    return run_id, replaced


def _commit(client: MlflowClient, run_id: str, earlier: list) -> None:
    """Mark the new analysis run FINISHED and delete the earlier ones; on a failure, restore those deleted."""
    deleted = []
    try:
        client.set_terminated(run_id)
        for old in earlier:
            if old.info.status == "RUNNING":
                client.set_terminated(old.info.run_id, "KILLED")
            client.delete_run(old.info.run_id)
            deleted.append(old.info.run_id)
    except Exception:
        for old in deleted:
            client.restore_run(old)
        raise


def _discard(client: MlflowClient, run_id: str, status: str) -> None:
    """End a new analysis run that will not replace the old one and delete it; a store that fails meanwhile
    leaves it as it is (the next analyze marks it KILLED and deletes it)."""
    try:
        client.set_terminated(run_id, status)
        client.delete_run(run_id)
    except Exception:  # noqa: BLE001 (the error being raised is the one to report)
        pass


@contextlib.contextmanager
def _signals_held() -> Iterator[list[int]]:
    """Hold SIGINT and SIGTERM off for a few store calls that must not be cut in two; a signal that came
    meanwhile is delivered to the previous handler on exit. Outside the main thread (no handlers there) a
    no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    came: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: came.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield came
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        for sig in dict.fromkeys(came):
            signal.raise_signal(sig)
