"""The uncertainty of a joint-law fit: a bootstrap, block or residual, chosen by the design's cells.

* block bootstrap (Schwethelm et al. 2026, arXiv 2604.21106): resample whole (budget, r) cells with replacement
  and refit. It needs many cells: with few, a resample often loses every cell of one r or one budget, and phi,
  no longer identified, runs to its bound, which then sets the interval.
  Warmdown branch points (analysis.runs) tie cells together: a trial's own noise is in its loss and in each of
  its branch points, which lie in smaller cells, so resampling cells alone treats as independent what one
  run's noise moved together. With branch points the block bootstrap therefore also resamples the trials they
  come from (weights: a run's cell multiplicity times its trial's; a trial without branch points is left to
  its cell), a two-way bootstrap of crossed groups (Owen 2007, "The pigeonhole bootstrap"). On simulated sweeps
  with branch points (tests/benchmarks/bench_search_quality.py) the interval from cells alone covers phi less
  often than its nominal 95%, and the one from cells with their trials about as often.
* residual bootstrap (few cells): keep every run's (N, D, r) and redraw its log-loss as the fitted law plus
  resampled residuals, split in two levels because errors share a cell (common data, a cell-wide offset):
  log L* = fit + u*_cell + eps*, with u* drawn with replacement from the per-cell mean residuals and eps* from
  the within-cell residuals, each inflated by sqrt(n / (n - p)) for the degrees of freedom the fit used up
  (Davison & Hinkley 1997, ch. 6, on residual resampling of nonlinear regression). Every resample keeps the
  design, so phi stays identified whenever the data identify it.

The rule (``interval_method``): block when the expected share of block resamples that keep too few levels of
r or of budget is at most ``BLOCK_LOSS_LIMIT`` (10%); residual otherwise. Too few: under three of either
(all of them where there are fewer than three: phi needs two r's). A resample misses a set of levels holding
k of the n cells with probability (1 - k/n)^n; the share is the union bound over the sets whose loss leaves
too few. The paper's 24 cells give 0.0% (block), and so do the paper preset's 32; 9 cells of 3 budgets x 3 r
give 16% (residual): there, losing one budget leaves two.

Every resample is refitted from a few starts (the full-data optimum and the main fit's next-best distinct
minima), all resamples in one batch (``analysis.optimize``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from .fit_objective import objective
from .fit_problem import FitData, FitProblem
from .fit_types import law_of
from .optimize import BatchResult, Stop, minimize_batch
from .options import THETA, FitOptions

BLOCK_LOSS_LIMIT = 0.10  # largest expected share of block resamples keeping too few r's or budgets (docstring)
KEPT_LEVELS = 3          # levels of r and of budget a block resample must keep (all of them where fewer)
# Iterations after which a resample's start still above twice its resample's best is dropped (analysis.optimize):
# the starts other than the optimum sit in other basins of the full data, which a resample rarely prefers, and
# on their plateaus they would otherwise crawl for the optimiser's default 500 iterations.
BOOTSTRAP_PRUNE_AFTER = 50


@dataclass(frozen=True, eq=False)
class Resamples:
    """The refitted bootstrap resamples of one fit."""

    theta: np.ndarray     # (B, 6) best theta of each resample, THETA order
    stopped_early: int    # resamples whose best start hit the iteration limit
    method: str           # "block" or "residual"
    n_shared_trials: int  # trials the block bootstrap resampled with their branch points (0 for residual)


def block_loss_share(data: FitData) -> float:
    """Expected share of block-bootstrap resamples that keep fewer than ``KEPT_LEVELS`` levels of r or of
    budget, or fewer than all where there are fewer levels (union bound; module docstring).

    A resample draws n of the n cells with replacement; it misses every cell of a set of levels holding k of
    them with probability (1 - k/n)^n. Summed over the sets of levels whose loss leaves too few, for r and for
    budgets.
    """
    first = np.unique(data.cell, return_index=True)[1]
    n = first.size
    share = 0.0
    for levels in (data.r[first], data.budget[first]):
        _, counts = np.unique(levels, return_counts=True)
        lost = counts.size - min(KEPT_LEVELS, counts.size) + 1  # the fewest levels whose loss leaves too few
        share += sum((1 - sum(held) / n) ** n for held in itertools.combinations(counts, lost))
    return float(share)


def interval_method(data: FitData, options: FitOptions) -> str:
    """The bootstrap behind the intervals: ``options.interval``, or for "auto" block when at most
    ``BLOCK_LOSS_LIMIT`` of block resamples would keep too few r's or budgets, residual otherwise."""
    if options.interval != "auto":
        return options.interval
    return "block" if block_loss_share(data) <= BLOCK_LOSS_LIMIT else "residual"


def shared_trials(data: FitData) -> int:
    """How many trials have more than one run in ``data``: a trial and its warmdown branch points."""
    return int(_shared(data).sum())


