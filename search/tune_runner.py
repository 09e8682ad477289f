"""Ray Tune + Optuna: the one module of loopscale that imports them (their APIs churn).

A stage (``calibrate`` or ``search``) is one Tune run over ALL its cells side by side. One Tune searcher,
``CellSearcher``, holds a seeded Optuna study per cell (``CellStudy``, ask/tell) and hands each free slot to the
open cell with the fewest running, then fewest started trials, so no cell waits for another and every cell's
study sees its earlier results. Each study proposes through a module-level define-by-run space (``width_space``
or ``lr_space`` bound with ``functools.partial``), which pickles by reference, so ``Tuner.restore`` brings back
every study, its sampler RNG and its pending trials after a crash. (Ray's ``OptunaSearch`` is not used: drawing
widths without replacement needs the study's ask/tell, and the search-quality benchmark drives the very same
``CellStudy`` without Ray.) The studies live in Optuna's own storage too: a journal file in the sweep's storage
(``<storage>/<sweep>/optuna.journal``), one study per cell named ``<sweep>/<stage>/<cell>``, so
``optuna.load_study`` (and Optuna's tools) read them while the sweep runs and after it, resume included: a
restored searcher first writes its studies' trials back into the journal, replacing what an attempt killed
after Tune's last snapshot had added there, so the journal holds exactly the trials of the sweep.

The trial (``run_trial``) calls ``objectives.simulate`` or ``objectives.train``; the driver logs to MLflow
through ``TrackingCallback`` and prints progress through ``ProgressCallback``. A training trial with
``[resources] workers = k > 1`` runs data-parallel through Ray Train inside its Tune trial
(``train_data_parallel``): a ``TorchTrainer`` of k workers (gloo on CPUs, NCCL on GPUs), whose progress
reaches Tune through ``TuneReportCallback``, exactly as a one-worker trial's does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import logging
import math
import os
import pickle
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pyarrow.fs

# Read when Ray is imported: without it, the driver's Ray core installs a C++ crash handler that turns a SIGTERM
# (while ray.init connects, before the sweep takes the signal back) into a stack dump and an abort (_start_ray).
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

import ray
from ray import tune
from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get, _internal_kv_list, _internal_kv_put
from ray.tune import Callback
from ray.tune.result import EXPR_ERROR_FILE
from ray.tune.search import Searcher

from loopscale import objectives
from loopscale.analysis.flops import flops_text, paper_grid_reference
from loopscale.analysis.store import redact
from loopscale.model import heads_to_s
from loopscale.objectives import METRIC_KEYS, TrialConfig
from loopscale.objectives.trial import recorded_branches

from . import space
from .law_sampler import CellGeometry, LawSampler, LawSurrogate
from .preflight import check_free_space, check_ray_address, low_space, ray_address
from .progress import Progress
from .spec import Cell, SweepSpec
from .stopping import (StopRequest, StoreFailure, SweepInterrupted, raise_if_interrupted, signal_name,
                       signals_noted)
from .sweep_lock import SweepLock
from .tune_state import StateKeeper
from .tracking import (TrialTracker, close_sweep, code_version, discard_stage_runs, find_parent_run, open_sweep,
                       store_errors)

METRIC = "val_loss"
SNAPSHOT_ENV = "TUNE_GLOBAL_CHECKPOINT_S"  # seconds between Tune's experiment-state snapshots
N_STARTUP = 3  # model-based proposals start after the first guess and two random widths (see the benchmark)
STATE_FILE = "sweep.json"
INFRA_KEY = "infra_error"  # a trial's result that could not be kept on disk (its receipt): the sweep stops
# ... and that receipt itself, for the driver to keep on the trial's MLflow run (``Receipt.carried``)
UNSAVED_KEY = "unsaved_receipt"
KV_NAMESPACE = "loopscale"  # of the Ray cluster's key-value store, where such receipts also wait (hold_unsaved)
# Errors of the disk, not of the trial: retried on --resume instead of recorded as the trial's failure.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
# What the driver is asked to stop for (a signal, a failing store or disk). Module level: Tune restores the
# tracking callback from its pickled state on --resume, so the callback reaches it by name, not by reference.
STOP = StopRequest()
# The searcher at work in this driver, by stage: the progress lines ask it which cells are finished (Tune
# restores the searcher and the progress callback from separate pickles, so they cannot hold each other).
LIVE_SEARCHERS: dict[str, "CellSearcher"] = {}


# ---- search spaces (module level: the searcher pickles them by reference) -------------------------------
def width_space(trial: Any, *, low: int, high: int, head_dim: int, width_unit: int) -> dict[str, float]:
    """Width as a whole number of heads on a log scale (the optimum moves geometrically with the budget);
    s = heads * head_dim / width_unit."""
    heads = trial.suggest_int("heads", low, high, log=True)
    return {"s": heads_to_s(heads, width_unit, head_dim)}


def lr_space(trial: Any, *, low: float, high: float) -> None:
    """The base learning rate of the recipe, log-uniform in [low, high]."""
    trial.suggest_float("lr", low, high, log=True)


def make_sampler(kind: str, seed: int) -> optuna.samplers.BaseSampler:
    """The seeded Optuna sampler of one cell. GP and TPE start modelling after ``N_STARTUP`` trials (TPE's
    default of 10 would leave a 5-trial study random). A grid is enqueued up front (``CellStudy``), so its
    sampler only ever replays the queue; Optuna's GridSampler is not used as it stops the study from inside
    ``tell``, which ask-and-tell does not allow. The law sampler (``law_sampler``) is shared across a stage's
    cells and made by ``make_studies``; a learning rate (the calibration stage) has no law, so "law" means GP
    there."""
    if kind in ("gp", "law"):
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=N_STARTUP)
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=N_STARTUP)
    return optuna.samplers.RandomSampler(seed=seed)


def log_grid(low: float, high: float, n: int) -> list[float]:
    """n points evenly spaced in log between low and high (the grid sampler's learning rates)."""
    if n == 1:
        return [math.sqrt(low * high)]
    inner = [math.exp(math.log(low) + i * (math.log(high) - math.log(low)) / (n - 1)) for i in range(1, n - 1)]
    return [low, *inner, high]  # the ends exactly: exp(log(x)) may land a hair outside [low, high]


LR_STEP = 2.0  # the calibration's first bracket: the recipe's rate, half of it, twice it (the usual lr sweep step)


def lr_bracket(current: Any, low: float, high: float) -> list[float]:
    """The first rates a model-based calibration tries: the recipe's rate (else the log-middle of [low, high]),
    then ``LR_STEP`` below and above it, inside [low, high]. A study started from the rate alone and random
    draws may try only one side of it (the demo's tried 0.04 and then 0.085, 0.107, 0.13, all above, while
    0.02 trained 0.11 nats better), so the optimum is bracketed before the model takes over."""
    start = float(current) if _finite(current) and low <= current <= high else math.sqrt(low * high)
    return [start, *(x for x in (start / LR_STEP, start * LR_STEP) if low <= x <= high)]


def cell_seed(seed: int, stage: str, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}|{stage}|{key}".encode()).digest()[:4], "little")


# ---- studies -------------------------------------------------------------------------------------------
JOURNAL_FILE = "optuna.journal"


def study_journal(spec: SweepSpec) -> str | None:
    """The sweep's Optuna journal file; None on object storage (Optuna's journal file needs a local path)."""
    return None if "://" in spec.storage else f"{spec.storage.rstrip('/')}/{spec.name}/{JOURNAL_FILE}"


@functools.cache  # one per file and process: each storage replays the whole journal
def study_storage(journal: str) -> optuna.storages.JournalStorage:
    """Optuna's storage of a journal file: ``optuna.load_study(study_name=..., storage=study_storage(path))``.
    A last line cut short (a disk that filled up while Optuna appended it: Optuna then cannot read the file) is
    dropped first: that write never completed."""
    with contextlib.suppress(FileNotFoundError), open(journal, "rb+") as f:
        text = f.read()
        if text and not text.endswith(b"\n"):
            f.truncate(text.rfind(b"\n") + 1)
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))


