"""The search space of a sweep: its cells, the widths each may try, and the config of one trial.

A spec describes a grid of cells (FLOP budget C x recurrences r); in each cell the search looks for the
compute-optimal width s, and the tokens follow from the budget, ``D = C / F(s, r)`` in whole optimizer steps
(``model.tokens_for_budget``). Widths: ``width = width_unit * s`` must be a multiple of ``head_dim``, so s moves
in steps of ``head_dim / width_unit`` (2 in the paper: 64 * s rounded to 128). A cell keeps the widths that take
at least ``min_steps`` optimizer steps and, if a ``tokens_per_param`` window is given, whose D / N lies in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loopscale import objectives
from loopscale.model import account, heads_to_s, s_to_heads, tokens_for_budget
from loopscale.objectives import testing

from .toml_table import Table, require

if TYPE_CHECKING:
    from .spec import SweepSpec

STAGES = ("calibrate", "search")


@dataclass(frozen=True)
class Calibration:
    """The learning-rate calibration stage: an Optuna study over ``recipe[param]`` in [low, high] (log scale)
    at one reference cell; the best rate is written into the recipe of every search trial, whose transfer
    rule (objectives) then scales it to each width."""

    budget: float
    s: float
    r: int
    trials: int
    low: float
    high: float
    param: str


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


def cell_key(budget: float, r: int) -> str:
    """The cell's name in tags and tables, e.g. ``C=1e+18,r=4``."""
    return f"C={budget:.3g},r={r}"


def heads(s: float, spec: SweepSpec) -> int:
    """The whole number of heads nearest to width multiplier s."""
    return round(s_to_heads(s, spec.width_unit, spec.head_dim))


def s_values(spec: SweepSpec) -> tuple[float, ...]:
    """Every s in [s_min, s_max] whose width is a whole number of heads."""
    lo, hi = heads(spec.s_min, spec), heads(spec.s_max, spec)
    return tuple(heads_to_s(h, spec.width_unit, spec.head_dim) for h in range(lo, hi + 1))


def cells(spec: SweepSpec, stage: str = "search") -> list[Cell]:
    """The cells of a stage in a fixed order (budget, then r); calibration has one cell."""
    if stage == "calibrate":
        c = spec.calibrate
        if c is None:
            return []
        return [Cell("calibrate", c.budget, c.r, (c.s,), c.s, c.trials)]
    return [search_cell(spec, budget, r) for budget in spec.budgets for r in spec.recurrences]


def search_cell(spec: SweepSpec, budget: float, r: int) -> Cell:
    """The widths of cell (budget, r) that train at least ``min_steps`` steps inside the tokens-per-parameter
    window; the first guess is the one closest (in log) to ``first_guess_tokens_per_param``."""
    feasible: dict[float, float] = {}  # s -> tokens per parameter
    for s in s_values(spec):
        config = spec.model(s, r)
        tokens = tokens_for_budget(config, budget, spec.batch_tokens)
        if tokens // spec.batch_tokens < spec.min_steps:
            require(s > spec.s_min, f"budget {budget:.3g} FLOPs buys fewer than min_steps={spec.min_steps} "
                                    f"optimizer steps of {spec.batch_tokens} tokens even at the narrowest "
                                    f"width (s={s:g}, r={r}); raise the budget or lower batch_tokens")
            break  # wider models only cost more per token
        tpp = tokens / account(config).N
        if spec.tokens_per_param is None or spec.tokens_per_param[0] <= tpp <= spec.tokens_per_param[1]:
            feasible[s] = tpp
    require(bool(feasible), f"no width in [widths] puts budget {budget:.3g} FLOPs (r={r}) inside "
                            f"tokens_per_param {list(spec.tokens_per_param or ())}; widen [widths]")
    target = math.log(spec.first_guess_tokens_per_param)
    guess = min(feasible, key=lambda s: abs(math.log(feasible[s]) - target))
    return Cell("search", budget, r, tuple(feasible), guess, min(spec.trials_per_cell, len(feasible)))


def spread(n: int, k: int) -> list[float]:
    """k indices spread evenly over 0..n-1 (the grid sampler's widths in a cell)."""
    return [0.0] if k == 1 else [i * (n - 1) / (k - 1) for i in range(k)]


def trial_config(spec: SweepSpec, cell: Cell, s: float,
                 recipe: dict[str, Any] | None = None) -> objectives.TrialConfig:
    """The trial (objectives/trial.py) of width s in ``cell``, checked once, here; ``recipe`` overrides the
    spec's."""
    objective = "train" if cell.stage == "calibrate" else spec.objective
    common = {"budget_flops": float(cell.budget), "r": cell.r, "s": float(s), "template": spec.model_template(),
              "batch_tokens": spec.batch_tokens, "seed": spec.seed, "objective": objective}
    if objective == "simulate":
        return objectives.TrialConfig(**common, noise=spec.noise, cell_noise=spec.cell_noise, misspec=spec.misspec,
                                      law=dict(spec.law) if spec.law else None,
                                      testing=testing.trial_aids(spec.testing, cell.key) or None)
    return objectives.TrialConfig(**common, data=spec.data, recipe=dict(recipe if recipe is not None else spec.recipe),
                                  device="cuda" if spec.gpus_per_trial > 0 else "cpu",
                                  num_threads=max(1, int(spec.cpus_per_trial)), cache_dir=spec.cache_dir,
                                  val_tokens=spec.val_tokens)


def parse_calibration(table: dict[str, Any], spec: SweepSpec) -> Calibration | None:
    """``[calibrate]``: the calibration stage (it always trains: a simulated trial has no learning rate), or
    None."""
    if not table:
        return None
    t = Table(table, "[calibrate]", ("budget", "s", "r", "trials", "low", "high", "param"))
    cal = Calibration(budget=float(t.number("budget", required=True)), s=float(t.number("s", required=True)),
                      r=t.int("r", default=1), trials=t.int("trials", default=6),
                      low=float(t.number("low", required=True)), high=float(t.number("high", required=True)),
                      param=t.str("param", default="base_lr"))
    require(0 < cal.low < cal.high, f"[calibrate] needs 0 < low < high, got low={cal.low}, high={cal.high}")
    require(cal.trials >= 1, "[calibrate] trials must be >= 1")
    require(cal.budget > 0, "[calibrate] budget must be positive")
    require(cal.param in objectives.RECIPE_DEFAULTS,
            f"[calibrate] param {cal.param!r} is not a recipe key ({', '.join(objectives.RECIPE_DEFAULTS)})")
    require(abs(s_to_heads(cal.s, spec.width_unit, spec.head_dim) - heads(cal.s, spec)) < 1e-9,
            f"[calibrate] s = {cal.s:g} is not a whole number of heads; use s in steps of {spec.s_step:g}")
    config = spec.model(cal.s, cal.r)
    steps = tokens_for_budget(config, cal.budget, spec.batch_tokens) // spec.batch_tokens
    require(steps >= spec.min_steps, f"[calibrate] budget {cal.budget:.3g} FLOPs buys {steps} optimizer steps at "
                                     f"s={cal.s:g}, fewer than min_steps={spec.min_steps}")
    return cal
