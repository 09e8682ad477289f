"""One stage of a sweep (``calibrate``, ``search`` or ``validate``): one Tune run over all its cells, started afresh or
restored after a crash, stopped cleanly when asked (``live.STOP``), then reconciled with MLflow so that every
planned trial has its ended run."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import ray
from ray import tune
from ray.tune.result import EXPR_ERROR_FILE

from loopscale.objectives import METRIC_KEYS, TrialConfig

from ..progress import Progress
from ..space import Cell
from ..spec import SweepSpec
from ..stopping import StoreFailure, SweepInterrupted, signal_name
from ..tracking import TrialTracker, discard_stage_runs, store_errors
from ..tune_state import StateKeeper
from . import live
from .callbacks import ProgressCallback, TrackingCallback
from .failures import failure_reason, is_disk_error
from .keep import keep_models
from .receipts import Receipt, restore_receipts
from .searcher import CellSearcher
from .metric import METRIC, finite
from .studies import make_studies, study_journal
from .trial import drop_checkpoint, log_unsaved, run_trial

SNAPSHOT_ENV = "TUNE_GLOBAL_CHECKPOINT_S"  # seconds between Tune's experiment-state snapshots


@dataclass(frozen=True)
class SweepContext:
    """What every stage of one sweep shares."""

    spec: SweepSpec
    experiment_id: str
    parent: str  # the sweep's MLflow run
    tags: dict[str, str]
    verbose: bool
    snapshot_period: str | None  # the user's own SNAPSHOT_ENV, if set
    disks: dict[str, str]  # the local folders the sweep writes to (the free-space checks)
    resume: str = ""  # the command that resumes it, where not ``resume_command``'s (``loopscale validate``)
    rounds: bool = False  # whether a stage started afresh proposes in rounds (driver.SweepState.rounds)


@dataclass
class StageOutcome:
    stage: str
    results: list[dict[str, Any]] = field(default_factory=list)  # meta, final metrics and "trial" config
    studies: dict[str, optuna.Study] = field(default_factory=dict)

    def best(self) -> dict[str, Any] | None:
        ok = [r for r in self.results if r.get("status") == "ok" and finite(r.get(METRIC))]
        return min(ok, key=lambda r: r[METRIC]) if ok else None


def resume_command(spec: SweepSpec) -> str:
    return f"loopscale search {spec.source or spec.name} --resume"


def run_stage(sweep: SweepContext, name: str, recipe: dict[str, Any] | None,
              cells: list[Cell] | None = None, bases: dict[str, TrialConfig] | None = None) -> StageOutcome:
    """Run (or resume) the stage ``name`` with the recipe ``recipe`` over ``cells`` (default: the spec's cells of
    that stage; ``bases``: each cell's own trial instead, ``studies.make_studies``); raises ``SweepInterrupted`` or
    ``StoreFailure`` after a clean stop, RuntimeError when a planned trial has no ended run."""
    # Tune snapshots its experiment state every 2 s; a trial that finished after the last snapshot is started
    # again on resume and reports its receipt (run_trial) without running twice. (A snapshot at every training
    # report writes many times the bytes and costs the driver CPU per trial.)
    os.environ[SNAPSHOT_ENV] = sweep.snapshot_period or "2"
    stage = Stage(sweep, name, recipe, cells, bases)
    tuner = stage.restored_tuner()
    if tuner is None:
        tuner = stage.new_tuner()
    grid = _fit(tuner)
    try:  # trials that ended on a full disk while Tune stopped, their reports dropped
        log_unsaved(stage.tracker(), stage.receipts)
    except StoreFailure as exc:
        live.STOP.fail(str(exc))
    planned = stage.planned_trials(grid)
    stage.raise_if_stopped(grid, planned)
    return stage.outcome(grid, planned)


class Stage:
    """The stage's Tune run: where it keeps its state, its trainable, its tuner, its outcome."""

    def __init__(self, sweep: SweepContext, name: str, recipe: dict[str, Any] | None,
                 cells: list[Cell] | None = None, bases: dict[str, TrialConfig] | None = None):
        self.sweep, self.spec, self.name, self.recipe, self.bases = sweep, sweep.spec, name, recipe, bases
        self.cells = self.spec.cells(name) if cells is None else cells
        self.resume = sweep.resume or resume_command(self.spec)
        self.path = f"{self.spec.placement.storage.rstrip('/')}/{self.spec.name}/{name}"
        self.receipts = f"{self.path}/receipts"
        # where the stage's trained trials save their models until it ends (search/tune/keep.py)
        keeps = self.spec.objective == "train" and self.spec.placement.keep_models != "none"
        self.models = f"{self.path}/models" if keeps else ""
        self.trainable = self._trainable()
        self.keeper = self._keeper()

    def tracker(self) -> TrialTracker:
        """A fresh tracker of the sweep's MLflow runs."""
        sweep = self.sweep
        return TrialTracker(experiment_id=sweep.experiment_id, parent_run_id=sweep.parent, sweep=self.spec.name,
                            tags=sweep.tags)

    def _trainable(self) -> Any:
        spec, stage, path = self.spec, self.name, self.path
        workers = spec.workers_of(stage)
        # a data-parallel trial's own process only waits for its Ray Train workers, which hold the CPUs and GPUs
        # (Tune needs some resource in a trial's request: a MiB of memory)
        return tune.with_resources(
            tune.with_parameters(run_trial, receipts=self.receipts, workers=workers,
                                 worker_resources=spec.resources(stage), data_parallel_dir=f"{path}/data-parallel",
                                 checkpoint_s=spec.placement.checkpoint_s, models=self.models),
            spec.resources(stage) if workers == 1 else {"cpu": 0, "memory": 1 << 20})

    def _keeper(self) -> StateKeeper | None:
        """The keeper of Tune's state on local storage, which recovers a state cut short first."""
        path = self.path
        keeper = StateKeeper(path) if "://" not in path else None
        if keeper is not None and keeper.damaged():
            copy = keeper.recover()
            print(f"Tune's state in {path} was cut short (a disk that filled up while Tune wrote it); resuming from "
                  f"its last readable copy ({copy.name}): trials finished since then report their receipts",
                  flush=True)
        return keeper

    def restored_tuner(self) -> tune.Tuner | None:
        """The stage's Tuner restored from its state, or None where it has none to restore (or one cut short
        before any trial ended)."""
        spec, stage, path, receipts, keeper = self.spec, self.name, self.path, self.receipts, self.keeper
        if not tune.Tuner.can_restore(path):
            return None
        # Trials that errored on a disk or store failure have no ended run: they run again. Trials that failed
        # by themselves (their FAILED run is in MLflow) stay failed.
        with store_errors(spec.placement.tracking_uri):
            logged = self.tracker()
            logged.open()
        restored = restore_receipts(logged.carried_receipts(f"{stage}/"), receipts)
        if restored:
            print(f"{restored} {stage} trials finished while the disk was full: their receipts are restored from "
                  "their MLflow runs, so they do not run again", flush=True)
        try:
            errored = [t for t in tune.ExperimentAnalysis(path).trials
                       if t.status == "ERROR" and t.config["meta"]["trial_key"] not in logged.logged()]
            return tune.Tuner.restore(path, trainable=self.trainable, resume_unfinished=True,
                                      resume_errored=bool(errored))
        except (ValueError, EOFError, pickle.UnpicklingError, OSError) as exc:
            # cut short before any trial of the stage ended (a disk full within its first seconds): nothing to keep
            ended = any(k.startswith(f"{stage}/") for k in logged.logged()) or any(Path(receipts).glob("*.json"))
            if keeper is None or ended:
                raise StoreFailure(f"Tune's state in {path} is damaged ({type(exc).__name__}: {exc}), as a disk "
                                   "that filled up while Tune wrote it leaves it; the finished trials are in MLflow "
                                   f"and in {receipts}, but this stage cannot be resumed") from None
            keeper.set_aside()
            print(f"Tune's state in {path} was cut short before any {stage} trial ended (a disk that filled up "
                  "while Tune wrote it); the stage starts afresh", flush=True)
            return None

    def new_tuner(self) -> tune.Tuner:
        """A fresh Tuner over the stage's cells, after dropping the runs of an attempt killed before Tune saved."""
        spec, stage, cells, sweep = self.spec, self.name, self.cells, self.sweep
        with store_errors(spec.placement.tracking_uri):
            discard_stage_runs(spec.placement.tracking_uri, sweep.experiment_id, sweep.parent, stage)
        searcher = CellSearcher(make_studies(spec, stage, self.recipe, cells, journal=study_journal(spec),
                                             bases=self.bases), rounds=sweep.rounds)
        progress = Progress(stage, {c.key: c.n_trials for c in cells},
                            spec.training.calibrate.param if stage == "calibrate" else "s")
        return tune.Tuner(
            self.trainable,
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=sum(c.n_trials for c in cells),
                                        max_concurrent_trials=spec.concurrency(
                                            stage, ray.cluster_resources().get("CPU", 1)),
                                        reuse_actors=True,
                                        trial_dirname_creator=_trial_dirname),
            # every snapshot reaches the storage (Tune's default: every 5 minutes), where the keeper copies it
            run_config=tune.RunConfig(name=stage, storage_path=f"{spec.placement.storage.rstrip('/')}/{spec.name}",
                                      sync_config=tune.SyncConfig(sync_period=float(os.environ[SNAPSHOT_ENV])),
                                      callbacks=[TrackingCallback(self.tracker(), sweep.disks, self.keeper,
                                                                  checkpoints=self._checkpoints()),
                                                 ProgressCallback(progress)],
                                      failure_config=tune.FailureConfig(max_failures=spec.placement.retries),
                                      # a trial's latest checkpoint only: the one it resumes from
                                      checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                                      verbose=1 if sweep.verbose else 0),
        )

    def _checkpoints(self) -> bool:
        """Whether the stage's trials take checkpoints (a data-parallel trial's need a shared file system)."""
        return self.spec.placement.checkpoint_s > 0 and (self.spec.workers_of(self.name) == 1 or "://" not in self.path)

    def planned_trials(self, grid: Any) -> set[str]:
        """The trial keys the stage must have ended runs for: every cell's cap, except where the law sampler closes
        a cell early once its optimum is located; then the trials it did propose (all of which Tune started)."""
        if self.spec.sampling.sampler == "law" and self.name == "search":
            return {result.config["meta"]["trial_key"] for result in grid if result.config}
        return {f"{self.name}/{c.key}/{n}" for c in self.cells for n in range(1, c.n_trials + 1)}

    def raise_if_stopped(self, grid: Any, planned: set[str]) -> None:
        """``SweepInterrupted`` after a signal, ``StoreFailure`` after a failing store or disk."""
        spec, stop = self.spec, live.STOP
        if stop.signum is not None:
            finished = sum(1 for result in grid if "status" in (result.metrics or {}))
            raise SweepInterrupted(stop.signum, f"interrupted by {signal_name(stop.signum)}: {finished} of "
                                                f"{len(planned)} {self.name} trials finished; resume with: "
                                                f"{self.resume} (and the same options)")
        if stop.failure:
            raise StoreFailure(f"{stop.failure}; the sweep stopped and keeps every finished trial: fix it, then run "
                               f"{self.resume}")

    def outcome(self, grid: Any, planned: set[str]) -> StageOutcome:
        """Every trial's result, once MLflow holds an ended run for each planned trial (logged now from its
        receipt where it has none)."""
        spec, stage = self.spec, self.name
        outcome = StageOutcome(stage, studies=_saved_studies(self.path))
        with store_errors(spec.placement.tracking_uri):
            reconcile = self.tracker()
            reconcile.open()
            for result in grid:
                _log_if_missing(reconcile, result, self.receipts)
            logged = reconcile.logged()
        for result in grid:  # logged now or before (failed trials too): their checkpoints resume nothing
            if result.config["meta"]["trial_key"] in logged:
                drop_checkpoint(result)
        missing = sorted(planned - logged)
        if missing:
            raise RuntimeError(f"{len(missing)} of {len(planned)} planned {stage} trials have no ended run in MLflow "
                               f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); run "
                               f"{self.resume}")
        for result in grid:
            metrics = {k: v for k, v in (result.metrics or {}).items() if k in METRIC_KEYS}
            if result.error is not None:
                metrics = {"status": "failed", "reason": failure_reason(_error_log(result))}
            elif "status" not in metrics:
                metrics = {"status": "failed", "reason": "no final result"}
            outcome.results.append({**result.config["meta"], **metrics, "trial": result.config["trial"]})
        if self.models:
            with store_errors(spec.placement.tracking_uri):
                keep_models(reconcile, outcome.results, self.models, spec.placement.keep_models)
        return outcome


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


