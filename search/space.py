"""The search space of a sweep: its cells and the widths each may try (the grid: search/spec_parts.py).

A spec describes a grid of cells (FLOP budget C x recurrences r); in each cell the search looks for the
compute-optimal width s, and the tokens follow from the budget, ``D = C / F(s, r)`` in whole optimizer steps
(``model.tokens_for_budget``). Widths: ``width = width_unit * s`` must be a multiple of ``head_dim``, so s moves
in steps of ``head_dim / width_unit`` (2 in the paper: 64 * s rounded to 128). A cell keeps the widths that take
at least ``min_steps`` optimizer steps and, if a ``tokens_per_param`` window is given, whose D / N lies in it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from loopscale.model import account, tokens_for_budget

from .spec_parts import Calibration, Grid, cell_key
from .toml_table import require

STAGES = ("calibrate", "search")


@dataclass(frozen=True)
class Cell:
    """One (budget, r) cell of a stage: the widths it may try and how many trials it gets."""

    stage: str
    budget: float
    r: int
    widths: tuple[float, ...]  # feasible s, ascending, one per width (head_dim apart)
    first_guess: float
    n_trials: int

    @property
    def key(self) -> str:
        return cell_key(self.budget, self.r)


def cells(grid: Grid, trials_per_cell: int, calibrate: Calibration | None, stage: str = "search") -> list[Cell]:
    """The cells of a stage in a fixed order (budget, then r); calibration has one cell."""
    if stage == "calibrate":
        c = calibrate
        if c is None:
            return []
        return [Cell("calibrate", c.budget, c.r, (c.s,), c.s, c.trials)]
    return [search_cell(grid, trials_per_cell, budget, r) for budget in grid.budgets for r in grid.recurrences]


def search_cell(grid: Grid, trials_per_cell: int, budget: float, r: int) -> Cell:
    """The widths of cell (budget, r) that train at least ``min_steps`` steps inside the tokens-per-parameter
    window; the first guess is the one closest (in log) to ``first_guess_tokens_per_param``."""
    feasible: dict[float, float] = {}  # s -> tokens per parameter
    for s in grid.s_values():
        config = grid.model(s, r)
        tokens = tokens_for_budget(config, budget, grid.batch_tokens)
        if tokens // grid.batch_tokens < grid.min_steps:
            require(s > grid.s_min, f"budget {budget:.3g} FLOPs buys fewer than min_steps={grid.min_steps} "
                                    f"optimizer steps of {grid.batch_tokens} tokens even at the narrowest "
                                    f"width (s={s:g}, r={r}); raise the budget or lower batch_tokens")
            break  # wider models only cost more per token
        tpp = tokens / account(config).N
        if grid.tokens_per_param is None or grid.tokens_per_param[0] <= tpp <= grid.tokens_per_param[1]:
            feasible[s] = tpp
    require(bool(feasible), f"no width in [widths] puts budget {budget:.3g} FLOPs (r={r}) inside "
                            f"tokens_per_param {list(grid.tokens_per_param or ())}; widen [widths]")
    target = math.log(grid.first_guess_tokens_per_param)
    guess = min(feasible, key=lambda s: abs(math.log(feasible[s]) - target))
    return Cell("search", budget, r, tuple(feasible), guess, min(trials_per_cell, len(feasible)))


def rung_cells(grid: Grid, budgets: tuple[float, ...]) -> list[Cell]:
    """The validation rungs as the plan prices them before any law is fitted: a trial per (rung budget, r) at the
    widths of that budget, its first guess by ``first_guess_tokens_per_param`` (its width comes from the law the
    sweep will fit: search/validate.py)."""
    return [dataclasses.replace(search_cell(grid, 1, budget, r), stage="validate") for budget in budgets
            for r in grid.recurrences]


def rate_cells(grid: Grid, stage: str) -> list[Cell]:
    """A rate-sensitivity stage as the plan prices it before the search: a trial per search cell at the widths
    of that cell, its first guess by ``first_guess_tokens_per_param`` (the search picks its width:
    search/rate_sensitivity.py)."""
    return [dataclasses.replace(search_cell(grid, 1, budget, r), stage=stage) for budget in grid.budgets
            for r in grid.recurrences]


def spread(n: int, k: int) -> list[float]:
    """k indices spread evenly over 0..n-1 (the grid sampler's widths in a cell)."""
    return [0.0] if k == 1 else [i * (n - 1) / (k - 1) for i in range(k)]
