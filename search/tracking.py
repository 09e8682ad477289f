"""MLflow from the driver only: the sweep's experiment, its parent run, and one run per trial.

Layout (``analysis`` reads exactly this):

* experiment = the sweep name; for a sqlite store its artifacts live beside the database file.
* a parent run per sweep: tag ``loopscale.kind = "sweep"``, the spec file (secrets redacted) as an artifact, and
  where its relative paths lie (``folder_tags``).
* one run per trial nested under it (``mlflow.parentRunId``): tag ``loopscale.kind = "trial"`` and tags
  ``sweep, stage, cell, r, budget, objective, spec_hash, code_version, data_fingerprint, status, reason,
  trial_key`` and ``node`` (the id of the Ray node the trial ran on, once it finished); params = the trial
  config flattened (``template.depth``, ``recipe.lr``, ...); metrics = the ``train_loss`` curve and the final
  ``val_loss`` at step = its optimizer steps (``store.CHARTED``: the run's charts); every other number of the
  trial's final result in the JSON tag ``loopscale.numbers`` (``store.NUMBERS_TAG``). A trial whose receipt a full
  disk refused carries it in tags ``loopscale.receipt.0``, ``.1``, ... (pieces of MLflow's tag length limit),
  for ``--resume`` to write it back (``tune.receipts.restore_receipts``). A trial whose trained model is kept
  (``[resources] keep_models``, search/tune/keep.py) holds it as the artifact ``model.pt``, tagged
  ``loopscale.model`` and, with the file's sha256, ``loopscale.model.sha256``.

Idempotent by ``trial_key`` so a killed and resumed sweep ends with exactly one run per trial, under the one
sweep run of the store it logs to (``TrialTracker.open``): a trial whose run already FINISHED (or FAILED) is
not logged again. A trial that starts again (Tune retries it, or a resumed
sweep restarts it) keeps its earlier run, the curve that attempt streamed included, and that run is the one
that ends when the new attempt reports its receipt (``run_trial``: the attempt trained to the end before).
Only an attempt that trains again, and so streams its curve again from the first step, replaces that run.
Runs of trials that never restart are deleted when the stage ends, except those of trials Tune ended (their
receipts are logged into them afterwards: ``tune.stage._log_if_missing``). Each run starts when its trial
starts, so its duration is the trial's. Writes are batched (``log_batch``): one batch creates the run (with
the first curve points, ``flush_s`` after the trial starts, or with the result), then curve points every
``flush_s``, and one batch when it ends.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import math
from collections.abc import Collection, Iterator
from contextlib import contextmanager
import os
import re
import subprocess
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from loopscale.analysis import numbers
from loopscale.analysis.store import (CALIBRATION_TAG, CHARTED, KIND_TAG, OPTIONS_PARAM, SUPPRESS_URLS, failure_text,
                                      iter_runs, numbers_tags, redact, runs_query, sqlite_path, store_failure_types)
from loopscale.objectives import METRIC_KEYS, TrialConfig
from loopscale.objectives.trial import is_branch_key, is_module_key

from .spec import SweepSpec
from .stopping import StoreFailure
from .store_template import write_empty_store
from .ui import KIND_TAGS, VIEW_TAG, loss_tag, runs_view, view_tags

# The sweep's run id on every trial run. Not MLflow's own mlflow.parentRunId: the UI folds nested runs under
# their parent, hiding the trials a user wants to sort and compare by r, budget and width.
PARENT_TAG = "loopscale.sweep_run"
CURVE_KEYS = ("train_loss",)  # what a training report carries besides its step
RECEIPT_TAG = "loopscale.receipt"  # + ".<i>": the pieces of a receipt the disk refused (TrialTracker.finish)
KEPT_TAG = "loopscale.model"  # a trial run that holds its trained model: the artifact's path (loopscale.load_model)
KEPT_DIGEST_TAG = "loopscale.model.sha256"  # the sha256 of the file kept, which load_model checks the artifact against
RESUMED_TAG = "loopscale.resumed_from_step"  # the step a checkpointed trial's last resume started from
# Where the sweep's driver resolved the spec's relative paths, on the parent run (``folder_tags``): its Tune storage
# and cache against the working folder, its architecture file against the spec's folder
FOLDER_TAGS = {"storage": "loopscale.storage", "cache_dir": "loopscale.cache_dir"}
SPEC_FOLDER_TAG = "loopscale.spec_folder"
_SECRET_KEY = re.compile(r"(?i)(password|passwd|pwd|secret|(api|access|secret|private)_?key|credentials?|auth|"
                         r"(^|_)token)$")


# ---- secrets ---------------------------------------------------------------------------------------------
def is_secret_key(name: str) -> bool:
    """Keys whose values are never logged: passwords, secrets, API keys, tokens (``hf_token``; not ``val_tokens``)."""
    return bool(_SECRET_KEY.search(name.split(".")[-1]))


def redact_text(text: str) -> str:
    """A TOML text with URI passwords and the values of secret-looking keys replaced by ``***``: the value of
    such a key is replaced wherever it appears (its own line, an inline table, a comment that repeats it)."""
    try:
        values = {str(v) for v in _secret_values(tomllib.loads(text)) if str(v)}
    except tomllib.TOMLDecodeError:
        values = set()
    for value in sorted(values, key=len, reverse=True):  # longest first: one secret may contain another
        text = text.replace(value, "***")
    lines = []
    for line in redact(text).splitlines():
        key, eq, _ = line.partition("=")
        lines.append(f"{key}= \"***\"" if eq and is_secret_key(key.strip().strip('"')) else line)
    return "\n".join(lines) + "\n"


def _secret_values(tree: Any, secret: bool = False) -> list[Any]:
    """The scalar values under secret-looking keys at any depth of a parsed TOML document."""
    if isinstance(tree, dict):
        return [v for key, value in tree.items() for v in _secret_values(value, secret or is_secret_key(key))]
    if isinstance(tree, list):
        return [v for item in tree for v in _secret_values(item, secret)]
    return [tree] if secret else []


def flatten_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested trial config as MLflow params: dotted keys, string values, secrets redacted; a factory's options
    one param, their JSON (``OPTIONS_PARAM``)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if name == OPTIONS_PARAM:  # typed, as JSON (analysis/store.py)
            value = {k: "***" if is_secret_key(f"{name}.{k}") else v for k, v in value.items()}
            flat[name] = redact(json.dumps(value, sort_keys=True, default=str))[:6000]
        elif isinstance(value, dict):
            flat.update(flatten_params(value, f"{name}."))
        elif is_secret_key(name):
            flat[name] = "***"
        else:
            flat[name] = redact(str(value))[:6000]
    return flat


# ---- store failures ----------------------------------------------------------------------------------------
@contextmanager
def store_errors(uri: str | None = None) -> Iterator[None]:
    """Any failure of the MLflow store inside the block (a read-only or deleted sqlite file, a full disk, a
    server that stopped answering) becomes one ``StoreFailure`` line naming the store. Redacted as a whole, not
    only the store's URI: MLflow's exception text quotes the URL it asked, password included, and the line is
    kept (the sweep's stop reason) and raised to callers of ``run_search`` as well as printed."""
    try:
        yield
    except store_failure_types() as exc:
        raise StoreFailure(redact(f"MLflow store {uri or mlflow.get_tracking_uri()} failed: {failure_text(exc)}")) \
            from None


# ---- the sweep -------------------------------------------------------------------------------------------
def code_version() -> str:
    """``git describe`` of the checkout the code runs from, else the installed package version."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return metadata.version("loopscale")
    except metadata.PackageNotFoundError:
        return "unknown"


def experiment_tags(spec: SweepSpec) -> dict[str, str]:
    """Tags that make the MLflow UI open the sweep as training runs (not its GenAI trace view) in the sweep's
    runs view (``ui.runs_view``), with a note."""
    return {**KIND_TAGS, VIEW_TAG: runs_view(),
            "mlflow.note.content": f"loopscale sweep {spec.name!r}: "
                                   f"{numbers.plural(len(spec.cells()), '(budget, r) cell')}, objective "
                                   f"{spec.objective}. One run per trial (name: stage, budget C, r, width d); the "
                                   "'analysis' run holds the fitted law, tables and plots."}


_READY_STORES: set[str] = set()  # sqlite stores this process has created or checked under the lock


def ready_store(uri: str) -> None:
    """Create (or check) a sqlite store's schema once per process, holding an exclusive lock on
    ``<database>.lock``. MLflow builds a schema in dozens of migrations, one transaction each: two drivers
    opening one fresh store at once both run them and the loser leaves the database half-migrated (mlflow#4123;
    seen with 8 at once in tests/test_concurrency.py), and so does a driver killed while it runs them. A
    half-migrated store is unreadable for good, so a new one is built under a temporary name and renamed into
    place when complete (a copy of an empty one: ``store_template``). An HTTP server migrates its own store
    once."""
    database = sqlite_path(uri)
    if database is None or uri in _READY_STORES:
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not database.exists() or not database.stat().st_size:  # an empty file is no store yet (store.py)
            for stale in database.parent.glob(f"{database.name}.*.new"):  # left by a creator that was killed
                stale.unlink()
            scratch = database.with_name(f"{database.name}.{os.getpid()}.new")
            write_empty_store(scratch)
            os.replace(scratch, database)
        MlflowClient(uri).search_experiments(max_results=1)  # an existing store: MLflow checks its schema
    _READY_STORES.add(uri)


def folder_tags(spec: SweepSpec) -> dict[str, str]:
    """The parent run's record of where the spec's paths lie, as its driver resolved them (``FOLDER_TAGS``,
    ``SPEC_FOLDER_TAG``): the logged ``spec.toml`` holds them as written, relative to folders it does not name.
    A path that carries a password (``s3://user:pw@host/...``) is not recorded: tags are stored as given, and a
    redacted path would lead nowhere (``spec_folders`` then falls back to the spec as written)."""
    tags = {**{tag: getattr(spec.placement, key) for key, tag in FOLDER_TAGS.items()}, SPEC_FOLDER_TAG: spec.folder}
    return {tag: value for tag, value in tags.items() if redact(str(value)) == str(value)}


def spec_folders(parent: Any) -> tuple[dict[str, str], str | None]:
    """What ``folder_tags`` recorded on ``parent``: the spec keys to set (storage, cache_dir) and the folder
    its relative architecture is resolved against; ({}, None) for a sweep logged before they were recorded."""
    tags = parent.data.tags
    return {key: tags[tag] for key, tag in FOLDER_TAGS.items() if tag in tags}, tags.get(SPEC_FOLDER_TAG)


def find_parent_run(tracking_uri: str, sweep: str) -> Any | None:
    """The parent run of sweep ``sweep`` if the store already has one; reads only (a missing sqlite file stays
    missing)."""
    database = sqlite_path(tracking_uri)
    if database is not None and not database.exists():
        return None
    ready_store(tracking_uri)  # the file may be a store another driver is creating right now
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(sweep)
    if experiment is None:
        return None
    runs = client.search_runs([experiment.experiment_id], runs_query("sweep"), max_results=1)
    return runs[0] if runs else None


def open_sweep(spec: SweepSpec, data_fingerprint: str) -> tuple[str, str]:
    """Create (or find, when resuming) the experiment and the sweep's parent run; returns their ids.

    Run on the driver before any trial starts, so no trial races to create the schema (mlflow#4123).
    """
    mlflow.set_tracking_uri(spec.placement.tracking_uri)  # the trial logger resolves the store through it
    # MLflow prints every ended run's URL to stdout, a password in the URI included, and fetches the run again
    # to do so (one more request per trial); the progress lines already say where the runs are.
    os.environ.setdefault(SUPPRESS_URLS, "true")
    ready_store(spec.placement.tracking_uri)
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    if experiment is None:
        location = None
        if sqlite_path(spec.placement.tracking_uri) is not None:
            location = (sqlite_path(spec.placement.tracking_uri).resolve().parent / "artifacts").as_uri()
        experiment_id = client.create_experiment(spec.name, artifact_location=location, tags=experiment_tags(spec))
    else:  # a sweep logged before a tag existed gets it now (its kind: the view MLflow opens it in)
        experiment_id = experiment.experiment_id
        for key, value in experiment_tags(spec).items():
            if key not in experiment.tags:
                client.set_experiment_tag(experiment_id, key, value)
    parent = find_parent_run(spec.placement.tracking_uri, spec.name)
    if parent is not None:  # where this driver found the sweep's folders: they may move between resumes
        client.log_batch(parent.info.run_id, tags=[RunTag(k, v) for k, v in folder_tags(spec).items()])
        client.update_run(parent.info.run_id, status="RUNNING")
        return experiment_id, parent.info.run_id
    tags = {KIND_TAG: "sweep", "sweep": spec.name, "objective": spec.objective, "spec_hash": spec.spec_hash,
            "code_version": code_version(), "data_fingerprint": data_fingerprint, **folder_tags(spec)}
    run = client.create_run(experiment_id, tags=tags, run_name=spec.name)
    summary = {"budgets": spec.grid.budgets, "recurrences": spec.grid.recurrences, "sampler": spec.sampling.sampler,
               "trials_per_cell": spec.sampling.trials_per_cell, "planned_trials": spec.planned_trials(),
               "seed": spec.sampling.seed}
    client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in summary.items()])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.toml"
        path.write_text(redact_text(spec.text))
        client.log_artifact(run.info.run_id, str(path))
    return experiment_id, run.info.run_id


def discard_stage_runs(tracking_uri: str, experiment_id: str, parent_run_id: str, stage: str) -> None:
    """Delete a stage's trial runs before the stage starts afresh: they belong to an attempt whose Tune state
    was never saved, so their trial keys would name different trials now."""
    client = MlflowClient(tracking_uri)
    query = runs_query("trial", **{PARENT_TAG: parent_run_id, "stage": stage})
    for run in list(iter_runs(client, experiment_id, query)):  # all read before the first delete
        discard_run(client, run.info.run_id, running=run.info.status == "RUNNING")


def discard_run(client: MlflowClient, run_id: str, *, running: bool = True) -> None:
    """Delete a trial run. One that ended without a result (``running``: a killed driver's, a failed attempt's)
    is marked KILLED first, so that no run of the store, deleted ones included, still claims to be RUNNING."""
    if running:
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.KILLED))
    client.delete_run(run_id)


def close_sweep(tracking_uri: str, parent_run_id: str, flops: dict[str, Any] | None = None) -> None:
    """Mark the sweep's run finished, with the FLOPs its trials spent (``flops``: total, per_cell, paper_grid)
    as ``flops_spent`` (and ``flops_spent_vs_paper_grid`` where comparable) in its numbers (``store.NUMBERS_TAG``:
    one value each, no chart) and ``flops_spent.json``."""
    client = MlflowClient(tracking_uri)
    if flops is not None:
        spent = {"flops_spent": flops["total"]}
        if flops.get("paper_grid"):
            spent["flops_spent_vs_paper_grid"] = flops["total"] / flops["paper_grid"]
        client.log_batch(parent_run_id, tags=[RunTag(k, v) for k, v in numbers_tags(spent).items()])
        client.log_dict(parent_run_id, flops, "flops_spent.json")
    client.set_terminated(parent_run_id, "FINISHED")


def record_calibration(tracking_uri: str, parent_run_id: str, choice: dict[str, Any]) -> None:
    """The calibration's choice (``analysis.calibration.RateChoice.to_dict``) on the sweep's run, where
    ``loopscale analyze`` reads it."""
    MlflowClient(tracking_uri).set_tag(parent_run_id, CALIBRATION_TAG, json.dumps(choice))


# ---- trials ----------------------------------------------------------------------------------------------
@dataclass
class _Open:
    """A started trial: its run is created on the first write (``run_id`` stays "" until then), dated from when
    the trial started. ``again``: when the trial started again (ms; 0: it has not); its run and curve are the
    earlier attempt's until this attempt streams a curve of its own (``TrialTracker.curve``). ``reached``: the
    last curve step the run holds (written or waiting to be); ``lost_steps``: steps trained again by resumed
    attempts."""

    tags: dict[str, str]
    params: dict[str, str]
    name: str
    run_id: str = ""
    curve: list[Metric] = field(default_factory=list)
    flushed_at: float = field(default_factory=time.monotonic)
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    again: int = 0
    reached: int = 0
    lost_steps: int = 0


class TrialTracker:
    """Driver-side logger of a stage's trials, keyed by ``trial_key``; picklable (Tune keeps it in its state).

    The store is resolved at ``open()`` from ``mlflow.get_tracking_uri()``, so a tracking URI with a password
    never lands in Tune's pickled experiment state.
    """

    def __init__(self, *, experiment_id: str, parent_run_id: str, sweep: str, tags: dict[str, str],
                 flush_s: float = 10.0):
        self.experiment_id, self.parent_run_id, self.sweep = experiment_id, parent_run_id, sweep
        self.tags, self.flush_s = tags, flush_s
        self._client: MlflowClient | None = None
        self._done: dict[str, tuple[str, dict[str, str]]] = {}  # key -> (run, params) of a FINISHED/FAILED run
        self._stale: dict[str, tuple[str, dict[str, str], int]] = {}  # key -> (run, params, start) left RUNNING
        self._open: dict[str, _Open] = {}
        self._carried: dict[str, str] = {}  # key -> the receipt a FINISHED run carries (``finish``)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_done": {}, "_stale": {}, "_open": {}, "_carried": {}}

    def open(self) -> None:
        """Read what the store already holds for this sweep (after a crash: finished and orphaned runs). The
        sweep's experiment and run are those of the store it opens, found by the sweep's name: Tune restores a
        stage with the tracker it pickled, whose ids are those of the store the sweep started in, and a sweep
        may resume into another store (``--tracking-uri``), whose runs it must join, not make twice."""
        uri = mlflow.get_tracking_uri()
        self._client = MlflowClient(uri)
        parent = find_parent_run(uri, self.sweep)
        if parent is not None:
            self.experiment_id, self.parent_run_id = parent.info.experiment_id, parent.info.run_id
        for run in self._trial_runs():
            key = run.data.tags.get("trial_key", "")
            if run.info.status == "RUNNING":
                self._stale[key] = (run.info.run_id, dict(run.data.params), run.info.start_time)
            else:
                self._done[key] = (run.info.run_id, dict(run.data.params))
                pieces = (run.data.tags.get(f"{RECEIPT_TAG}.{i}") for i in itertools.count())
                receipt = "".join(itertools.takewhile(lambda piece: piece is not None, pieces))
                if receipt and run.info.status == "FINISHED":
                    self._carried[key] = receipt

    def start(self, key: str, meta: dict[str, Any], trial: TrialConfig) -> None:
        """A trial starts (or restarts): its run is created with the first write, so a quick trial costs one
        run creation, one batch and one status update.

        A key that already has a finished run with the same params is not logged again (a trial that finished
        just before a crash, re-run because Tune had not saved it yet). With other params the old run is
        replaced: it no longer describes the trial the study knows under this key. A trial that starts again
        (a retry in this driver, or a RUNNING run with the same params left by a killed one) keeps its run and
        curve until it streams a new curve (module docstring).
        """
        params = flatten_params(trial.to_params())
        if key in self._done:
            run_id, logged = self._done[key]
            if logged == params:
                return
            self._client.delete_run(run_id)
            del self._done[key]
        now_ms = int(time.time() * 1000)
        old = self._open.get(key)
        if old is not None:
            old.again = now_ms
            return
        stale, stale_params, stale_start = self._stale.pop(key, ("", {}, 0))
        if stale and stale_params != params:  # a different trial now: its run describes nothing
            discard_run(self._client, stale)
            stale = ""
        tags = {**self.tags, KIND_TAG: "trial", PARENT_TAG: self.parent_run_id, "sweep": self.sweep,
                "stage": meta["stage"], "cell": meta["cell"], "r": str(trial.r),
                "budget": f"{trial.budget_flops:.6g}", "objective": trial.objective,
                "trial_key": key, "status": "running",
                **({"cell_widths": meta["cell_widths"]} if "cell_widths" in meta else {}), **view_tags(trial)}
        entry = _Open(tags=tags, params=params, name=run_name(meta["stage"], trial, meta.get("searched", "s")))
        if stale:  # its trial may have ended before the driver died: the run ends when the receipt comes
            entry.run_id, entry.started_ms, entry.again = stale, stale_start, now_ms
        self._open[key] = entry

    def curve(self, key: str, report: dict[str, Any]) -> None:
        """A progress report ``{"train_loss", "step", ...}``; written in batches every ``flush_s``.

        An attempt resumed from a checkpoint (its reports carry ``resumed_from_step``: objectives.train) goes on
        in the earlier attempt's run: it makes its saved reports again, and each step the run holds already is
        left out, so the curve has every step once; the steps the run held beyond the checkpoint were trained
        twice (``lost_steps``, reported as ``flops_lost``)."""
        entry = self._open.get(key)
        if entry is None or "step" not in report:
            return
        now_ms, step = int(time.time() * 1000), int(report["step"])
        if entry.again and "resumed_from_step" in report:
            entry.reached = max(entry.reached, self._last_step(entry.run_id))
            entry.lost_steps += max(0, entry.reached - int(report["resumed_from_step"]))
            entry.again = 0
        elif entry.again:  # the attempt trains from the first step: the earlier attempt's run describes nothing
            if entry.run_id:
                discard_run(self._client, entry.run_id)
            entry.run_id, entry.curve, entry.started_ms, entry.again, entry.reached = "", [], entry.again, 0, 0
        if step <= entry.reached:
            return
        entry.reached = step
        entry.curve += [Metric(k, float(report[k]), now_ms, step) for k in CURVE_KEYS if _finite(report.get(k))]
        if time.monotonic() - entry.flushed_at >= self.flush_s:
            self._flush(entry)

    def finish(self, key: str, result: dict[str, Any], receipt: str = "") -> None:
        """The trial's final result: metrics, status (``ok`` | ``diverged``) and reason; run FINISHED. A
        ``receipt`` (the disk refused it) goes into the run's ``RECEIPT_TAG`` tags, in pieces that fit the
        tag length limit."""
        entry = self._open.pop(key, None)
        if entry is None:
            return
        status = str(result.get("status", "ok"))
        reason = str(result.get("reason", "")) or ("" if status == "ok" else f"trial reported status {status}")
        now_ms, step = int(time.time() * 1000), int(result.get("steps", 0) or 0)
        # the curve's last report is the final step's train_loss: logged again here, that step would be in the
        # curve twice (an earlier attempt's run, finished from a receipt, holds its curve in the store only)
        held = max(entry.reached, self._last_step(entry.run_id) if entry.again else 0)
        entry.curve += [Metric(k, float(result[k]), now_ms, step) for k in CHARTED
                        if _finite(result.get(k)) and not (k in CURVE_KEYS and step <= held)]
        single = {k: v for k, v in result.items() if (k in METRIC_KEYS or is_branch_key(k) or is_module_key(k))
                  and k not in CHARTED and _finite(v)}
        tags = [RunTag("status", status), RunTag("reason", reason)]
        if result.get("resumes"):
            batch = int(result["tokens"]) // step
            single.update(resumes=result["resumes"],
                          flops_lost=float(result["flops_per_token"]) * entry.lost_steps * batch)
            tags.append(RunTag(RESUMED_TAG, str(int(result["resumed_from_step"]))))
        tags += [RunTag(k, v) for k, v in numbers_tags(single).items()]
        tags += [RunTag(k, v) for k, v in loss_tag(result).items()]
        if result.get("node"):
            tags.append(RunTag("node", str(result["node"])))
        tags += [RunTag(f"{RECEIPT_TAG}.{i // MAX_TAG_VAL_LENGTH}", receipt[i:i + MAX_TAG_VAL_LENGTH])
                 for i in range(0, len(receipt), MAX_TAG_VAL_LENGTH)]
        self._flush(entry, tags=tags)
        self._client.set_terminated(entry.run_id, RunStatus.to_string(RunStatus.FINISHED))
        self._done[key] = (entry.run_id, entry.params)

    def fail(self, key: str, reason: str) -> None:
        """The trial raised on every attempt: status ``failed`` with the error's last line; run FAILED."""
        entry = self._open.pop(key, None)
        if entry is None:
            return
        self._flush(entry, tags=[RunTag("status", "failed"), RunTag("reason", reason or "trial raised")])
        self._client.set_terminated(entry.run_id, RunStatus.to_string(RunStatus.FAILED))
        self._done[key] = (entry.run_id, entry.params)

    def close(self, ended: Collection[str] = ()) -> None:
        """End of a stage: runs still RUNNING belong to no trial any more (suggested, then lost in a crash),
        except those of the trial keys ``ended`` (trials Tune ended with a result whose run did not end: a
        killed driver's, their result logged into them afterwards by ``start`` and ``finish``)."""
        self._open.clear()
        for run in self._trial_runs():
            if run.info.status == "RUNNING" and run.data.tags.get("trial_key") not in ended:
                discard_run(self._client, run.info.run_id)
        self._stale.clear()

    def logged(self) -> set[str]:
        """Trial keys whose run has ended, FINISHED or FAILED (after ``open``, with what this tracker logged)."""
        return set(self._done)

    def keep_model(self, key: str, path: str) -> None:
        """Upload a finished trial's model file ``path`` as its run's artifact (replacing one uploaded before
        under the same name) and tag the run ``KEPT_TAG`` with the artifact's path and ``KEPT_DIGEST_TAG`` with
        the file's sha256 (search/tune/keep.py)."""
        run_id = self._done[key][0]
        self._client.log_artifact(run_id, path)
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        self._client.log_batch(run_id, tags=[RunTag(KEPT_DIGEST_TAG, digest), RunTag(KEPT_TAG, Path(path).name)])

    def carried_receipts(self, prefix: str = "") -> list[str]:
        """The receipts the FINISHED runs read by ``open`` carry (``finish``), of trial keys starting with
        ``prefix`` (a stage's)."""
        return [text for key, text in self._carried.items() if key.startswith(prefix)]

    def _flush(self, entry: _Open, tags: list[RunTag] = ()) -> None:
        params = []
        if not entry.run_id:
            entry.run_id = self._client.create_run(self.experiment_id, start_time=entry.started_ms, tags=entry.tags,
                                                   run_name=entry.name).info.run_id
            params = [Param(k, v) for k, v in entry.params.items()]
        self._client.log_batch(entry.run_id, metrics=entry.curve, params=params, tags=list(tags))
        entry.curve, entry.flushed_at = [], time.monotonic()

    def _last_step(self, run_id: str) -> int:
        """The last step of the curve a run holds in the store (0 for a run not created yet)."""
        if not run_id:
            return 0
        return max((m.step for m in self._client.get_metric_history(run_id, CURVE_KEYS[0])), default=0)

    def _trial_runs(self) -> list[Any]:
        query = runs_query("trial", **{PARENT_TAG: self.parent_run_id})
        return list(iter_runs(self._client, self.experiment_id, query))


def run_name(stage: str, trial: TrialConfig, searched: str = "s") -> str:
    """What the UI's runs table shows first: stage, budget, r and width, e.g. ``search C=1e+12 r=4 d=64``, and
    the value a calibration trial tries (``searched``, "recipe.<key>"): ``calibrate C=5e+09 r=1 d=32 base_lr=0.02``."""
    name = f"{stage} C={trial.budget_flops:.3g} r={trial.r} d={trial.model_config.width}"
    if searched.startswith("recipe."):
        key = searched.removeprefix("recipe.")
        name += f" {key}={trial.recipe[key]:.3g}"
    return name


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

