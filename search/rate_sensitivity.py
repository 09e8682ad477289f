"""The rate sensitivity of a sweep (``rate_sensitivity = true``): once the search is done, each search cell's best
trial (the lowest loss among those that trained) is trained again at its width and from its own seed, at its
learning rate x 1/2 and x 2 (``spec_parts.RATE_FACTORS``), one stage per factor, without warmdown branches.
The same seed (common random numbers) leaves the rate the one change from the trial it repeats;
analysis/rate_sensitivity.py fits phi at each rate and says whether the answer holds across them."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from loopscale.objectives import TrialConfig, normalize_recipe

from .space import Cell
from .spec import SweepSpec


def rate_param(spec: SweepSpec) -> str:
    """The recipe key the sensitivity scales: the calibrated one, else MuonH's and AdamW's matrix rate."""
    return spec.training.calibrate.param if spec.training.calibrate is not None else "base_lr"


def best_trials(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each search cell's trial of the lowest loss among those that trained (stage outcome results)."""
    best: dict[str, dict[str, Any]] = {}
    for result in results:
        loss = result.get("val_loss")
        if result.get("status") != "ok" or loss is None or not math.isfinite(float(loss)):
            continue
        if result["cell"] not in best or loss < best[result["cell"]]["val_loss"]:
            best[result["cell"]] = result
    return best


def rate_stage(spec: SweepSpec, results: list[dict[str, Any]], stage: str,
               factor: float) -> tuple[list[Cell], dict[str, TrialConfig]]:
    """The cells of one sensitivity stage (one trial each, at the best width) and each cell's trial: the best
    search trial's, its rate times ``factor``, no branches."""
    param = rate_param(spec)
    cells, bases = [], {}
    for key, best in sorted(best_trials(results).items()):
        trial = TrialConfig.from_params(best["trial"])
        recipe = {**trial.recipe, param: normalize_recipe(trial.recipe)[param] * factor}
        if "branch_budgets" in recipe:
            recipe["branch_budgets"] = []
        bases[key] = dataclasses.replace(trial, recipe=recipe, branch_budgets=())
        cells.append(Cell(stage, trial.budget_flops, trial.r, (trial.s,), trial.s, 1))
    return cells, bases