def _for_new_study(sampler: optuna.samplers.BaseSampler) -> optuna.samplers.BaseSampler:
    """The sampler, its RNG kept, with its search-space caches emptied: GP and TPE cache the search space of
    the one study they served (by study id), and a resumed cell's study is a new one in the journal. The cache
    is recomputed from the trials, so emptying it changes no proposal."""
    for name, value in vars(sampler).items():
        if isinstance(value, optuna.search_space.IntersectionSearchSpace):
            setattr(sampler, name, type(value)(include_pruned=getattr(value, "_include_pruned", False)))
    return sampler


def study_name(sweep: str, stage: str, cell_key: str) -> str:
    """The stable name of a cell's study, e.g. ``demo/search/C=1e+12,r=4``."""
    return f"{sweep}/{stage}/{cell_key}"


class CellStudy:
    """The seeded Optuna study of one cell (width for a search cell, learning rate for the calibration cell).

    ``ask`` proposes the next trial config, ``tell`` returns its loss (None: diverged or failed, told as FAIL so
    the sampler ignores it instead of fitting a made-up loss). Widths are drawn without replacement: a width the
    cell already tried or is trying would buy no new information, so a repeated proposal is told as FAIL and
    replaced by the untried width nearest to it (in log width).

    With a ``journal`` the study is kept in that Optuna journal under ``study_name`` once it is first used;
    pickled, it is its sampler and trials (Tune's snapshot of the searcher), unpickled an in-memory study until
    first used again, when those trials replace the journal's copy.
    """

    def __init__(self, spec: SweepSpec, cell: Cell, base: TrialConfig, surrogate: LawSurrogate | None = None,
                 journal: str | None = None):
        self.stage, self.key, self.n_trials, self.base = cell.stage, cell.key, cell.n_trials, base
        self.name, self.journal, self._attached = study_name(spec.name, cell.stage, cell.key), journal, False
        self.budget, self.r, self.surrogate = cell.budget, cell.r, surrogate
        self.widths = f"{cell.widths[0]:g}-{cell.widths[-1]:g}"  # the cell's range, for analysis' bound check
        if cell.stage == "calibrate":
            cal = spec.calibrate
            self.space = functools.partial(lr_space, low=cal.low, high=cal.high)
            self.lr_param, self.heads = cal.param, None
            grid = [{"lr": lr} for lr in log_grid(cal.low, cal.high, cal.trials)]
            guess = [{"lr": lr} for lr in lr_bracket((spec.recipe or {}).get(cal.param), cal.low, cal.high)]
        else:
            self.heads = [space.heads(s, spec) for s in cell.widths]
            self.space = functools.partial(width_space, low=self.heads[0], high=self.heads[-1],
                                           head_dim=spec.head_dim, width_unit=spec.width_unit)
            self.lr_param = None
            grid = [{"heads": self.heads[round(i)]} for i in space.spread(len(self.heads), cell.n_trials)]
            guess = [{"heads": space.heads(cell.first_guess, spec)}]
        seed = cell_seed(spec.seed, cell.stage, cell.key)
        sampler = LawSampler(surrogate, cell.key) if surrogate is not None else make_sampler(spec.sampler, seed)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        # the grid is the queue itself; GP and TPE start from a first guess; random search stays random; the law
        # sampler makes its own first guess
        for point in {"grid": grid, "random": []}.get(spec.sampler if surrogate is None else "random", guess):
            self.study.enqueue_trial(point)
        self.asked = 0
        self.attach()

    def open(self) -> bool:
        """Whether the cell takes another trial: under its cap and, with the law sampler, not yet located."""
        return self.asked < self.n_trials and (self.surrogate is None or self.surrogate.status(self.key) == "open")

    def ask(self) -> tuple[int, TrialConfig]:
        """(Optuna trial number, trial) of the next proposal: the cell's base trial at the proposed width or
        learning rate, checked as it is built."""
        self.attach()
        trial = self.study.ask()
        params = self._params(trial)
        if self.heads is not None and params["heads"] in self.tried(besides=trial.number):
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.study.enqueue_trial({"heads": self._nearest_untried(params["heads"])})
            trial = self.study.ask()
            params = self._params(trial)
        self.asked += 1
        if "s" in params:
            return trial.number, dataclasses.replace(self.base, s=params["s"])
        return trial.number, dataclasses.replace(self.base, recipe={**self.base.recipe, self.lr_param: params["lr"]})

    def _params(self, trial: optuna.Trial) -> dict[str, Any]:
        derived = self.space(trial) or {}  # samples first: trial.params is empty until it has run
        return {**trial.params, **derived}

    def tell(self, number: int, value: float | None, branches: tuple[tuple[str, int, float | None], ...] = ()) -> None:
        """The trial ``number`` ended with ``value`` (None: failed); with the law sampler, it and its warmdown
        ``branches`` (cell, heads, loss) go to the shared surrogate, which refits."""
        self.attach()
        ok = value is not None and math.isfinite(value)
        if ok:
            self.study.tell(number, value)
        else:
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)
        if self.surrogate is not None:
            self.surrogate.add(self.key, self.heads_of(number), value if ok else None, branches)

    def heads_of(self, number: int) -> int:
        """The heads (width) the study's trial ``number`` holds."""
        return self.study.get_trials(deepcopy=False)[number].params["heads"]

    def attach(self) -> None:
        """Move the study into the journal (once per process): the journal's study of this name becomes exactly
        this study's trials, numbered alike (they are added in order), with the same sampler."""
        if self._attached or self.journal is None:
            return
        storage = study_storage(self.journal)
        if self.name in optuna.get_all_study_names(storage):
            optuna.delete_study(study_name=self.name, storage=storage)
        study = optuna.create_study(storage=storage, study_name=self.name, direction="minimize",
                                    sampler=_for_new_study(self.study.sampler))
        study.add_trials(self.study.get_trials(deepcopy=False))
        self.study, self._attached = study, True

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "study": (self.study.sampler, self.study.get_trials(deepcopy=False)),
                "_attached": False}

    def __setstate__(self, state: dict[str, Any]) -> None:
        sampler, trials = state["study"]
        study = optuna.create_study(direction="minimize", sampler=sampler)
        study.add_trials(trials)
        base = state["base"]  # a sweep started before trials were typed saved its base trial as a dict
        self.__dict__.update({**state, "study": study,
                              "base": base if isinstance(base, TrialConfig) else TrialConfig.from_params(base)})

    def tried(self, besides: int = -1) -> set[int]:
        """Heads of the trials told a value or still running (FAILs were duplicates, diverged or failed)."""
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING)
        return {t.params["heads"] for t in self.study.get_trials(deepcopy=False, states=states)
                if t.number != besides and "heads" in t.params}

    def _nearest_untried(self, heads: int) -> int:
        tried = self.tried()
        untried = [h for h in self.heads if h not in tried] or self.heads
        return min(untried, key=lambda h: (abs(math.log(h / heads)), h))


