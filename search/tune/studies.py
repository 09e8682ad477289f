"""The Optuna studies of a stage's cells: their search spaces, seeded samplers, first trials, and the sweep's
Optuna journal that holds them (Optuna only, no Ray: the search-quality benchmark and the law sampler's tests
drive the very same ``CellStudy`` without a cluster).

Each study proposes through a module-level define-by-run space (``width_space`` or ``lr_space`` bound with
``functools.partial``), which pickles by reference, so ``Tuner.restore`` brings back every study, its sampler
RNG and its pending trials after a crash. (Ray's ``OptunaSearch`` is not used: drawing widths without
replacement needs the study's ask/tell.) The studies live in Optuna's own storage too: a journal file in the
sweep's storage (``<storage>/<sweep>/optuna.journal``), one study per cell named ``<sweep>/<stage>/<cell>``, so
``optuna.load_study`` (and Optuna's tools) read them while the sweep runs and after it, resume included: a
restored searcher first writes its studies' trials back into the journal, replacing what an attempt killed
after Tune's last snapshot had added there, so the journal holds exactly the trials of the sweep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
from typing import Any

import optuna

from loopscale.analysis.calibration import reference_rate
from loopscale.model import heads_to_s
from loopscale.objectives import TrialConfig

from .. import space
from ..law_sampler import CellGeometry, LawSampler, LawSurrogate
from ..spec import Cell, SweepSpec
from .metric import finite

N_STARTUP = 3  # model-based proposals start after the first guess and two random widths (see the benchmark)


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
    draws may try only one side of it, while the optimum lies on the other, so the optimum is bracketed
    before the model takes over."""
    start = reference_rate(current if finite(current) else None, low, high)
    return [start, *(x for x in (start / LR_STEP, start * LR_STEP) if low <= x <= high)]


def cell_seed(seed: int, stage: str, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}|{stage}|{key}".encode()).digest()[:4], "little")


def trial_seed(seed: int, stage: str, key: str, number: int) -> int:
    """The own seed (initialisation and batch order) of a cell's ``number``-th proposal under ``seeds =
    "per_trial"``: a function of the sweep's seed and the trial's key alone, so a restored sweep, a retried trial
    and a second run of the spec train each trial from the same seed."""
    return cell_seed(seed, stage, f"{key}/{number}")


# ---- studies -------------------------------------------------------------------------------------------
JOURNAL_FILE = "optuna.journal"


def study_journal(spec: SweepSpec) -> str | None:
    """The sweep's Optuna journal file; None on object storage (Optuna's journal file needs a local path)."""
    storage = spec.placement.storage
    return None if "://" in storage else f"{storage.rstrip('/')}/{spec.name}/{JOURNAL_FILE}"


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
                 journal: str | None = None, own_seeds: bool = True):
        self.stage, self.key, self.n_trials, self.base = cell.stage, cell.key, cell.n_trials, base
        self.name, self.journal, self._attached = study_name(spec.name, cell.stage, cell.key), journal, False
        self.budget, self.r, self.surrogate = cell.budget, cell.r, surrogate
        self.widths = f"{cell.widths[0]:g}-{cell.widths[-1]:g}"  # the cell's range, for analysis' bound check
        if cell.stage == "calibrate":
            cal = spec.training.calibrate
            self.space = functools.partial(lr_space, low=cal.low, high=cal.high)
            self.lr_param, self.heads = cal.param, None
            grid = [{"lr": lr} for lr in log_grid(cal.low, cal.high, cal.trials)]
            guess = [{"lr": lr} for lr in lr_bracket((spec.training.recipe or {}).get(cal.param), cal.low, cal.high)]
        else:
            self.heads = [spec.grid.heads(s) for s in cell.widths]
            self.space = functools.partial(width_space, low=self.heads[0], high=self.heads[-1],
                                           head_dim=spec.grid.head_dim, width_unit=spec.grid.width_unit)
            self.lr_param = None
            grid = [{"heads": self.heads[round(i)]} for i in space.spread(len(self.heads), cell.n_trials)]
            guess = [{"heads": spec.grid.heads(cell.first_guess)}]
        seed = cell_seed(spec.sampling.seed, cell.stage, cell.key)
        sampler = LawSampler(surrogate, cell.key) if surrogate is not None else make_sampler(spec.sampling.sampler,
                                                                                             seed)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        # the grid is the queue itself; GP and TPE start from a first guess; random search stays random; the law
        # sampler makes its own first guess
        for point in {"grid": grid, "random": []}.get(spec.sampling.sampler if surrogate is None else "random", guess):
            self.study.enqueue_trial(point)
        self.asked = 0
        # a simulated trial's noise is its own already: only trained trials (a simulated spec's calibration's too)
        # take seeds of their own
        self.sweep_seed = spec.sampling.seed
        self.trial_seeds = own_seeds and spec.sampling.seeds == "per_trial" and self.base.objective == "train"
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
        base = self.base
        if self.trial_seeds:
            own = trial_seed(self.sweep_seed, self.stage, self.key, self.asked)
            base = dataclasses.replace(base, seed=own, order_seed=own)
        if "s" in params:
            return trial.number, dataclasses.replace(base, s=params["s"])
        return trial.number, dataclasses.replace(base, recipe={**base.recipe, self.lr_param: params["lr"]})

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
        # a sweep started before per-trial seeds existed trained every trial from the sweep's seed
        self.__dict__.update({"trial_seeds": False, **state, "study": study,
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
                 cells: list[Cell] | None = None, journal: str | None = None,
                 bases: dict[str, TrialConfig] | None = None) -> list[CellStudy]:
    """The studies of a stage's cells (``cells``: instead of the spec's, e.g. with other trial counts), kept in
    the Optuna ``journal`` file if given; with the law sampler, every search cell shares one ``LawSurrogate``.
    ``bases``: each cell's trial as given, its seed included (search/rate_sensitivity.py), instead of the spec's
    at ``recipe``."""
    cells = spec.cells(stage) if cells is None else cells
    if bases is not None:
        return [CellStudy(spec, c, bases[c.key], journal=journal, own_seeds=False) for c in cells]
    surrogate = None
    if spec.sampling.sampler == "law" and stage == "search":
        surrogate = LawSurrogate([CellGeometry.of(spec, c) for c in cells], seed=spec.sampling.seed,
                                 tolerance=spec.sampling.tolerance, branches=spec.sampling.branches,
                                 information=spec.sampling.information,
                                 deferred=spec.sampling.deferred_budgets)
    return [CellStudy(spec, c, spec.trial_config(c, c.first_guess, recipe), surrogate, journal) for c in cells]


