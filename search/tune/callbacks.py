"""The driver's Tune callbacks: ``TrackingCallback`` logs every trial to MLflow and watches for reasons to stop
(a failing store or disk, a signal), which it hands to Tune as its graceful stop; ``ProgressCallback`` prints
one line per finished trial."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

from ray.tune import Callback

from loopscale.objectives import TrialConfig

from ..preflight import low_space
from ..progress import Progress
from ..stopping import StoreFailure
from ..tracking import TrialTracker, store_errors
from ..tune_state import StateKeeper
from . import live
from .failures import error_reason, is_disk_error
from .trial import CHECKPOINT_KEY, INFRA_KEY, UNSAVED_KEY, ask_checkpoint, drop_checkpoint

# How long a signalled driver waits for its running trials' checkpoints before it stops Tune: within the 30 s a
# SLURM job has between SIGTERM and SIGKILL by default (KillWait)
STOP_CHECKPOINT_S = 25.0


class TrackingCallback(Callback):
    """MLflow from the driver, idempotent by trial key (the stock MLflowLoggerCallback duplicates runs after
    a restore). It also watches for reasons to stop (``live.STOP``): a store write that fails, a trial
    whose receipt could not be written, a disk that fills up, a signal. It never raises into Tune (which would
    record a store failure as the failure of every trial it touched): it asks Tune for a graceful stop
    instead, and the trials it could not log are logged from their receipts on --resume. After a signal, and
    where trials checkpoint (``checkpoints``), it first asks each running training trial for a checkpoint
    and stops Tune once each has reported one, or after ``STOP_CHECKPOINT_S``."""

    keeper: StateKeeper | None = None  # (class defaults: a callback pickled before they existed restores too)
    store_failed = False
    checkpoints = False
    asked: set[str] | None = None  # trials asked for a checkpoint before the stop that have not answered yet
    asked_until = 0.0

    def __init__(self, tracker: TrialTracker, disks: dict[str, str] | None = None,
                 keeper: StateKeeper | None = None, checkpoints: bool = False):
        self.tracker = tracker
        self.disks = disks or {}
        self.keeper = keeper
        self.checkpoints = checkpoints

    def setup(self, **info: Any) -> None:
        self.store_failed = False  # (a resumed stage: the store is tried afresh)
        self.asked = None
        self._safely(self.tracker.open)

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        full = low_space(self.disks)  # one statvfs per disk: microseconds, and Tune writes its state every step
        if full:
            live.STOP.fail(full)
        if live.STOP.requested and self._checkpointed(trials):
            _stop_tune()
        if self.keeper is not None:  # a stat of three files, and a copy when Tune wrote a new snapshot
            self.keeper.refresh()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        meta = trial.config["meta"]
        self._safely(self.tracker.start, meta["trial_key"], meta, TrialConfig.from_params(trial.config["trial"]))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if CHECKPOINT_KEY in result and self.asked:
            self.asked.discard(trial.trial_id)
        if "status" not in result:  # a progress report, not the final result
            self._safely(self.tracker.curve, trial.config["meta"]["trial_key"], result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        # (a receipt the disk refused goes onto the run, for --resume to write it back)
        self._safely(self.tracker.finish, trial.config["meta"]["trial_key"], result, result.get(UNSAVED_KEY, ""))
        if not self.store_failed:  # logged: the trial's checkpoint resumes nothing any more
            drop_checkpoint(trial)
        if result.get(INFRA_KEY):
            live.STOP.fail(result[INFRA_KEY])

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        reason = error_reason(trial)
        if is_disk_error(reason):  # not the trial's failure: it runs again on --resume
            live.STOP.fail(f"trial {trial.config['meta']['trial_key']} failed on a disk error: {reason}")
            return
        self._safely(self.tracker.fail, trial.config["meta"]["trial_key"], reason)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if not live.STOP.requested:  # a stopped stage keeps its runs: their trials resume
            ended = {t.config["meta"]["trial_key"] for t in trials if "status" in (t.last_result or {})}
            self._safely(self.tracker.close, ended)

    def _checkpointed(self, trials: list) -> bool:
        """Whether Tune may stop: no signal, no checkpoints, or every running training trial asked for a
        checkpoint has reported one (or ended), or ``STOP_CHECKPOINT_S`` passed since they were asked."""
        if live.STOP.signum is None or not self.checkpoints:
            return True
        running = {t.trial_id for t in trials if t.status == "RUNNING" and t.config["trial"]["objective"] == "train"}
        if self.asked is None:
            self.asked, self.asked_until = set(running), time.monotonic() + STOP_CHECKPOINT_S
            if not all(ask_checkpoint(trial_id) for trial_id in running):
                print("loopscale: Ray's store did not take the checkpoint request (the signal ended Ray too?): "
                      "stopping without checkpoints", file=sys.stderr, flush=True)
                self.asked = set()
                return True
            if running:
                print(f"loopscale: {len(running)} running trials take a checkpoint before the sweep stops (at most "
                      f"{STOP_CHECKPOINT_S:g} s)", file=sys.stderr, flush=True)
        return not (self.asked & running) or time.monotonic() >= self.asked_until

    def _safely(self, call: Any, *args: Any) -> None:
        """One tracker call; the first store failure stops the sweep, and the calls after it are skipped. (After
        a disk failure the store still takes the trials that finish while Tune stops: their receipts may be
        the ones the disk refused.)"""
        if self.store_failed:
            return
        try:
            with store_errors():
                call(*args)
        except StoreFailure as exc:
            self.store_failed = True
            live.STOP.fail(str(exc))
            _stop_tune()


def _stop_tune() -> None:
    """Ask the running Tune for its graceful stop: it saves its experiment state, leaves running trials to be
    resumed, and returns from ``fit``. Tune listens for it on SIGUSR1 while it runs (``tune.run``)."""
    if live.STOP.in_tune and signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN, None):
        signal.raise_signal(signal.SIGUSR1)


class ProgressCallback(Callback):
    """One line per finished trial on stdout; trials restored as finished are counted silently."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self._counted_restored = False

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        # Only the first step: a resumed Tune holds the earlier session's trials from its start, and later
        # ones arrive through on_trial_complete / on_trial_error. (Scanning every trial at every step would cost
        # O(trials) per step.)
        if self._counted_restored:
            return
        self._counted_restored = True
        for trial in trials:
            if trial.status in ("TERMINATED", "ERROR"):
                self.progress.restore(trial.config["meta"]["cell"],
                                      trial.last_result if trial.status == "TERMINATED" else None, searched(trial))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._report(trial, trial.last_result)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._report(trial, None)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._finish_cells()
        print(self.progress.table(), flush=True)

    def _report(self, trial: Any, result: dict | None) -> None:
        self._finish_cells()
        print(self.progress.record(trial.config["meta"]["cell"], result, searched(trial)), flush=True)

    def _finish_cells(self) -> None:
        """Cells this stage's searcher takes no more trials in leave the plan (the law sampler stops cells early)."""
        cells = live.SEARCHERS.get(self.progress.stage)
        if cells is not None:
            self.progress.finish(cells.finished_cells())


def searched(trial: Any) -> float:
    """The value the trial's study chose (its width s, or the calibrated rate)."""
    value = trial.config["trial"]
    for part in trial.config["meta"]["searched"].split("."):
        value = value[part]
    return float(value)