def make_studies(spec: SweepSpec, stage: str, recipe: dict[str, Any] | None,
                 cells: list[Cell] | None = None, journal: str | None = None) -> list[CellStudy]:
    """The studies of a stage's cells (``cells``: instead of the spec's, e.g. with other trial counts), kept in
    the Optuna ``journal`` file if given; with the law sampler, every search cell shares one ``LawSurrogate``."""
    cells = spec.cells(stage) if cells is None else cells
    surrogate = None
    if spec.sampler == "law" and stage == "search":
        surrogate = LawSurrogate([CellGeometry.of(spec, c) for c in cells], seed=spec.seed,
                                 tolerance=spec.tolerance, branches=spec.branches, information=spec.information,
                                 deferred=spec.deferred_budgets)
    return [CellStudy(spec, c, spec.trial_config(c, c.first_guess, recipe), surrogate, journal) for c in cells]


class CellSearcher(Searcher):
    """One Tune searcher over every cell of a stage, dispatching to the cells' Optuna studies.

    Each free slot goes to the open cell with the fewest running trials, then the smallest budget (the cheapest:
    with the law sampler, large budgets are then proposed by a law fitted on the small ones), then the fewest
    started trials, so all cells advance side by side and each study sees its earlier results. With the law
    sampler, while trials run, a cell whose next trial would be a guess that their results may settle leaves the
    slot to the others, or idle (``LawSurrogate.holds_back``): more slots then buy time, not FLOPs. A cell that is
    not open now (located, or at its cap) may reopen when a running trial of it finishes with a result that
    unsettles it, so the searcher waits for running trials before it declares the stage finished. Tune's
    config of a trial is
    ``{"trial": <TrialConfig.to_params()>, "meta": {stage, cell, searched, trial_key}}`` (``searched``: the dotted key
    the study chose); the key ``<stage>/<cell>/<n>`` numbers the
    cell's proposals, so it survives a restore together with the searcher's pickled state.
    """

    def __init__(self, studies: list[CellStudy]):
        super().__init__(metric=None, mode=None)  # no Tune-level metric: progress reports carry no val_loss
        self._studies = {s.key: s for s in studies}
        self._running: dict[str, dict[str, int]] = {s.key: {} for s in studies}  # cell -> trial_id -> number
        self._branches: dict[str, list[tuple[str, int]]] = {}  # trial_id -> (cell, heads) of its branches
        self._held = False  # every open cell held back; Tune asks again each step, and only a result changes that

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True

    def suggest(self, trial_id: str) -> dict | None:
        for study in self._studies.values():  # a restored searcher: its studies replace the journal's first
            study.attach()
            LIVE_SEARCHERS[study.stage] = self
        open_cells = [k for k, s in self._studies.items() if s.open()]
        if not open_cells:
            return None if any(self._running.values()) else Searcher.FINISHED
        if any(self._running.values()):  # a cell whose next trial would be a guess waits for results
            open_cells = [] if self._held else [k for k in open_cells if not self._holds_back(k)]
            if not open_cells:
                self._held = True  # (~25 ms to find out, on the paper preset's 32 cells)
                return None
        key = min(open_cells, key=self._priority)
        study = self._studies[key]
        number, trial = study.ask()
        self._running[key][trial_id] = number
        if study.surrogate is not None:
            trial = self._branch(study, trial_id, study.heads_of(number), trial)
        searched = f"recipe.{study.lr_param}" if study.lr_param else "s"
        return {"trial": trial.to_params(), "meta": {"stage": study.stage, "cell": key, "searched": searched,
                                         "cell_widths": study.widths,
                                         "trial_key": f"{study.stage}/{key}/{study.asked}"}}

    def _priority(self, key: str) -> tuple:
        """Free slots go to the cells with the fewest running trials (a second trial proposed before the first
        has reported is a guess), then to cells that need not wait for larger cells' branches
        (``LawSurrogate.waits``), then to the smallest budget, then to the fewest started trials."""
        study = self._studies[key]
        waits = study.surrogate is not None and study.surrogate.waits(key)
        return len(self._running[key]), waits, study.budget, study.asked

    def _holds_back(self, key: str) -> bool:
        """With the law sampler, whether the cell leaves a free slot idle while trials run
        (``LawSurrogate.holds_back``)."""
        study = self._studies[key]
        if study.surrogate is None:
            return False
        return study.surrogate.holds_back(key, {study.heads_of(n) for n in self._running[key].values()})

    def _branch(self, study: CellStudy, trial_id: str, heads: int, trial: TrialConfig) -> TrialConfig:
        """The trial with the warmdown branches the surrogate wants (``LawSurrogate.branches_for``)."""
        if not study.surrogate.branches:  # (no reading of every cell's trials for a sweep without branches)
            return trial
        busy = {k: s.tried() for k, s in self._studies.items()}
        targets = study.surrogate.branches_for(study.key, heads, busy)
        if not targets:
            return trial
        for k, _ in targets:
            study.surrogate.expect(k, heads)
        self._branches[trial_id] = [(k, heads) for k, _ in targets]
        return dataclasses.replace(trial, branch_budgets=tuple(sorted(b for _, b in targets)))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self._held = False
        for key, running in self._running.items():
            if trial_id in running:
                ok = not error and result is not None and result.get("status") == "ok"
                study = self._studies[key]
                number = running.pop(trial_id)
                branches = () if study.surrogate is None else self._branch_points(  # (a calibration has no width)
                    study, trial_id, study.heads_of(number), result if ok else None)
                study.tell(number, result.get(METRIC) if ok else None, branches)
                return

    def _branch_points(self, study: CellStudy, trial_id: str, heads: int,
                       result: dict | None) -> tuple[tuple[str, int, float | None], ...]:
        """(cell, heads, loss) of every branch the trial announced (loss None if it did not record it) and of
        every other branch it recorded in a cell of this stage that has its width (the recipe's fixed
        ``branch_budgets``)."""
        expected = self._branches.pop(trial_id, [])
        recorded = {space.cell_key(budget, study.r): loss for budget, loss in recorded_branches(result)}
        points = {(k, h): recorded.get(k) for k, h in expected}
        for k, loss in recorded.items():
            if k in study.surrogate.cells and heads in study.surrogate.cells[k].heads:
                points.setdefault((k, heads), loss)
        return tuple((k, h, v) for (k, h), v in points.items())

    def finished_cells(self) -> set[str]:
        """Cells that take no more trials (located, bound-limited or at their cap) and have none running."""
        return {k for k, s in self._studies.items() if not s.open() and not self._running[k]}

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
        self._held = False

    def studies(self) -> dict[str, optuna.Study]:
        return {k: s.study for k, s in self._studies.items()}


