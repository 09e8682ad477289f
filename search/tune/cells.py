"""The trials of a stage's cells as Tune's searcher protocol sees them, without Ray: which cell's study the next
free slot asks (``search/dispatch.py``), the trials each cell has running, the warmdown branches they carry, and
what a finished trial tells its study. ``searcher.CellSearcher`` hands Tune's calls to it; the law sampler's
tests and the search-quality benchmark drive it directly.

With the law sampler, while trials run, a cell whose next trial would be a guess that their results may settle
leaves the slot to the others, or idle (``LawSurrogate.holds_back``): more slots then buy time, not FLOPs. A cell
that is not open now (located, or at its cap) may reopen when a running trial of it finishes with a result that
unsettles it, so the stage is finished only once no trial runs. The config of a trial is
``{"trial": <TrialConfig.to_params()>, "meta": {stage, cell, searched, cell_widths, trial_key}}`` (``searched``:
the dotted key the study chose); the key ``<stage>/<cell>/<n>`` numbers the cell's proposals, so it survives a
restore together with the pickled state.

Order: every proposal reads what the studies (and the law sampler's one fit across cells) have been told so far,
so with several slots a sweep whose trials finish in another order (another machine's speeds) proposes other
widths. With ``rounds`` (the spec's ``rounds = true``) a finished trial's result is held until every running
trial has ended; then the round's results are told in a fixed order (by cell, then the cell's proposal number)
and the next round is proposed from them alone, so the same spec and seed give the same trials however the
trials' durations fall, as long as Tune fills a round's free slots before one of its trials ends (it asks the
searcher for every free slot in one step of its loop). One slot is one trial per round: rounds change nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna

from loopscale.objectives import TrialConfig, testing
from loopscale.objectives.trial import recorded_branches

from .. import space
from ..dispatch import CellState, next_cell
from .metric import METRIC
from .studies import CellStudy

FINISHED = "FINISHED"  # what ``suggest`` returns once the stage takes no more trials (Tune's Searcher.FINISHED)


class CellTrials:
    """Every cell of a stage: ``suggest`` a trial for a free slot, ``on_trial_complete`` with its result."""

    def __init__(self, studies: list[CellStudy], rounds: bool = False):
        self._studies = {s.key: s for s in studies}
        self._running: dict[str, dict[str, int]] = {s.key: {} for s in studies}  # cell -> trial_id -> number
        self._branches: dict[str, list[tuple[str, int]]] = {}  # trial_id -> (cell, heads) of its branches
        self._held = False  # every open cell held back; Tune asks again each step, and only a result changes that
        self._rounds = rounds
        self._ended: dict[str, tuple[dict | None, bool]] = {}  # a round's ended trials, held until it ends

    @property
    def stage(self) -> str | None:
        return next((s.stage for s in self._studies.values()), None)

    def suggest(self, trial_id: str) -> dict | str | None:
        """The config of the next trial, None while no cell may take the slot now, or ``FINISHED``."""
        for study in self._studies.values():  # a restored searcher: its studies replace the journal's first
            study.attach()
        running = any(self._running.values())
        if self._ended:  # a round with trials still running: the next round waits for all of its results
            return None
        if not any(s.open() for s in self._studies.values()):
            return None if running else FINISHED
        if running and self._held:
            return None
        key = next_cell([self._state(k, running) for k in self._studies])
        if key is None:
            self._held = True  # (finding out asks every open cell's law again)
            return None
        study = self._studies[key]
        number, trial = study.ask()
        self._running[key][trial_id] = number
        if study.surrogate is not None:
            trial = self._branch(study, trial_id, study.heads_of(number), trial)
        testing.proposed(trial)  # (a test aid: journals the proposal where a test orders the trials' ends)
        searched = f"recipe.{study.lr_param}" if study.lr_param else "s"
        return {"trial": trial.to_params(), "meta": {"stage": study.stage, "cell": key, "searched": searched,
                                         "cell_widths": study.widths,
                                         "trial_key": f"{study.stage}/{key}/{study.asked}"}}

    def _state(self, key: str, running: bool) -> CellState:
        """What the dispatch rule reads of the cell; the law's waits and holds-back only where they can matter
        (an open cell; holding back only while trials run)."""
        study = self._studies[key]
        is_open = study.open()
        law = is_open and study.surrogate is not None
        return CellState(key, study.budget, len(self._running[key]), study.asked, is_open,
                         waits=law and study.surrogate.waits(key),
                         holds_back=law and running and self._holds_back(key))

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
        if not self._rounds:
            self._tell(trial_id, result, error)
            return
        self._ended[trial_id] = (result, error)
        if any(t not in self._ended for running in self._running.values() for t in running):
            return
        number = {t: (key, n) for key, running in self._running.items() for t, n in running.items()}
        ended, self._ended = self._ended, {}
        for t in sorted(ended, key=lambda t: number.get(t, ("", -1))):  # a fixed order: cell, then proposal
            self._tell(t, *ended[t])

    def _tell(self, trial_id: str, result: dict | None, error: bool) -> None:
        """The trial's result (None or an error: failed) to its cell's study and the law sampler."""
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

    def studies(self) -> dict[str, optuna.Study]:
        return {k: s.study for k, s in self._studies.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a restored stage asks its cells afresh; a searcher pickled before rounds existed proposed without them
        self.__dict__.update({"_rounds": False, "_ended": {}, **state, "_held": False})
