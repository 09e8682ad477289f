"""The Tune searcher of a stage: Tune's calls on the driver handed to the stage's ``cells.CellTrials``, and its
pickled state (Tune's snapshot of the searcher, restored on ``--resume`` with every study, its sampler RNG and
its pending trials)."""

from __future__ import annotations

import pickle
from typing import Any

import optuna
from ray.tune.search import Searcher

from . import live
from .cells import FINISHED, CellTrials
from .studies import CellStudy


class CellSearcher(Searcher):
    """One Tune searcher over every cell of a stage (``cells.CellTrials``)."""

    def __init__(self, studies: list[CellStudy], rounds: bool = False):
        super().__init__(metric=None, mode=None)  # no Tune-level metric: progress reports carry no val_loss
        self.trials = CellTrials(studies, rounds)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True

    def suggest(self, trial_id: str) -> dict | None:
        if self.trials.stage is not None:
            live.SEARCHERS[self.trials.stage] = self.trials
        suggested = self.trials.suggest(trial_id)
        return Searcher.FINISHED if suggested == FINISHED else suggested

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.trials.on_trial_complete(trial_id, result, error)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))

    def studies(self) -> dict[str, optuna.Study]:
        return self.trials.studies()