# ---- the trial -----------------------------------------------------------------------------------------
def run_trial(config: dict[str, Any], receipts: str = "", workers: int = 1,
              worker_resources: dict[str, float] | None = None, data_parallel_dir: str = "") -> None:
    """One Tune trial: simulate or train, forwarding training progress so the curve reaches MLflow.

    The final result is saved as a receipt in the folder ``receipts`` before it is reported, and a trial that
    finds its receipt reports it instead of running again. Tune saves its experiment state every few seconds
    and copies it to storage in the background, so after a crash it restarts trials that had already
    finished (and been logged); with the receipt none of them is simulated or trained twice. A receipt the
    disk refuses (full) travels in the report instead (``UNSAVED_KEY``), to the trial's MLflow run, from which
    ``--resume`` writes it (``restore_receipts``) before Tune restarts the trial.
    """
    params = config["trial"]
    trial = TrialConfig.from_params(params)
    receipt = Receipt(receipts, config["meta"]["trial_key"], params) if receipts else None
    result = receipt.load() if receipt else None
    if result is None:
        if trial.objective == "simulate":
            result = checked(objectives.simulate(trial))
        elif workers > 1:
            result = checked(train_data_parallel(params, workers, worker_resources or {}, data_parallel_dir))
        else:
            result = checked(objectives.train(trial, report=tune.report))
        # the Ray node it ran on, for the run's ``node`` tag (hostnames and IPs repeat across a machine's nodes);
        # a data-parallel trial's workers' nodes, in rank order, comma-separated
        result = {"node": ray.get_runtime_context().get_node_id(), **result}
        if receipt:
            try:
                receipt.save(result)
            except OSError as exc:  # a full or failing disk: the result is sound, and the driver stops the sweep
                carried = receipt.carried(result)
                hold_unsaved(receipt, config, carried)
                result = {**result, INFRA_KEY: f"cannot write the trial's receipt in {receipts}: {exc.strerror or exc}",
                          UNSAVED_KEY: carried}
    tune.report(result)


def hold_unsaved(receipt: "Receipt", config: dict[str, Any], carried: str) -> None:
    """Keep the ``Receipt.carried`` text of a trial's refused receipt, with the trial's config, in the Ray
    cluster's key-value store (the GCS; Tune keeps its registry there too) under the receipt's path: the
    driver logs it from there after Tune stops (``log_unsaved``). The trial's report carries it too, but a
    report that arrives while Tune stops (as it does for a disk failure) is dropped."""
    kept = {"meta": config["meta"], "trial": config["trial"], "receipt": carried}
    _internal_kv_put(receipt.path, json.dumps(kept), namespace=KV_NAMESPACE)


def log_unsaved(tracker: TrialTracker, receipts: str) -> int:
    """Log, with their receipts, the trials ``hold_unsaved`` kept for the stage whose receipts folder is
    ``receipts`` (a trial logged already is left as it is: ``TrialTracker.start``), then forget them; how many
    were held. Raises ``StoreFailure`` when the store fails."""
    held = _internal_kv_list(f"{receipts.rstrip('/')}/", namespace=KV_NAMESPACE)
    if held:
        with store_errors():
            tracker.open()
            for name in held:
                kept = json.loads(_internal_kv_get(name, namespace=KV_NAMESPACE))
                meta, carried = kept["meta"], kept["receipt"]
                tracker.start(meta["trial_key"], meta, TrialConfig.from_params(kept["trial"]))
                tracker.finish(meta["trial_key"], json.loads(json.loads(carried)["text"]), carried)
                _internal_kv_del(name, namespace=KV_NAMESPACE)
    return len(held)


def train_data_parallel(params: dict[str, Any], workers: int, resources: dict[str, float],
                        storage: str) -> dict[str, Any]:
    """Train one trial (``params``: its ``TrialConfig.to_params``) data-parallel on ``workers`` Ray Train workers
    of ``resources`` each (Ray Train V2's
    ``TorchTrainer`` inside a Tune trial, with ``TuneReportCallback`` forwarding the workers' progress reports to
    this trial). Ray Train retries nothing (Tune's ``FailureConfig`` does, as for every trial); the final result
    comes back from rank 0 as a JSON file under ``storage`` (the sweep's storage, which every node sees), where
    Ray Train keeps its run state too."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    run = f"{tune.get_context().get_trial_id()}-{time.time_ns()}"  # a fresh Ray Train run per attempt
    final = JsonFile(f"{storage.rstrip('/')}/{run}.result.json")
    gpus = resources.get("gpu", 0.0)
    trainer = TorchTrainer(
        functools.partial(_data_parallel_worker, result_file=final.path),
        train_loop_config=params,
        torch_config=TorchConfig(backend="nccl" if gpus > 0 else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=gpus > 0,
                                               resources_per_worker={"CPU": resources.get("cpu", 1.0),
                                                                     **({"GPU": gpus} if gpus > 0 else {})}),
        run_config=ray.train.RunConfig(name=run, storage_path=storage, callbacks=[TuneReportCallback()],
                                       failure_config=ray.train.FailureConfig(max_failures=0)))
    trainer.fit()
    result = final.load()
    if result is None:
        raise RuntimeError("data-parallel trial finished without a result from rank 0")
    return result


def _data_parallel_worker(params: dict[str, Any], result_file: str) -> None:
    """One Ray Train worker: train on this worker's share (objectives.train), report progress from every
    worker (a report is a barrier), and rank 0 writes the final result with every worker's node."""
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    trial = dataclasses.replace(TrialConfig.from_params(params), device=str(ray.train.torch.get_device()))
    result = objectives.train(trial, report=ray.train.report)
    nodes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id())
    if dist.get_rank() == 0:
        JsonFile(result_file).save({**result, "node": ",".join(nodes)})


def checked(result: dict[str, Any]) -> dict[str, Any]:
    """An "ok" result without a finite loss becomes status "invalid" with the reason, so that neither MLflow,
    the searcher nor the progress lines take it for a measurement."""
    if result.get("status") == "ok" and not _finite(result.get(METRIC)):
        return {**result, "status": "invalid",
                "reason": f"the objective returned {METRIC} = {result.get(METRIC)} with status ok"}
    return result