def refit_resamples(problem: FitProblem, theta: np.ndarray, main: BatchResult,
                    rng: np.random.Generator) -> Resamples:
    """``options.n_bootstrap`` resamples of the problem by its ``interval_method``, each refitted; ``theta`` is the
    full-data optimum and ``main`` the main fit's batch of starts."""
    method = interval_method(problem.data, problem.options)
    n_boot = problem.options.n_bootstrap
    if n_boot == 0:
        draws, stopped = np.empty((0, len(THETA))), 0
    elif method == "block":
        draws, stopped = _refit(problem, theta, main, weights=_block_weights(problem.data, n_boot, rng))
    else:
        draws, stopped = _refit(problem, theta, main, log_l=_residual_log_l(problem, theta, n_boot, rng))
    return Resamples(theta=draws, stopped_early=stopped, method=method,
                     n_shared_trials=shared_trials(problem.data) if method == "block" else 0)


def _block_weights(data: FitData, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(B, n) multiplicity of each run in each block resample of the (budget, r) cells, and of the trials whose
    branch points share their noise (module docstring); others stay with their cell."""
    weights = _multiplicities(data.cell, n_boot, rng)
    shared = _shared(data)
    if shared.any():
        weights *= np.where(shared[data.trial], _multiplicities(data.trial, n_boot, rng), 1.0)
    return weights


def _shared(data: FitData) -> np.ndarray:
    """Per trial code, whether the trial has more than one run in ``data`` (itself and its warmdown branch
    points); empty when the runs carry no trials."""
    return np.zeros(0, bool) if data.trial is None else np.bincount(data.trial) > 1


def _multiplicities(group: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(B, n): how often each run's group (integer codes 0..G-1) is drawn in B resamples of the G groups with
    replacement."""
    n_groups = int(group.max()) + 1
    picks = rng.integers(0, n_groups, size=(n_boot, n_groups))
    counts = np.stack([np.bincount(p, minlength=n_groups) for p in picks])
    return counts[:, group].astype(float)


def _residual_log_l(problem: FitProblem, theta: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(B, n) log-losses redrawn by the two-level residual bootstrap (module docstring)."""
    data = problem.data
    fitted = np.log(np.asarray(law_of(theta).loss(data.n_once, data.n_rec, data.r, np.exp(data.log_d)),
                               dtype=float))
    residual = data.log_l - fitted
    n, n_cells = residual.size, data.n_cells
    offsets = np.bincount(data.cell, weights=residual, minlength=n_cells) / np.bincount(data.cell, minlength=n_cells)
    within = residual - offsets[data.cell]
    inflate = np.sqrt(n / max(n - problem.n_free, 1))
    offsets, within = (offsets - offsets.mean()) * inflate, within * inflate
    cell_draws = offsets[rng.integers(0, n_cells, size=(n_boot, n_cells))]
    return fitted + cell_draws[:, data.cell] + within[rng.integers(0, n, size=(n_boot, n))]


def _refit(problem: FitProblem, theta: np.ndarray, main: BatchResult, *, weights: np.ndarray | None = None,
           log_l: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Refit B resamples, given as run weights (B, n) or redrawn log-losses (B, n), from a few starts each,
    all in one batch. Returns the (B, 6) best theta of each and how many of those hit the iteration limit."""
    data, options = problem.data, problem.options
    n_boot = len(weights if weights is not None else log_l)
    seeds = _distinct_minima(theta, main, options.bootstrap_starts)
    per = len(seeds)
    starts = np.tile(seeds, (n_boot, 1))
    rows_weights = np.repeat(weights if weights is not None else np.ones((n_boot, data.n_runs)), per, axis=0)
    rows_log_l = None if log_l is None else np.repeat(log_l, per, axis=0)

    def batch(x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows_data = data if rows_log_l is None else dataclasses.replace(data, log_l=rows_log_l[rows])
        return objective(x, rows_data, rows_weights[rows], options.delta)

    result = minimize_batch(batch, starts, problem.lower, problem.upper, max_iter=options.max_iter,
                            groups=np.repeat(np.arange(n_boot), per), prune_after=BOOTSTRAP_PRUNE_AFTER)
    f = result.f.reshape(n_boot, per)
    choice = np.argmin(f, axis=1)
    flat = np.arange(n_boot) * per + choice
    return result.x[flat], int((result.stop[flat] == Stop.MAX_ITER).sum())


def _distinct_minima(theta: np.ndarray, main: BatchResult, count: int) -> np.ndarray:
    """The optimum plus up to count - 1 other end points of the main fit, best first, pairwise distinct."""
    chosen = [theta]
    for i in np.argsort(main.f):
        if len(chosen) >= count:
            break
        if all(np.abs(main.x[i] - c).max() > 1e-3 for c in chosen):
            chosen.append(main.x[i])
    return np.array(chosen)
