"""Fitting the iso-depth joint law with phi, the paper's way (Schwethelm et al. 2026; PAPER.md,
"The law and how it is fitted").

The law (``model.law``)::

    L = E + A * N_eff^(-alpha) + B * D^(-beta),   N_eff = N_once + r^phi * N_rec

is fitted in log-sum-exp form, with A = e^a, B = e^b, E = e^e::

    log L_hat = LSE(a - alpha * log N_eff,  b - beta * log D,  e)

minimising the Huber loss (delta = 1e-3) of ``log L_hat - log L`` SUMMED over runs (a mean makes the gradient
tiny and L-BFGS stops early, the flaw Besiroglu et al. 2024 found in Chinchilla's fit). Bounds (paper):
a, b in [-5, 35]; alpha, beta in [0, 2.5]; e in [-3, 2]; phi in [-3, 3]. Best of many random starts; the
uncertainty is a bootstrap, chosen by the design's cells (``interval_method``):

* block bootstrap (the paper's): resample whole (budget, r) cells with replacement and refit. It needs many
  cells: with few, a resample often loses every cell of one r or one budget, and phi, no longer identified,
  runs to its bound (a 9-cell demo put 12 of 200 resamples on phi = -3 and reported a CI of -3 to 0.9).
  Warmdown branch points (analysis.runs) tie cells together: a trial's own noise is in its loss and in each of
  its branch points, which lie in smaller cells, so resampling cells alone treats as independent what one
  run's noise moved together. With branch points the block bootstrap therefore also resamples the trials they
  come from (weights: a run's cell multiplicity times its trial's; a trial without branch points is left to
  its cell), a two-way bootstrap of crossed groups (Owen 2007, "The pigeonhole bootstrap"). Measured on the
  simulated paper replay swept by the law sampler (tests/benchmarks/bench_search_quality.py, seeds 100-179,
  phi's error sd 0.027): the 95% interval covered phi in 82.5% of seeds with cells alone (median width 0.076),
  in 93.8% with their trials (0.112; 99% on seeds 180-259); the residual bootstrap below, in 91.3% (0.091).
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
give 16% (residual): there, losing one budget leaves two, and the demo's phi ran to its bound.

All starts and all bootstrap resamples run as one batch (``analysis.optimize``) on the analytic gradient
(``objective``); the best start is then polished by scipy's L-BFGS-B. The returned ``LawFit`` says whether the
optimum is trustworthy: ``status`` is STOPPED_EARLY when the projected gradient at the answer is still large,
AT_BOUND when a free parameter sits on its bound.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from loopscale.model import JointLaw

from .frontier import pareto_frontier
from .identify import phi_problems
from .isoflop import cell_optima
from .optimize import BatchResult, Stop, minimize_batch
from .options import DEFAULT_FIT_OPTIONS, THETA, Bounds, FitOptions
from .runs import usable_runs

# The public constants, in this order; the internal order of theta is options.THETA.
CONSTANTS = ("E", "A", "alpha", "B", "beta", "phi")
BLOCK_LOSS_LIMIT = 0.10  # largest expected share of block resamples keeping too few r's or budgets (docstring)
KEPT_LEVELS = 3          # levels of r and of budget a block resample must keep (all of them where fewer)


class FitStatus(enum.Enum):
    CONVERGED = "converged"
    AT_BOUND = "at_bound"            # a free parameter sits on its bound: the optimum may lie outside
    STOPPED_EARLY = "stopped_early"  # the projected gradient at the answer is not small
    UNIDENTIFIED = "unidentified"    # converged, but the data do not determine phi (analysis.identify)


@dataclass(frozen=True, eq=False)
class LawFit:
    """A fitted joint law with its diagnostics. ``ci`` holds the bootstrap percentile interval of every constant;
    ``interval`` says which bootstrap made it ("block" or "residual")."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    phi: float
    phi_ci: tuple[float, float]
    ci: dict[str, tuple[float, float]]
    r2: float                        # 1 - SS_res / SS_tot of the loss in nats over the fitted rows
    rmse: float                      # nats
    rmse_per_r: dict[int, float]
    max_residual: float              # largest |L - L_hat|, nats
    huber: float                     # the minimised objective
    status: FitStatus
    message: str
    at_bound: tuple[str, ...]
    fixed_phi: float | None
    data: str
    n_runs: int
    n_cells: int
    n_shared_trials: int             # trials whose branch points the block bootstrap resampled with them
    n_starts: int
    n_starts_at_best: int            # starts that ended at the best objective: evidence of a global optimum
    n_bootstrap: int
    interval: str
    bootstrap_stopped_early: int
    confidence: float
    bootstrap: np.ndarray = field(repr=False)  # (n_bootstrap, 6) in CONSTANTS order
    warnings: tuple[str, ...] = ()   # why phi is not identified (status UNIDENTIFIED)

    @property
    def law(self) -> JointLaw:
        return JointLaw(E=self.E, A=self.A, alpha=self.alpha, B=self.B, beta=self.beta, phi=self.phi)

    def predict(self, runs: pd.DataFrame) -> np.ndarray:
        """Predicted loss (nats) of each row of a runs table."""
        return np.asarray(self.law.loss(runs["N_once"].to_numpy(float), runs["N_rec"].to_numpy(float),
                                        runs["r"].to_numpy(float), runs["tokens"].to_numpy(float)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the bootstrap draws are summarised by ``ci``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "bootstrap"}
        out["status"] = self.status.value
        out["phi_ci"] = list(self.phi_ci)
        out["ci"] = {k: list(v) for k, v in self.ci.items()}
        out["rmse_per_r"] = {str(k): v for k, v in self.rmse_per_r.items()}
        out["at_bound"] = list(self.at_bound)
        out["warnings"] = list(self.warnings)
        return out


@dataclass(frozen=True)
class FitData:
    """The arrays a fit works on, one entry per run."""

    r: np.ndarray
    n_once: np.ndarray
    n_rec: np.ndarray
    log_d: np.ndarray
    log_l: np.ndarray
    cell: np.ndarray   # integer code of the run's (budget, r) cell
    budget: np.ndarray
    trial: np.ndarray | None = None  # integer code of the trial a run comes from (a branch point: its trial's)

    @classmethod
    def from_runs(cls, runs: pd.DataFrame) -> "FitData":
        cells = runs.groupby(["budget_flops", "r"], sort=True).ngroup().to_numpy()
        trial = None
        if "run_id" in runs and "branch_of" in runs:
            trial = pd.factorize(runs["branch_of"].where(runs["branch_of"] != "", runs["run_id"]).astype(str))[0]
        return cls(r=runs["r"].to_numpy(float), n_once=runs["N_once"].to_numpy(float),
                   n_rec=runs["N_rec"].to_numpy(float), log_d=np.log(runs["tokens"].to_numpy(float)),
                   log_l=np.log(runs["val_loss"].to_numpy(float)), cell=cells,
                   budget=runs["budget_flops"].to_numpy(float), trial=trial)

    @property
    def n_cells(self) -> int:
        return int(self.cell.max()) + 1


def objective(theta: np.ndarray, data: FitData, weights: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Weighted summed Huber loss of the log-sum-exp law and its analytic gradient, for K parameter sets.

    theta (K, 6) in THETA order, weights (K, n) (ones, or bootstrap multiplicities). Returns f (K,), grad (K, 6).
    With t1 = a - alpha log N_eff, t2 = b - beta log D, t3 = e, softmax weights w_i = exp(t_i - LSE) and
    psi = clip(residual, -delta, delta) (the Huber derivative):
    df/da = sum psi w1, df/dalpha = -sum psi w1 log N_eff, df/db = sum psi w2, df/dbeta = -sum psi w2 log D,
    df/de = sum psi w3, df/dphi = -alpha sum psi w1 r^phi log(r) N_rec / N_eff.
    """
    a, alpha, b, beta, e, phi = (col[:, None] for col in theta.T)  # each (K, 1)
    log_r = np.log(data.r)
    r_phi = np.exp(phi * log_r)
    n_eff = data.n_once + r_phi * data.n_rec
    log_n_eff = np.log(n_eff)
    t1 = a - alpha * log_n_eff
    t2 = b - beta * data.log_d
    t3 = np.broadcast_to(e, t1.shape)
    top = np.maximum(np.maximum(t1, t2), t3)  # shift for a stable log-sum-exp
    e1, e2, e3 = np.exp(t1 - top), np.exp(t2 - top), np.exp(t3 - top)
    total = e1 + e2 + e3
    residual = top + np.log(total) - data.log_l
    size = np.abs(residual)
    huber = np.where(size <= delta, 0.5 * residual * residual, delta * (size - 0.5 * delta))
    f = (weights * huber).sum(axis=1)
    psi = weights * np.clip(residual, -delta, delta) / total
    p1, p2, p3 = psi * e1, psi * e2, psi * e3
    dlog_neff_dphi = r_phi * log_r * data.n_rec / n_eff
    grad = np.stack([p1.sum(1), -(p1 * log_n_eff).sum(1), p2.sum(1), -(p2 * data.log_d).sum(1), p3.sum(1),
                     -(alpha[:, 0] * (p1 * dlog_neff_dphi).sum(1))], axis=1)
    return f, grad


def fit_joint_law(runs: pd.DataFrame, *, options: FitOptions = DEFAULT_FIT_OPTIONS, **overrides: Any) -> LawFit:
    """Fit the joint law to a runs table (``analysis.load_runs``); keyword overrides replace ``options`` fields.

    Only rows with status "ok" (and of ``options.stage``) are fitted; ``options.data`` picks all of them, the
    per-r Pareto frontier or the per-cell IsoFLOP optima.
    """
    options = with_overrides(options, overrides)
    table = fit_rows(runs, options)
    data = FitData.from_runs(table)
    lower, upper = options.bounds.arrays()
    if options.fix_phi is not None:
        lower[5] = upper[5] = options.fix_phi
    n_free = int((upper > lower).sum())
    if len(table) <= n_free:
        raise ValueError(f"{len(table)} runs cannot determine {n_free} free parameters")
    if upper[5] > lower[5] and np.unique(data.r).size < 2:
        raise ValueError("phi is not identifiable from runs with a single r; fix it (fix_phi)")

    rng = np.random.default_rng(options.seed)
    ones = np.ones((1, len(table)))
    starts = lower + (upper - lower) * rng.random((options.n_starts, len(THETA)))
    main = minimize_batch(lambda x, rows: objective(x, data, np.broadcast_to(ones, (len(rows), ones.shape[1])),
                                                     options.delta),
                          starts, lower, upper, max_iter=options.max_iter)
    best = int(np.argmin(main.f))
    theta, f_best = _polish(main.x[best], main.f[best], data, lower, upper, options)
    at_best = int((main.f <= f_best * (1 + 1e-6) + 1e-12).sum())

    method = interval_method(data, options)
    bootstrap = _block_bootstrap if method == "block" else _residual_bootstrap
    draws, boot_stopped = bootstrap(theta, main, data, lower, upper, options, rng)
    return _summarise(theta, f_best, table, data, lower, upper, options, at_best, draws, boot_stopped,
                      main.stop[best], method)


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


def refit(data: FitData, previous: np.ndarray | None, *, n_starts: int = 4, seed: int = 0, max_iter: int = 300,
          options: FitOptions = DEFAULT_FIT_OPTIONS) -> tuple[np.ndarray, float]:
    """A cheap refit for a search that refits after every trial: (theta in THETA order, objective).

    Warm start: the previous optimum (None before the first fit) plus ``n_starts`` seeded random starts in
    the bounds, all in one ``minimize_batch`` call with pruning, and no bootstrap and no polish. One more run
    moves the optimum a little, so the previous optimum is usually where the best end lies; the random
    starts let the fit leave it when the new data have moved the optimum to another basin. (The full fit,
    ``fit_joint_law``, is what analysis reports.) ``max_iter`` bounds the iterations per start, and so the
    time of a refit.
    """
    lower, upper = options.bounds.arrays()
    if options.fix_phi is not None:
        lower[5] = upper[5] = options.fix_phi
    rng = np.random.default_rng(seed)
    starts = lower + (upper - lower) * rng.random((n_starts, len(THETA)))
    if previous is not None:
        starts = np.vstack([np.clip(previous, lower, upper), starts])
    ones = np.ones((1, data.r.size))
    result = minimize_batch(lambda x, rows: objective(x, data, np.broadcast_to(ones, (len(rows), data.r.size)),
                                                       options.delta),
                            starts, lower, upper, max_iter=max_iter, prune_after=50)
    best = int(np.argmin(result.f))
    return result.x[best], float(result.f[best])


def with_overrides(options: FitOptions, overrides: dict[str, Any]) -> FitOptions:
    """``options`` with some fields replaced; an unknown field is a ValueError."""
    try:
        return dataclasses.replace(options, **overrides)
    except TypeError as err:
        raise ValueError(f"unknown fit option: {err}") from None


CONTENT_ORDER = ("budget_flops", "r", "N_once", "N_rec", "tokens", "val_loss")  # what a fitted row is


def fit_rows(runs: pd.DataFrame, options: FitOptions) -> pd.DataFrame:
    """The rows a fit uses: usable runs, or their per-r frontier, or their per-cell optima as pseudo-runs."""
    table = usable_runs(runs, stage=options.stage)
    if table.empty:
        raise ValueError("no usable runs to fit (none with status 'ok'"
                         + (f" in stage {options.stage!r})" if options.stage else ")"))
    if options.data == "frontier":
        table = pareto_frontier(table, per_r=True, overall=False, stage=None)
    elif options.data == "optima":
        optima = cell_optima(table, stage=None, n_bootstrap=0).table
        if optima.empty or not (optima["status"] == "ok").any():
            raise ValueError("no (budget, r) cell has an interior IsoFLOP optimum to fit")
        optima = optima[optima["status"] == "ok"]
        table = pd.DataFrame({"r": optima["r"], "budget_flops": optima["budget_flops"],
                              "N_once": optima["N_once_opt"], "N_rec": optima["N_rec_opt"],
                              "tokens": optima["D_opt"], "val_loss": optima["L_opt"]})
    # rows in an order of their content, not of the store's (MLflow returns runs in an order that differs between
    # two sweeps of the same trials): the seeded bootstrap then draws the same resamples from the same runs
    return table.sort_values(list(CONTENT_ORDER), kind="mergesort").reset_index(drop=True)


def _polish(theta: np.ndarray, f: float, data: FitData, lower: np.ndarray, upper: np.ndarray,
            options: FitOptions) -> tuple[np.ndarray, float]:
    """scipy's L-BFGS-B from the best batched start; keep whichever point is lower."""
    ones = np.ones((1, data.r.size))

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = objective(x[None], data, ones, options.delta)
        return float(value[0]), grad[0]

    result = minimize(fun, theta, jac=True, method="L-BFGS-B", bounds=list(zip(lower, upper)),
                      options={"maxiter": options.max_iter, "ftol": 1e-15, "gtol": 1e-12})
    if np.isfinite(result.fun) and result.fun < f:
        return np.asarray(result.x), float(result.fun)
    return theta, float(f)


def _block_bootstrap(theta: np.ndarray, main: BatchResult, data: FitData, lower: np.ndarray, upper: np.ndarray,
                     options: FitOptions, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Block bootstrap over (budget, r) cells: B resamples x a few starts, all in one batch.

    Returns the (B, 6) best theta of each resample and how many of those stopped at the iteration limit.
    """
    n_boot = options.n_bootstrap
    if n_boot == 0:
        return np.empty((0, len(THETA))), 0
    weights = _multiplicities(data.cell, n_boot, rng)  # (B, n) multiplicity of each run in each resample
    shared = _shared(data)
    if shared.any():
        # and of the trials whose branch points share their noise (module docstring); others stay with their cell
        weights *= np.where(shared[data.trial], _multiplicities(data.trial, n_boot, rng), 1.0)
    return _refit(theta, main, data, lower, upper, options, weights=weights)


def _shared(data: FitData) -> np.ndarray:
    """Per trial code, whether the trial has more than one run in ``data`` (itself and its warmdown branch
    points); empty when the runs carry no trials."""
    return np.zeros(0, bool) if data.trial is None else np.bincount(data.trial) > 1


def shared_trials(data: FitData) -> int:
    """How many trials have more than one run in ``data``: a trial and its warmdown branch points."""
    return int(_shared(data).sum())


def _multiplicities(group: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(B, n): how often each run's group (integer codes 0..G-1) is drawn in B resamples of the G groups with
    replacement."""
    n_groups = int(group.max()) + 1
    picks = rng.integers(0, n_groups, size=(n_boot, n_groups))
    counts = np.stack([np.bincount(p, minlength=n_groups) for p in picks])
    return counts[:, group].astype(float)


def _residual_bootstrap(theta: np.ndarray, main: BatchResult, data: FitData, lower: np.ndarray,
                        upper: np.ndarray, options: FitOptions, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Two-level residual bootstrap (module docstring): B redrawn log-losses on the same runs, refitted."""
    n_boot = options.n_bootstrap
    if n_boot == 0:
        return np.empty((0, len(THETA))), 0
    fitted = np.log(np.asarray(JointLaw(**dict(zip(CONSTANTS, _constants(theta[None])[0]))).loss(
        data.n_once, data.n_rec, data.r, np.exp(data.log_d)), dtype=float))
    residual = data.log_l - fitted
    n, n_cells = residual.size, data.n_cells
    n_free = int((upper > lower).sum())
    offsets = np.bincount(data.cell, weights=residual, minlength=n_cells) / np.bincount(data.cell, minlength=n_cells)
    within = residual - offsets[data.cell]
    inflate = np.sqrt(n / max(n - n_free, 1))
    offsets, within = (offsets - offsets.mean()) * inflate, within * inflate
    cell_draws = offsets[rng.integers(0, n_cells, size=(n_boot, n_cells))]
    redrawn = fitted + cell_draws[:, data.cell] + within[rng.integers(0, n, size=(n_boot, n))]
    return _refit(theta, main, data, lower, upper, options, log_l=redrawn)


def _refit(theta: np.ndarray, main: BatchResult, data: FitData, lower: np.ndarray, upper: np.ndarray,
           options: FitOptions, *, weights: np.ndarray | None = None,
           log_l: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Refit B resamples, given as run weights (B, n) or redrawn log-losses (B, n), from a few starts each,
    all in one batch. Returns the (B, 6) best theta of each and how many of those hit the iteration limit."""
    n_boot = len(weights if weights is not None else log_l)
    seeds = _distinct_minima(theta, main, options.bootstrap_starts)
    per = len(seeds)
    starts = np.tile(seeds, (n_boot, 1))
    rows_weights = np.repeat(weights if weights is not None else np.ones((n_boot, data.r.size)), per, axis=0)
    rows_log_l = None if log_l is None else np.repeat(log_l, per, axis=0)

    def batch(x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows_data = data if rows_log_l is None else dataclasses.replace(data, log_l=rows_log_l[rows])
        return objective(x, rows_data, rows_weights[rows], options.delta)

    result = minimize_batch(batch, starts, lower, upper, max_iter=options.max_iter,
                            groups=np.repeat(np.arange(n_boot), per))
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


def _summarise(theta: np.ndarray, f_best: float, table: pd.DataFrame, data: FitData, lower: np.ndarray,
               upper: np.ndarray, options: FitOptions, at_best: int, draws: np.ndarray, boot_stopped: int,
               best_stop: int, method: str) -> LawFit:
    constants = _constants(theta[None])[0]
    law = JointLaw(**dict(zip(CONSTANTS, constants)))
    observed = np.exp(data.log_l)
    predicted = np.asarray(law.loss(data.n_once, data.n_rec, data.r, np.exp(data.log_d)))
    error = observed - predicted
    r2 = 1.0 - float((error ** 2).sum() / ((observed - observed.mean()) ** 2).sum())
    rmse_per_r = {int(r): float(np.sqrt(np.mean(error[data.r == r] ** 2))) for r in np.unique(data.r)}

    free = upper > lower
    width = np.where(free, upper - lower, 1.0)
    near = free & ((theta - lower <= 1e-6 * width) | (upper - theta <= 1e-6 * width))
    at_bound = tuple(THETA[i] for i in np.flatnonzero(near))
    _, grad = objective(theta[None], data, np.ones((1, data.r.size)), options.delta)
    grad = grad[0] * (free & ~near)
    projected = float(np.abs(grad).max())
    # The gradient of the summed Huber loss scales as n * delta; 1e-6 of that is a converged fit.
    tolerance = 1e-6 * data.r.size * options.delta
    if projected > tolerance:
        status = FitStatus.STOPPED_EARLY
        message = (f"projected gradient {projected:.2e} > {tolerance:.1e} "
                   f"(best start stopped: {Stop(best_stop).name.lower()})")
    elif at_bound:
        status = FitStatus.AT_BOUND
        message = f"{', '.join(at_bound)} at a bound of {options.bounds}"
    else:
        status = FitStatus.CONVERGED
        message = f"projected gradient {projected:.1e}; {at_best}/{options.n_starts} starts reached the optimum"

    boot = _constants(draws)
    tail = 100 * (1 - options.confidence) / 2
    if len(boot):
        lo, hi = np.percentile(boot, [tail, 100 - tail], axis=0)
    else:
        lo = hi = np.full(len(CONSTANTS), np.nan)
    ci = {name: (float(lo[i]), float(hi[i])) for i, name in enumerate(CONSTANTS)}
    return LawFit(**dict(zip(CONSTANTS, map(float, constants))), phi_ci=ci["phi"], ci=ci, r2=r2,
                  rmse=float(np.sqrt(np.mean(error ** 2))), rmse_per_r=rmse_per_r,
                  max_residual=float(np.abs(error).max()), huber=f_best, status=status, message=message,
                  at_bound=at_bound, fixed_phi=options.fix_phi, data=options.data, n_runs=len(table),
                  n_cells=data.n_cells, n_shared_trials=shared_trials(data) if method == "block" else 0,
                  n_starts=options.n_starts, n_starts_at_best=at_best,
                  n_bootstrap=len(boot), interval=method, bootstrap_stopped_early=boot_stopped, confidence=options.confidence,
                  bootstrap=boot)


def _constants(theta: np.ndarray) -> np.ndarray:
    """(K, 6) theta (a, alpha, b, beta, e, phi) -> (K, 6) constants (E, A, alpha, B, beta, phi)."""
    a, alpha, b, beta, e, phi = theta.T
    return np.stack([np.exp(e), np.exp(a), alpha, np.exp(b), beta, phi], axis=1)


def with_identification(joint: LawFit, phi0: LawFit, bounds: Bounds) -> LawFit:
    """``joint`` marked UNIDENTIFIED (if it had converged) with the reasons when the data do not determine its
    phi; ``phi0`` is the same fit with phi fixed at 0."""
    problems = tuple(phi_problems(joint, phi0, bounds.phi))
    if not problems:
        return joint
    status = FitStatus.UNIDENTIFIED if joint.status is FitStatus.CONVERGED else joint.status
    return dataclasses.replace(joint, status=status, warnings=problems)


@dataclass(frozen=True, eq=False)
class FitSuite:
    """The joint fit next to the paper's comparisons: phi fixed at 0 and at 1, and a Chinchilla fit per r."""

    joint: LawFit
    phi0: LawFit
    phi1: LawFit
    per_r: dict[int, LawFit]

    def table(self) -> pd.DataFrame:
        """One row per fit: the constants, phi's interval, R^2, RMSE, max residual, status."""
        rows = [("joint", self.joint), ("phi=0", self.phi0), ("phi=1", self.phi1)]
        rows += [(f"r={r} (Chinchilla)", fit) for r, fit in sorted(self.per_r.items())]
        return pd.DataFrame([{"fit": name, "E": f.E, "A": f.A, "alpha": f.alpha, "B": f.B, "beta": f.beta,
                              "phi": f.phi, "phi_lo": f.phi_ci[0], "phi_hi": f.phi_ci[1], "r2": f.r2,
                              "rmse": f.rmse, "max_residual": f.max_residual, "n_runs": f.n_runs,
                              "status": f.status.value} for name, f in rows])


def fit_suite(runs: pd.DataFrame, *, options: FitOptions = DEFAULT_FIT_OPTIONS,
              progress: Callable[[str], None] | None = None, **overrides: Any) -> FitSuite:
    """``fit_joint_law`` with bootstrap, the restricted fits (phi = 0, phi = 1) and per-r Chinchilla fits.

    The comparison fits skip the bootstrap: only the joint fit's interval is reported. A joint fit that
    converged although its phi is not identified (its interval reaches a bound, or phi = 0 fits as well) is
    returned as UNIDENTIFIED with the reasons in ``warnings`` (``analysis.identify``). A per-r fit is
    L = E + A N^-alpha + B D^-beta on that r's runs (phi fixed at 0 makes N_eff = N_once + N_rec = N);
    r values with too few runs for five parameters are left out. ``progress`` is called with a line before
    each fit (the joint fit with its bootstrap takes most of the time).
    """
    options = with_overrides(options, overrides)
    say = progress or (lambda line: None)
    say(f"joint fit: {options.n_starts} starts, {options.n_bootstrap} bootstrap resamples")
    joint = fit_joint_law(runs, options=options)
    quick = dataclasses.replace(options, n_bootstrap=0)
    say("restricted fits: phi = 0, phi = 1")
    phi0 = fit_joint_law(runs, options=quick, fix_phi=0.0)
    phi1 = fit_joint_law(runs, options=quick, fix_phi=1.0)
    joint = with_identification(joint, phi0, options.bounds)
    usable = usable_runs(runs, stage=options.stage)
    per_r = {}
    recurrences = sorted(usable["r"].unique())
    say(f"per-r Chinchilla fits: r = {', '.join(str(int(r)) for r in recurrences)}")
    for r in recurrences:
        subset = usable[usable["r"] == r]
        if len(fit_rows(subset, options)) > 5:
            per_r[int(r)] = fit_joint_law(subset, options=quick, fix_phi=0.0)
    return FitSuite(joint=joint, phi0=phi0, phi1=phi1, per_r=per_r)