class JsonFile:
    """One JSON document at a local path or an object-storage URI, written whole: to a temporary file, then
    renamed into place, so a kill in the middle leaves the previous document (or none), never half of one."""

    def __init__(self, uri: str):
        self.path = uri
        self._fs, self._file = pyarrow.fs.FileSystem.from_uri(uri)

    def load(self) -> dict[str, Any] | None:
        """The document, or None when there is none. One that does not parse (written by hand, or cut short
        by a version that wrote in place) raises ValueError naming the file."""
        if self._fs.get_file_info(self._file).type == pyarrow.fs.FileType.NotFound:
            return None
        with self._fs.open_input_stream(self._file) as f:
            text = f.read().decode(errors="replace")
        try:
            return json.loads(text)
        except ValueError:
            raise ValueError(f"{self.path} is not a readable JSON document; remove it") from None

    def save(self, data: dict[str, Any]) -> None:
        self.write(json.dumps(data))

    def write(self, text: str) -> None:
        """The document ``text``, written whole."""
        self._fs.create_dir(self._file.rsplit("/", 1)[0], recursive=True)
        partial = f"{self._file}.{os.getpid()}.partial"
        try:
            with self._fs.open_output_stream(partial) as f:
                f.write(text.encode())
            self._fs.move(partial, self._file)
        except BaseException:  # a full disk, or a kill: no half-written file left behind
            try:
                self._fs.delete_file(partial)
            except OSError:
                pass
            raise


class Receipt(JsonFile):
    """The final result of one trial in ``<storage>/<sweep>/<stage>/receipts/``, named by a hash of its trial
    key and config."""

    def __init__(self, folder: str, key: str, params: dict[str, Any]):
        blob = json.dumps({"key": key, "trial": params}, sort_keys=True, default=str)
        super().__init__(f"{folder.rstrip('/')}/{hashlib.sha256(blob.encode()).hexdigest()[:24]}.json")

    def load(self) -> dict[str, Any] | None:
        """An unreadable receipt is no receipt: the trial runs again."""
        try:
            return super().load()
        except ValueError:
            return None

    def carried(self, result: dict[str, Any]) -> str:
        """The receipt of ``result`` as one text to keep elsewhere (the trial's MLflow run) while the disk
        refuses it: its file name and the very text ``save`` writes; ``restore_receipts`` writes it back."""
        return json.dumps({"file": self.path.rsplit("/", 1)[-1], "text": json.dumps(result)})


def restore_receipts(carried: list[str], folder: str) -> int:
    """Write each ``Receipt.carried`` text of ``carried`` (kept on the MLflow runs of trials that finished
    while the disk was full) back as its receipt in ``folder`` where that receipt is missing or unreadable; how
    many were written. Tune then restarts those trials (its state predates their end), and each reports its
    receipt instead of running again. Raises ``StoreFailure`` when the disk still refuses them."""
    written = 0
    for text in carried:
        receipt = json.loads(text)
        target = JsonFile(f"{folder.rstrip('/')}/{receipt['file']}")
        try:
            if target.load() is not None:
                continue
        except ValueError:  # unreadable: no receipt (``Receipt.load``)
            pass
        try:
            target.write(receipt["text"])
        except OSError as exc:
            raise StoreFailure(f"cannot write the receipts of trials that finished while the disk was full in "
                               f"{folder}: {exc.strerror or exc}; free space, then resume again") from None
        written += 1
    return written


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


# ---- driver callbacks ----------------------------------------------------------------------------------
class TrackingCallback(Callback):
    """MLflow from the driver, idempotent by trial key (the stock MLflowLoggerCallback duplicates runs after
    a restore: ECOSYSTEM.md). It also watches for reasons to stop (``STOP``): a store write that fails, a trial
    whose receipt could not be written, a disk that fills up, a signal. It never raises into Tune (which would
    record a store failure as the failure of every trial it touched): it asks Tune for a graceful stop
    instead, and the trials it could not log are logged from their receipts on --resume."""

    keeper: StateKeeper | None = None  # (class defaults: a callback pickled before they existed restores too)
    store_failed = False

    def __init__(self, tracker: TrialTracker, disks: dict[str, str] | None = None,
                 keeper: StateKeeper | None = None):
        self.tracker = tracker
        self.disks = disks or {}
        self.keeper = keeper

    def setup(self, **info: Any) -> None:
        self.store_failed = False  # (a resumed stage: the store is tried afresh)
        self._safely(self.tracker.open)

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        full = low_space(self.disks)  # one statvfs per disk: microseconds, and Tune writes its state every step
        if full:
            STOP.fail(full)
        if STOP.requested:
            _stop_tune()
        if self.keeper is not None:  # a stat of three files, and a copy when Tune wrote a new snapshot
            self.keeper.refresh()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        meta = trial.config["meta"]
        self._safely(self.tracker.start, meta["trial_key"], meta, TrialConfig.from_params(trial.config["trial"]))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if "status" not in result:  # a progress report, not the final result
            self._safely(self.tracker.curve, trial.config["meta"]["trial_key"], result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        # (a receipt the disk refused goes onto the run, for --resume to write it back)
        self._safely(self.tracker.finish, trial.config["meta"]["trial_key"], result, result.get(UNSAVED_KEY, ""))
        if result.get(INFRA_KEY):
            STOP.fail(result[INFRA_KEY])

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        reason = error_reason(trial)
        if is_disk_error(reason):  # not the trial's failure: it runs again on --resume
            STOP.fail(f"trial {trial.config['meta']['trial_key']} failed on a disk error: {reason}")
            return
        self._safely(self.tracker.fail, trial.config["meta"]["trial_key"], reason)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if not STOP.requested:  # a stopped stage keeps its runs: their trials resume
            ended = {t.config["meta"]["trial_key"] for t in trials if "status" in (t.last_result or {})}
            self._safely(self.tracker.close, ended)

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
            STOP.fail(str(exc))
            _stop_tune()


def is_disk_error(reason: str) -> bool:
    """Whether a trial's error line is the disk's (full, read-only, failing), not the trial's own."""
    return any(os.strerror(code) in reason for code in DISK_ERRNOS)


def _stop_tune() -> None:
    """Ask the running Tune for its graceful stop: it saves its experiment state, leaves running trials to be
    resumed, and returns from ``fit``. Tune listens for it on SIGUSR1 while it runs (``tune.run``)."""
    if STOP.in_tune and signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN, None):
        signal.raise_signal(signal.SIGUSR1)