def _fit(tuner: tune.Tuner) -> Any:
    """``tuner.fit()`` with stop requests handed to Tune (``callbacks._stop_tune``) rather than raised inside it; Tune's
    own SIGINT handler is off, so that SIGINT and SIGTERM mean the same to every stage."""
    previous = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    live.STOP.in_tune = True
    try:
        return tuner.fit()
    finally:
        live.STOP.in_tune = False
        if previous is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = previous


def _log_if_missing(tracker: TrialTracker, result: Any, receipts: str) -> None:
    """Reconcile MLflow with Tune after a stage: a trial that ended in Tune but has no ended run (its logging
    failed, or the driver stopped before it) is logged now, from its receipt when it has one."""
    meta, trial = result.config["meta"], result.config["trial"]
    key = meta["trial_key"]
    if key in tracker.logged():
        return
    if result.error is not None:
        reason = failure_reason(_error_log(result))
        if not is_disk_error(reason):  # a disk error is no outcome: the trial runs again on --resume
            tracker.start(key, meta, TrialConfig.from_params(trial))
            tracker.fail(key, reason)
        return
    final = Receipt(receipts, key, trial).load() or result.metrics or {}
    if "status" in final:
        tracker.start(key, meta, TrialConfig.from_params(trial))
        tracker.finish(key, final)


def _error_log(result: Any) -> str:
    """Tune's error log of a failed trial (local or object storage), or its last error when that is gone."""
    try:
        with result.filesystem.open_input_stream(f"{result.path}/{EXPR_ERROR_FILE}") as f:
            return f.read().decode()
    except (OSError, AttributeError):
        return f"Failure # 1\n{result.error}"


def _saved_studies(path: str) -> dict[str, optuna.Study]:
    """The cells' studies as Tune last saved them (a local experiment directory; {} on remote storage)."""
    searcher = CellSearcher([])
    try:
        searcher.restore_from_dir(path)
    except RuntimeError:
        return {}
    return searcher.studies()