class ProgressCallback(Callback):
    """One line per finished trial on stdout; trials restored as finished are counted silently."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self._counted_restored = False

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        # Only the first step: a resumed Tune holds the earlier session's trials from its start, and later
        # ones arrive through on_trial_complete / on_trial_error. (Scanning every trial at every step cost
        # O(trials) per step: 1.3 ms more per trial at 1,024 trials than at 256.)
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
        searcher = LIVE_SEARCHERS.get(self.progress.stage)
        if searcher is not None:
            self.progress.finish(searcher.finished_cells())


def searched(trial: Any) -> float:
    """The value the trial's study chose (its width s, or the calibrated rate)."""
    value = trial.config["trial"]
    for part in trial.config["meta"]["searched"].split("."):
        value = value[part]
    return float(value)


def error_reason(trial: Any) -> str:
    """Why the trial failed, for the run's ``reason`` tag (see ``failure_reason``), from its error log."""
    try:
        log = Path(trial.error_file).read_text()
    except (OSError, TypeError):
        log = ""
    return failure_reason(log)


def failure_reason(log: str) -> str:
    """One line from Tune's error log of a trial (one ``Failure # n`` block per failed attempt): the last
    line of the last block (the exception message), or, when the trial's worker process died (a signal such
    as the out-of-memory killer's SIGKILL, or an exit), Ray's exit type and detail; then how many attempts
    the trial had (1 + the retries)."""
    blocks = log.split("Failure # ")
    lines = [ln.strip() for ln in blocks[-1].splitlines() if ln.strip()]
    died = next((ln for ln in lines if ln.startswith("The actor is dead because its worker process has died")), "")
    if died:  # Ray's line goes on with a list of possible causes; its first sentences say what happened
        reason = "worker process died: " + died.split(" Some common causes")[0].removeprefix(
            "The actor is dead because its worker process has died. ")
    else:
        reason = lines[-1] if lines else "trial raised"
    attempts = max(1, len(blocks) - 1)
    return f"{reason[:400]} ({attempts} attempt{'s' if attempts > 1 else ''})"


# ---- the driver ----------------------------------------------------------------------------------------
@dataclass
class StageOutcome:
    stage: str
    results: list[dict[str, Any]] = field(default_factory=list)  # meta, final metrics and "trial" config
    studies: dict[str, optuna.Study] = field(default_factory=dict)

    def best(self) -> dict[str, Any] | None:
        ok = [r for r in self.results if r.get("status") == "ok" and _finite(r.get(METRIC))]
        return min(ok, key=lambda r: r[METRIC]) if ok else None


@dataclass
class SweepOutcome:
    spec: SweepSpec
    stages: dict[str, StageOutcome]
    already_complete: bool = False
    experiment_id: str = ""
    parent_run_id: str = ""


def run_search(spec: SweepSpec, *, resume: bool = False, verbose: bool = False) -> SweepOutcome:
    """Run (or resume) the sweep: calibration if the spec asks for it, then the allocation search.

    The sweep is complete only when every planned trial has its ended run in MLflow. Raises ValueError
    (before Ray starts, writing nothing) when the sweep cannot start: the stored state does not match (state
    but no ``resume``, a changed spec, an MLflow store that already holds this sweep), another driver runs it,
    the Ray address does not answer, a disk has no room. After a clean stop it raises ``SweepInterrupted``
    (a signal) or ``StoreFailure`` (the MLflow store or a disk failed); everything finished is kept for
    ``--resume``.
    """
    global STOP
    raise_if_interrupted()  # a signal that the imports of this module swallowed (stopping.interrupt)
    check_ray_address(ray_address(spec.address))
    STOP = StopRequest()
    local = "://" not in spec.storage
    with SweepLock(Path(spec.storage) / spec.name) if local else contextlib.nullcontext(), STOP.handling_signals():
        try:
            return _drive(spec, resume, verbose)
        except SweepInterrupted as exc:  # before a stage ran: resumable once the sweep's state is written
            if "--resume" in str(exc) or SweepState(spec.storage, spec.name).load() is None:
                raise
            raise type(exc)(exc.signum, f"{exc}; resume with: {resume_command(spec)}") from None


def resume_command(spec: SweepSpec) -> str:
    return f"loopscale search {spec.source or spec.name} --resume"


def _drive(spec: SweepSpec, resume: bool, verbose: bool) -> SweepOutcome:
    state = SweepState(spec.storage, spec.name)
    saved = state.load()
    if saved is not None:
        if saved["spec_hash"] != spec.spec_hash:
            raise ValueError(f"sweep {spec.name!r} at {state.path} was started from a different spec "
                             f"(hash {saved['spec_hash']} != {spec.spec_hash}); use a new name or remove that state")
        if saved.get("complete"):
            if find_parent_run(spec.tracking_uri, spec.name) is not None:
                print(f"sweep {spec.name!r} is already complete ({state.path}); nothing to do", flush=True)
                return SweepOutcome(spec, {}, already_complete=True)
            lost = (f"sweep {spec.name!r} is complete ({state.path}) but MLflow {redact(spec.tracking_uri)} holds "
                    "none of its runs")
            if not resume:
                raise ValueError(f"{lost}; pass --resume to log them there again from the trials' receipts")
            # the stages restore with every trial finished and log each from its receipt; until that is done
            # (and should it be interrupted) the sweep is not complete in this store
            print(f"{lost}: logging them there again from the trials' receipts", flush=True)
            saved = {**saved, "complete": False}
        elif not resume:
            raise ValueError(f"sweep {spec.name!r} has unfinished state at {state.path}: pass --resume to "
                             f"continue it (or remove that directory to start over)")
    elif find_parent_run(spec.tracking_uri, spec.name) is not None:
        raise ValueError(f"MLflow experiment {spec.name!r} already holds a sweep of that name but there is no "
                         f"Tune state for it at {state.path}; use a new name or delete the experiment")
    disks = _disks(spec)
    check_free_space(disks, spec.planned_trials())
    _quiet(verbose)
    user_period = os.environ.get(SNAPSHOT_ENV)
    fingerprint = _prepare_data(spec)
    started_ray = _start_ray(spec, verbose)
    try:
        _check_trials_fit(spec, can_grow=not started_ray or bool(spec.address or os.environ.get("RAY_ADDRESS")))
        fresh = saved is None
        saved = saved or {"spec_hash": spec.spec_hash, "complete": False}
        state.save(saved)  # first: a crash from here on is resumable
        try:
            with store_errors(spec.tracking_uri):
                experiment_id, parent = open_sweep(spec, fingerprint)
        except StoreFailure:
            if fresh:  # nothing ran: leave no state that would then demand --resume
                state.remove()
            raise
        print(f"sweep {spec.name!r}: {len(spec.cells())} cells, {spec.planned_trials()} trials, objective "
              f"{spec.objective}; MLflow {redact(spec.tracking_uri)} (experiment {spec.name!r}); "
              f"Tune state {Path(state.path).parent}", flush=True)
        tags = {"spec_hash": spec.spec_hash, "code_version": code_version(), "data_fingerprint": fingerprint}
        stages: dict[str, StageOutcome] = {}
        recipe = spec.recipe
        run = functools.partial(_run_stage, spec, experiment_id=experiment_id, parent=parent, tags=tags,
                                verbose=verbose, snapshot_period=user_period, disks=disks)
        if spec.calibrate is not None:
            stages["calibrate"] = run("calibrate", spec.recipe)
            best = stages["calibrate"].best()
            if best is None:
                raise RuntimeError(f"calibration: no trial trained without diverging; change [calibrate] low/high "
                                   f"and start over (remove {Path(state.path).parent})")
            rate = best["trial"]["recipe"][spec.calibrate.param]
            recipe = {**spec.recipe, spec.calibrate.param: rate}
            print(f"calibrated {spec.calibrate.param} = {rate:.4g} "
                  f"(val_loss {best[METRIC]:.4f}); every search trial uses it", flush=True)
        stages["search"] = run("search", recipe)
        flops = flops_spent(spec, stages)
        with store_errors(spec.tracking_uri):
            close_sweep(spec.tracking_uri, parent, flops)
        state.save({**saved, "complete": True})
        print(f"spent: {flops_text(flops['total'], flops['paper_grid'])}", flush=True)
        print(f"sweep {spec.name!r} complete; fit it with: loopscale analyze --experiment {spec.name} "
              f"--tracking-uri {redact(spec.tracking_uri)}", flush=True)
        return SweepOutcome(spec, stages, experiment_id=experiment_id, parent_run_id=parent)
    finally:
        if user_period is None:
            os.environ.pop(SNAPSHOT_ENV, None)
        else:
            os.environ[SNAPSHOT_ENV] = user_period
        if started_ray:
            ray.shutdown()


def _disks(spec: SweepSpec) -> dict[str, str]:
    """The local folders a sweep writes to, by what they hold (the free-space checks)."""
    disks = {"Tune storage": spec.storage}
    if spec.tracking_uri.startswith("sqlite:///"):
        disks["MLflow store"] = str(Path(spec.tracking_uri.removeprefix("sqlite:///")).parent)
    return disks


def _run_stage(spec: SweepSpec, stage: str, recipe: dict[str, Any] | None, *, experiment_id: str, parent: str,
               tags: dict[str, str], verbose: bool, snapshot_period: str | None,
               disks: dict[str, str]) -> StageOutcome:
    cells = spec.cells(stage)
    # Tune snapshots its experiment state every 2 s; a trial that finished after the last snapshot is started
    # again on resume and reports its receipt (run_trial) without running twice. (Snapshots at every training
    # report wrote 14x the bytes, 1.3 GB for an 8-trial demo-sized sweep, and cost 1.5 s of driver CPU per trial.)
    os.environ[SNAPSHOT_ENV] = snapshot_period or "2"
    path = f"{spec.storage.rstrip('/')}/{spec.name}/{stage}"
    receipts = f"{path}/receipts"
    workers = spec.workers_of(stage)
    # a data-parallel trial's own process only waits for its Ray Train workers, which hold the CPUs and GPUs
    # (Tune needs some resource in a trial's request: a MiB of memory)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, receipts=receipts, workers=workers,
                             worker_resources=spec.resources(stage), data_parallel_dir=f"{path}/data-parallel"),
        spec.resources(stage) if workers == 1 else {"cpu": 0, "memory": 1 << 20})
    tracker = functools.partial(TrialTracker, experiment_id=experiment_id, parent_run_id=parent, sweep=spec.name,
                                tags=tags)
    keeper = StateKeeper(path) if "://" not in path else None
    if keeper is not None and keeper.damaged():
        copy = keeper.recover()
        print(f"Tune's state in {path} was cut short (a disk that filled up while Tune wrote it); resuming from "
              f"its last readable copy ({copy.name}): trials finished since then report their receipts",
              flush=True)
    restore = tune.Tuner.can_restore(path)
    if restore:
        # Trials that errored on a disk or store failure have no ended run: they run again. Trials that failed
        # by themselves (their FAILED run is in MLflow) stay failed.
        with store_errors(spec.tracking_uri):
            logged = tracker()
            logged.open()
        restored = restore_receipts(logged.carried_receipts(f"{stage}/"), receipts)
        if restored:
            print(f"{restored} {stage} trials finished while the disk was full: their receipts are restored from "
                  "their MLflow runs, so they do not run again", flush=True)
        try:
            errored = [t for t in tune.ExperimentAnalysis(path).trials
                       if t.status == "ERROR" and t.config["meta"]["trial_key"] not in logged.logged()]
            tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True,
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
            restore = False
    if not restore:
        with store_errors(spec.tracking_uri):
            discard_stage_runs(spec.tracking_uri, experiment_id, parent, stage)  # an attempt killed before Tune saved
        searcher = CellSearcher(make_studies(spec, stage, recipe, journal=study_journal(spec)))
        progress = Progress(stage, {c.key: c.n_trials for c in cells},
                            spec.calibrate.param if stage == "calibrate" else "s")
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=sum(c.n_trials for c in cells),
                                        max_concurrent_trials=spec.concurrency(
                                            stage, ray.cluster_resources().get("CPU", 1)),
                                        reuse_actors=True,
                                        trial_dirname_creator=_trial_dirname),
            # every snapshot reaches the storage (Tune's default: every 5 minutes), where the keeper copies it
            run_config=tune.RunConfig(name=stage, storage_path=f"{spec.storage.rstrip('/')}/{spec.name}",
                                      sync_config=tune.SyncConfig(sync_period=float(os.environ[SNAPSHOT_ENV])),
                                      callbacks=[TrackingCallback(tracker(), disks, keeper),
                                                 ProgressCallback(progress)],
                                      failure_config=tune.FailureConfig(max_failures=spec.retries),
                                      verbose=1 if verbose else 0),
        )
    grid = _fit(tuner)
    try:  # trials that ended on a full disk while Tune stopped, their reports dropped
        log_unsaved(tracker(), receipts)
    except StoreFailure as exc:
        STOP.fail(str(exc))
    planned = _planned_trials(spec, stage, cells, grid)
    if STOP.signum is not None:
        finished = sum(1 for result in grid if "status" in (result.metrics or {}))
        raise SweepInterrupted(STOP.signum, f"interrupted by {signal_name(STOP.signum)}: {finished} of "
                                            f"{len(planned)} {stage} trials finished; resume with: "
                                            f"{resume_command(spec)} (and the same options)")
    if STOP.failure:
        raise StoreFailure(f"{STOP.failure}; the sweep stopped and keeps every finished trial: fix it, then run "
                           f"{resume_command(spec)}")
    outcome = StageOutcome(stage, studies=_saved_studies(path))
    with store_errors(spec.tracking_uri):
        reconcile = tracker()
        reconcile.open()
        for result in grid:
            _log_if_missing(reconcile, result, receipts)
        missing = sorted(planned - reconcile.logged())
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(planned)} planned {stage} trials have no ended run in MLflow "
                           f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); run "
                           f"{resume_command(spec)}")
    for result in grid:
        metrics = {k: v for k, v in (result.metrics or {}).items() if k in METRIC_KEYS}
        if result.error is not None:
            metrics = {"status": "failed", "reason": failure_reason(_error_log(result))}
        elif "status" not in metrics:
            metrics = {"status": "failed", "reason": "no final result"}
        outcome.results.append({**result.config["meta"], **metrics, "trial": result.config["trial"]})
    return outcome


def flops_spent(spec: SweepSpec, stages: dict[str, StageOutcome]) -> dict[str, Any]:
    """FLOPs the sweep's trials spent: total (every stage), per search cell, and the paper grid's figure where
    the sweep covers its cells with its template and batch (else None)."""
    spent = [(r["cell"], r["stage"], float(r.get("flops_spent", 0.0))) for s in stages.values() for r in s.results
             if _finite(r.get("flops_spent"))]
    per_cell = {c.key: sum(f for cell, stage, f in spent if cell == c.key and stage == "search") for c in spec.cells()}
    reference = paper_grid_reference(spec.budgets, spec.recurrences, spec.model_template(), spec.batch_tokens)
    return {"total": sum(f for _, _, f in spent), "per_cell": per_cell, "paper_grid": reference}


def _fit(tuner: tune.Tuner) -> Any:
    """``tuner.fit()`` with stop requests handed to Tune (``_stop_tune``) rather than raised inside it; Tune's
    own SIGINT handler is off, so that SIGINT and SIGTERM mean the same to every stage."""
    previous = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    STOP.in_tune = True
    try:
        return tuner.fit()
    finally:
        STOP.in_tune = False
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


def _planned_trials(spec: SweepSpec, stage: str, cells: list[Cell], grid: Any) -> set[str]:
    """The trial keys the stage must have ended runs for: every cell's cap, except where the law sampler closes
    a cell early once its optimum is located; then the trials it did propose (all of which Tune started)."""
    if spec.sampler == "law" and stage == "search":
        return {result.config["meta"]["trial_key"] for result in grid if result.config}
    return {f"{stage}/{c.key}/{n}" for c in cells for n in range(1, c.n_trials + 1)}


def _saved_studies(path: str) -> dict[str, optuna.Study]:
    """The cells' studies as Tune last saved them (a local experiment directory; {} on remote storage)."""
    searcher = CellSearcher([])
    try:
        searcher.restore_from_dir(path)
    except RuntimeError:
        return {}
    return searcher.studies()


def _prepare_data(spec: SweepSpec) -> str:
    """Tokenise and cache the data once on the driver (trials only read the cache); its fingerprint."""
    if spec.objective == "simulate" and spec.calibrate is None:
        return "simulated"
    return objectives.prepare_data(spec.data, spec.seq_len, spec.cache_dir, spec.val_tokens)


def _start_ray(spec: SweepSpec, verbose: bool) -> bool:
    """Connect to ``spec.address`` (or RAY_ADDRESS) or start a local Ray; False when one is already up.

    A signal while Ray starts (5-12 s here) stops the sweep like any other (``STOP``), although ``ray.init``
    takes SIGTERM over: at its start it installs ``sys.exit(15)`` as the handler (turned back into
    ``SweepInterrupted`` here), and once connected the driver's Ray core would install a C++ crash handler that
    dumps a stack and may abort on SIGTERM, unless ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` was set when Ray was
    imported (it is, at the top of this module; the processes of a Ray started here then go without those C++
    stack dumps too). A signal whose exception Python swallowed there (``signals_noted``) stops it too.
    Whatever ``ray.init`` started before a signal is shut down; afterwards ``STOP`` holds both signals again."""
    if ray.is_initialized():
        return False
    with signals_noted() as noted:
        try:
            ray.init(address=spec.address, include_dashboard=False, log_to_driver=verbose,
                     logging_level="INFO" if verbose else "ERROR")
            STOP.install()
        except SystemExit as exc:  # Ray's own SIGTERM handler
            ray.shutdown()
            if exc.code != signal.SIGTERM:
                raise
            raise SweepInterrupted(signal.SIGTERM, "interrupted by SIGTERM") from None
        except BaseException:  # SweepInterrupted from STOP's SIGINT handler, or Ray failing to start
            ray.shutdown()
            raise
    lost = [s for s in noted if s in (signal.SIGINT, signal.SIGTERM)]
    if lost:
        ray.shutdown()
        raise SweepInterrupted(lost[0], f"interrupted by {signal_name(lost[0])}")
    return True


def _check_trials_fit(spec: SweepSpec, can_grow: bool) -> None:
    """A trial that asks for more CPUs or GPUs than any live node of the Ray cluster has would wait forever.
    On a Ray this run started itself (this machine, which cannot grow) that is one error line before anything
    is written; on a cluster someone else runs, which may autoscale, it is a warning."""
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    largest_cpu = max((res.get("CPU", 0.0) for res in nodes), default=0.0)
    largest_gpu = max((res.get("GPU", 0.0) for res in nodes), default=0.0)
    for stage in ("calibrate", "search") if spec.calibrate is not None else ("search",):
        need, workers = spec.resources(stage), spec.workers_of(stage)
        # every worker of a data-parallel trial fits some node, and the cluster holds all of them at once
        room = sum(min(res.get("CPU", 0.0) // need["cpu"],
                       res.get("GPU", 0.0) // need["gpu"] if need["gpu"] > 0 else math.inf) for res in nodes)
        if room >= workers:
            continue
        if workers == 1 or room == 0:
            message = (f"[resources] asks for cpus = {need['cpu']:g}, gpus = {need['gpu']:g} per {stage} trial, but "
                       f"no node of the Ray cluster has that much (the most: {largest_cpu:g} CPUs, "
                       f"{largest_gpu:g} GPUs)")
        else:
            message = (f"[resources] asks for {workers} workers of cpus = {need['cpu']:g}, gpus = {need['gpu']:g} "
                       f"per {stage} trial, but the Ray cluster's nodes hold only {room:g} such workers at once")
        if not can_grow:
            raise ValueError(message + "; no trial could ever start")
        print(f"warning: {message}; trials wait until a node that big joins", flush=True)


def _quiet(verbose: bool) -> None:
    """Quiet Ray, Optuna and MLflow unless --verbose."""
    if not verbose:
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # the old console honours verbose=0
        # Tune logs a traceback for every state upload that fails (a full disk), MLflow's sqlite store one for
        # every locked or failing write; the sweep says it in one line (``StoreFailure``)
        for name in ("ray.tune", "ray.train", "mlflow.store"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("mlflow").setLevel(logging.WARNING)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class SweepState(JsonFile):
    """``<storage>/<name>/sweep.json``: the spec hash and whether the sweep completed."""

    def __init__(self, storage: str, name: str):
        super().__init__(f"{storage.rstrip('/')}/{name}/{STATE_FILE}")

    def remove(self) -> None:
        self._fs.delete_file(self._file)

