"""The ``law`` sampler: one joint law, fitted to the finished trials of EVERY cell, proposes each cell's widths.

Every cell of a sweep measures the same law (Schwethelm et al. 2026, Eq. 2)::

    L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta

so once the cheap budgets have run, the law fitted to them already predicts where the expensive cells'
optima lie. ``LawSurrogate`` holds the finished trials of all cells and refits the law after each one with
analysis' own fitter, warm-started (``analysis.fit.refit``: the previous optimum plus a few random starts);
every cell's ``LawSampler`` (an Optuna sampler) asks it for the cell's next width:

1. nothing measured in the cell: the width the law predicts optimal (before any fit is possible, the
   tokens-per-parameter first guess of the spec);
2. the best width so far lacks a tried neighbour on one side (and is not the cell's edge): a width on that
   side, at least ``sigma`` (the surrogate's uncertainty of the optimum, in log width) away and far enough
   that the law predicts a rise of ``RISE`` times the fit's residual noise there, so that the cell's parabola
   (analysis.isoflop) is not drowned by noise; the side toward the law's optimum goes first;
3. the best width is an edge of the cell's widths: the width next to it (is the cell bound-limited?);
4. bracketed, but the cell's parabola in log N has no interior minimum, or locates it less precisely than
   ``tolerance`` (standard error of the vertex, in log width, with the fit's noise): the untried width inside
   the bracket nearest to the vertex (or to the best run), else the nearest outside it;
5. located, and ``information`` > 0: the width that most reduces the variance of phi (below), if a trial there
   is worth its FLOPs.

A cell is finished (``status``) when its best trial has a tried neighbour on each side, its parabola has an
interior minimum and the vertex is located within ``tolerance`` ("located"), and no further trial of it is worth
its FLOPs for phi; when its best trial is an edge of the cell's widths and beats the width next to it ("edge":
bound-limited); or when it has tried every width. ``trials_per_cell`` stays a cap.

Information about phi (step 5): phi is what the study measures, and a located cell's optimum is not all a trial
can buy. With the fit linearised at the current parameters (J, d log L / d theta at every width of every
cell) and the errors the replayed studies have (objectives/noise.py: independent noise of variance v plus an
offset shared by a cell, of variance t, both estimated from the fit's residuals), a GLS fit of the law to a
set of runs has information I = sum over cells c of (J_c^T J_c - t / (v + n_c t) s_c s_c^T) / v, with s_c the
sum of J_c's rows, and var(phi) = (I^-1)[phi, phi] (the compound-symmetric covariance of a cell inverted in
closed form). A trial of cell c at the width that most reduces it is worth running while the share of
var(phi) it removes is at least ``information`` times the share of FLOPs it adds to the bracket rule's
fewest trials (``fewest_trials``): cheap cells then take more widths, expensive ones stop at their bracket. An
offset shared by a cell is why more of the same cell's trials buy less and less, and why the cheap cells'
extra widths, spread far from their optima, are where phi's information is cheapest (tests/benchmarks/
bench_phi_information.py measures the designs).

Warmdown branches (``branches = true``; objectives/branches.py): a trial of cell (C, r) at width w can also
record its loss at a smaller budget C_k of its r for about a fifth of what a trial of C_k costs. The optimal
width grows with the budget (in the paper's law by 0.2-0.3 in log width per budget step of 10^(1/3)), and a
bracket spans about that on either side, so a large cell's widths land around the optima of the cells below it.
``branches_for`` gives a trial every smaller budget of its r whose cell is still open, where w is untried and
within ``BRANCH_REACH`` of the cell's best width (or predicted optimum); each branch point counts as a result of
its cell. Order (``waits``): the cell just below each r's largest budget takes no trial of its own while the
largest is open (when r has cheaper cells, which are then what the law is fitted on first): the largest cell's
three widths reach it as branches and often bracket its optimum alone, and its own trials fill what is left.
Every other cell takes its first trial in the cost-aware order, then waits while a larger cell of its r is open,
so its bracket too is filled by the larger cells' branches first: against branches into the next budget alone,
with each cell's first trial at once, this spends fewer FLOPs for the same precision of phi per FLOP
(tests/benchmarks/bench_search_quality.py compares them). A branch point shares its trial's noise, so branches buy no extra precision: they buy
the dear cells' brackets.

Free slots (``holds_back``): while any trial runs, a cell takes no free slot when a trial now would be a guess
that the running trials may settle: its widths held (results, running trials, branch points on their way)
already bracket its best (or, before any result, its running) width; it waits for a larger cell's branches
(``waits``); or it has no trial yet while a cheaper cell of its r that takes trials of its own has no result, so
that its width is proposed by a law that has seen the cheaper cells of its r. The slot then stays idle until a
result arrives, unless another cell can use it; when nothing runs, every open cell may take it. Filling every
free slot instead spends more FLOPs the more slots a sweep has, on guesses, and leaves more cells without an
interior optimum; holding back costs little wall time (the benchmark's sweep measures both).

Uncertainty: the Gauss-Newton covariance of the fitted parameters, s^2 (J^T J)^+ with J the Jacobian of the
predicted log-loss and s^2 the residual variance; ``DRAWS`` seeded draws from it give a spread of each
cell's predicted optimal width (their standard deviation in log width is ``sigma``). Before the first fit
and when the fit is poorly determined, ``sigma`` is large and the brackets wide.

State is plain data (numpy arrays and dicts), pickled with the Tune searcher that holds the cells' studies,
so a restored sweep continues with the same surrogate. Every draw is seeded by the spec's seed and the
number of fits so far: the same results in the same order give the same proposals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from loopscale.analysis.fit import refit
from loopscale.analysis.fit_problem import FitData
from loopscale.analysis.law_jacobian import log_loss as _log_loss
from loopscale.analysis.law_jacobian import log_loss_jacobian
from loopscale.analysis.options import DEFAULT_BOUNDS, THETA
from loopscale.model import account, tokens_for_budget

from .spec import Cell, SweepSpec

MIN_RUNS = 8            # runs before the law is fitted (6 parameters, a few degrees of freedom to spare)
RISE = 2.0              # a bracketing width should lose this many noise sds against the optimum (law's prediction)
PRIOR_SIGMA = 0.25      # log width: the spread of the optimum before any fit (the first guess is a rule of thumb)
MAX_SPACING = 0.4       # log width: a bracketing width is never placed farther than this from the best run
NOISE_FLOOR = 1e-3      # nats: the fit's residual noise is never taken as smaller (a perfect fit of few runs)
BRANCH_REACH = 0.5      # log width: a branch point is proposed within this of its cell's best (or predicted) width
DRAWS = 64              # parameter draws for the spread of each cell's optimum
REFIT_STARTS = 4        # random starts besides the previous optimum per refit
COLD_STARTS = 32        # random starts of the first fit
MAX_ITER = 300          # quasi-Newton iterations per start (a warm start converges in far fewer)


@dataclass(frozen=True)
class CellGeometry:
    """What the surrogate needs of a cell: its widths (as head counts) and each width's sizes and tokens."""

    key: str
    budget: float
    r: int
    heads: tuple[int, ...]
    log_s: np.ndarray       # log of the width multiplier s of each head count
    n_once: np.ndarray
    n_rec: np.ndarray
    tokens: np.ndarray
    first_guess: int        # heads of the tokens-per-parameter first guess

    @classmethod
    def of(cls, spec: SweepSpec, cell: Cell) -> "CellGeometry":
        sizes = [account(spec.grid.model(s, cell.r)) for s in cell.widths]
        tokens = [tokens_for_budget(spec.grid.model(s, cell.r), cell.budget,
                                    spec.grid.batch_tokens) for s in cell.widths]
        heads = tuple(spec.grid.heads(s) for s in cell.widths)
        return cls(cell.key, cell.budget, cell.r, heads, np.log(np.array(cell.widths, float)),
                   np.array([p.N_once for p in sizes], float), np.array([p.N_rec for p in sizes], float),
                   np.array(tokens, float), spec.grid.heads(cell.first_guess))

    def index(self, heads: int) -> int:
        return self.heads.index(heads)

    @property
    def log_n(self) -> np.ndarray:
        return np.log(self.n_once + self.n_rec)


class LawSurrogate:
    """The finished trials of every cell and the joint law fitted to them (see the module docstring)."""

    def __init__(self, cells: list[CellGeometry], *, seed: int, tolerance: float, branches: bool = False,
                 information: float = 0.0, deferred: int = 1):
        self.cells = {c.key: c for c in cells}
        self.seed, self.tolerance, self.branches, self.information = seed, tolerance, branches, information
        self.fewest = fewest_trials(cells, branches, deferred)  # 0: a cell that waits for its branches first
        self.floor_flops = sum(self.fewest[c.key] * c.budget for c in cells)  # what a trial's cost is a share of
        self.incoming: dict[str, dict[int, int]] = {c.key: {} for c in cells}  # cell -> heads -> branches running
        self.results: dict[str, dict[int, float]] = {c.key: {} for c in cells}  # cell -> heads -> loss
        self.failed: dict[str, set[int]] = {c.key: set() for c in cells}
        self.closed: dict[str, str] = {}  # cell -> why it stopped; final, though a later refit may move the noise
        self.theta: np.ndarray | None = None
        self.noise = NOISE_FLOOR
        self.fits = 0
        self.optimum: dict[str, int] = {}      # cell -> heads the law predicts optimal
        self.sigma: dict[str, float] = {}      # cell -> spread of that optimum, log width
        self.predicted: dict[str, np.ndarray] = {}  # cell -> predicted loss at every width
        self.jac: dict[str, np.ndarray] = {}        # cell -> d log L / d theta at every width, (widths, 6)
        self.var_run = self.var_cell = 0.0          # log-loss variance of a run's own noise / of a cell's offset

    # ---- data -------------------------------------------------------------------------------------------
    def add(self, key: str, heads: int, loss: float | None,
            branches: tuple[tuple[str, int, float | None], ...] = ()) -> None:
        """A trial of cell ``key`` at ``heads`` finished with ``loss`` (None: failed or diverged), and with its
        warmdown ``branches`` as (cell, heads, loss), which it had announced (``expect``); refit once."""
        for k, h, _ in branches:
            self._arrived(k, h)
        points = [(key, heads, loss), *branches]
        fresh = False
        for k, h, v in points:
            if v is None or not math.isfinite(v):
                if k == key:
                    self.failed[k].add(h)
            elif h not in self.results[k]:
                self.results[k][h] = float(v)
                fresh = True
        if fresh:
            self._refit()

    def expect(self, key: str, heads: int) -> None:
        """A running trial will bring a branch point of cell ``key`` at ``heads``."""
        self.incoming[key][heads] = self.incoming[key].get(heads, 0) + 1

    def _arrived(self, key: str, heads: int) -> None:
        left = self.incoming[key].get(heads, 0) - 1
        if left > 0:
            self.incoming[key][heads] = left
        else:
            self.incoming[key].pop(heads, None)

    def branches_for(self, key: str, heads: int, busy: dict[str, set[int]]) -> list[tuple[str, float]]:
        """(cell, budget) of the cells a trial of cell ``key`` at ``heads`` should branch into: the smaller
        budgets of its r whose cell is open, has ``heads`` among its widths, untried there (``busy``: widths its
        own trials hold) and within ``BRANCH_REACH`` of its best width so far (or, before any, its predicted
        optimum)."""
        if not self.branches:
            return []
        g = self.cells[key]
        out = []
        for k, other in self.cells.items():
            if other.r != g.r or other.budget >= g.budget or heads not in other.heads or self.status(k) != "open":
                continue
            done = self.results[k]
            if heads in done or heads in self.failed[k] or heads in busy.get(k, ()) or heads in self.incoming[k]:
                continue
            center = min(done, key=done.get) if done else self.guess(k)[0]
            ls = dict(zip(other.heads, other.log_s))
            if abs(ls[heads] - ls[center]) <= BRANCH_REACH + 1e-12:
                out.append((k, other.budget))
        return out

    def waits(self, key: str) -> bool:
        """Whether the cell should let others take a free slot first (module docstring): a larger cell of its r
        is open and the cell has had its first trial, or it is the cell just below its r's largest budget, which
        takes none before the largest cell's branches (``fewest_trials`` 0)."""
        if not self.branches:
            return False
        g = self.cells[key]
        if not (self.results[key] or self.failed[key] or self.fewest[key] == 0):
            return False
        return any(o.r == g.r and o.budget > g.budget and self.status(k) == "open" for k, o in self.cells.items())

    def holds_back(self, key: str, pending: set[int]) -> bool:
        """Whether the cell should leave a free slot idle while other trials run (module docstring, "Free
        slots"), given the widths its running trials hold."""
        g = self.cells[key]
        done = self.results[key]
        if self.waits(key):
            return True
        if not done and not pending and not self.incoming[key] and any(
                o.r == g.r and o.budget < g.budget and self.fewest[k] > 0 and not self.results[k]
                and self.status(k) == "open" for k, o in self.cells.items()):
            return True  # its first trial: the law should see its r's cheaper cells first
        held = set(done) | pending | set(self.incoming[key])
        if not pending or len(held) < 3:
            return False
        return not self._open_sides(g, self._center(key, pending), held)

    def _refit(self) -> None:
        rows = [(self.cells[k], h, v) for k, done in self.results.items() for h, v in done.items()]
        if len(rows) < MIN_RUNS or len({g.r for g, _, _ in rows}) < 2:
            return
        index = {k: i for i, k in enumerate(self.cells)}
        at = [(g, g.index(h), v) for g, h, v in rows]
        data = FitData(r=np.array([g.r for g, _, _ in at], float),
                       n_once=np.array([g.n_once[i] for g, i, _ in at]), n_rec=np.array([g.n_rec[i] for g, i, _ in at]),
                       log_d=np.log([g.tokens[i] for g, i, _ in at]), log_l=np.log([v for _, _, v in at]),
                       cell=np.array([index[g.key] for g, _, _ in at]),
                       budget=np.array([g.budget for g, _, _ in at]))
        starts = REFIT_STARTS if self.theta is not None else COLD_STARTS
        self.theta, _ = refit(data, self.theta, n_starts=starts, seed=self.seed + self.fits, max_iter=MAX_ITER)
        self.fits += 1
        predicted = _log_loss(self.theta[None], data.r, data.n_once, data.n_rec, data.log_d)[0]
        # the noise a cell's parabola sees: residuals about their cell's mean (a shift of a whole cell, as real
        # studies have, moves no optimum)
        within, _ = _split_by_cell(np.exp(data.log_l) - np.exp(predicted), data.cell)
        counts = np.bincount(data.cell)
        counts = counts[counts > 0]  # runs per cell that has any
        dof = max(len(rows) - counts.size, 1)
        self.noise = max(float(np.sqrt((within ** 2).sum() / dof)), NOISE_FLOOR)
        # the same split of the log-loss residuals sizes the errors of the information about phi: a run's own
        # variance, and what the spread of the cells' means has beyond it (a method-of-moments estimate)
        within, means = _split_by_cell(data.log_l - predicted, data.cell)
        self.var_run = max(float((within ** 2).sum() / dof), (NOISE_FLOOR / float(np.exp(data.log_l).max())) ** 2)
        spread = float(np.var(means, ddof=1)) if means.size > 1 else 0.0
        self.var_cell = max(spread - self.var_run * float(np.mean(1.0 / counts)), 0.0)
        self._predict(data, predicted)

    def _predict(self, data: FitData, predicted: np.ndarray) -> None:
        """Each cell's predicted optimal width and its spread over draws from the fit's covariance."""
        jac = log_loss_jacobian(self.theta, data.r, data.n_once, data.n_rec, data.log_d)
        sigma2 = (((data.log_l - predicted) ** 2).sum() / max(data.r.size - len(THETA), 1))
        cov = sigma2 * np.linalg.pinv(jac.T @ jac)
        rng = np.random.default_rng(self.seed + 7919 * self.fits)
        lower, upper = DEFAULT_BOUNDS.arrays()
        # the draws numpy's multivariate_normal(method="eigh") makes, without its warning when pinv's round-off
        # leaves an eigenvalue a hair below zero: a direction the runs do not constrain gets no spread
        w, v = np.linalg.eigh((cov + cov.T) / 2)
        draws = self.theta + rng.standard_normal((DRAWS, len(THETA))) @ (v * np.sqrt(np.clip(w, 0.0, None))).T
        draws = np.clip(draws, lower, upper)
        for key, g in self.cells.items():
            log_d = np.log(g.tokens)
            self.jac[key] = log_loss_jacobian(self.theta, float(g.r), g.n_once, g.n_rec, log_d)
            loss = np.exp(_log_loss(self.theta[None], float(g.r), g.n_once, g.n_rec, log_d)[0])
            self.predicted[key] = loss
            self.optimum[key] = g.heads[int(np.argmin(loss))]
            spread = _log_loss(draws, float(g.r), g.n_once, g.n_rec, log_d)
            self.sigma[key] = float(np.std(g.log_s[np.argmin(spread, axis=1)]))

    # ---- proposals --------------------------------------------------------------------------------------
    def guess(self, key: str) -> tuple[int, float]:
        """(heads the law predicts optimal, spread in log width); the first guess before any fit."""
        if key in self.optimum:
            return self.optimum[key], max(self.sigma[key], 0.0)
        return self.cells[key].first_guess, PRIOR_SIGMA

    def propose(self, key: str, pending: set[int]) -> int:
        """The next width (heads) of cell ``key``, given the widths its running trials hold."""
        g = self.cells[key]
        done = self.results[key]
        pending = pending | set(self.incoming[key])  # a branch point on its way is as good as a running trial
        taken = set(done) | self.failed[key] | pending
        free = [h for h in g.heads if h not in taken]
        if not free:
            return min(g.heads, key=lambda h: (h in done, h))  # cannot happen while the cell is open
        target, sigma = self.guess(key)
        ls = dict(zip(g.heads, g.log_s))
        if not done and not pending:
            return min(free, key=lambda h: (abs(ls[h] - ls[target]), h))
        center = self._center(key, pending)
        if need := self._open_sides(g, center, taken):
            toward = 1 if ls[target] > ls[center] else -1
            side = toward if toward in need else need[0]
            return self._bracket(g, center, side, free, sigma)
        best = center  # (the best run, when the cell has one)
        inner = {g.heads[0]: g.heads[1], g.heads[-1]: g.heads[-2]}.get(best) if len(g.heads) > 1 else None
        if inner in free:  # the best run is an edge of the cell: the width next to it decides if it is bound-limited
            return inner
        vertex = self._vertex(key)
        if vertex is not None and vertex[1] <= self.tolerance and (worth := self._informative(key, pending)):
            return worth[0]  # located: the width that tells most about phi
        middle = vertex[0] if vertex is not None else ls[best]
        lo, hi = min(ls[h] for h in taken), max(ls[h] for h in taken)
        inside = [h for h in free if lo < ls[h] < hi]
        if inside:  # fill the bracket where the optimum is: the parabola then rests on points near it
            return min(inside, key=lambda h: (abs(ls[h] - middle), h))
        return min(free, key=lambda h: (abs(ls[h] - middle), h))

    def _center(self, key: str, pending: set[int]) -> int:
        """The width the cell's bracket is built around: its best run, or before any result the width of a
        running trial nearest the law's optimum."""
        done = self.results[key]
        if done:
            return min(done, key=done.get)
        g = self.cells[key]
        ls = dict(zip(g.heads, g.log_s))
        target = self.guess(key)[0]
        return min(pending, key=lambda h: abs(ls[h] - ls[target]))

    @staticmethod
    def _open_sides(g: CellGeometry, center: int, held: set[int]) -> list[int]:
        """The sides of ``center`` (-1 narrower, 1 wider) where the cell has widths and ``held`` none."""
        ls = dict(zip(g.heads, g.log_s))
        return [side for side in (-1, 1) if not any(side * (ls[h] - ls[center]) > 0 for h in held)
                and any(side * (ls[h] - ls[center]) > 0 for h in g.heads)]

    def _bracket(self, g: CellGeometry, center: int, side: int, free: list[int], sigma: float) -> int:
        """A free width on ``side`` of ``center``: the nearest at least ``sigma`` away whose predicted loss
        rises by RISE noise sds over the center's; the farthest on that side if none does."""
        ls = dict(zip(g.heads, g.log_s))
        on_side = sorted((h for h in free if side * (ls[h] - ls[center]) > 0), key=lambda h: abs(ls[h] - ls[center]))
        loss = self.predicted.get(g.key)
        for h in on_side:
            if abs(ls[h] - ls[center]) > MAX_SPACING:
                break
            far = abs(ls[h] - ls[center]) >= min(sigma, MAX_SPACING) - 1e-12
            rises = loss is None or loss[g.index(h)] - loss[g.index(center)] >= RISE * self.noise
            if far and rises:
                return h
        within = [h for h in on_side if abs(ls[h] - ls[center]) <= MAX_SPACING]
        return (within or on_side[:1])[-1]

    # ---- stopping ---------------------------------------------------------------------------------------
    def status(self, key: str) -> str:
        """"open", "located" (best run bracketed, interior parabola vertex within tolerance), "edge" (the best
        run is an edge of the cell's widths and beats the width next to it: bound-limited) or "exhausted"
        (every width tried). A cell once stopped stays stopped."""
        if key not in self.closed and (why := self._status(key)) != "open":
            self.closed[key] = why
        return self.closed.get(key, "open")

    def _status(self, key: str) -> str:
        g = self.cells[key]
        done = self.results[key]
        if len(set(done) | self.failed[key]) >= len(g.heads):
            return "exhausted"
        if len(done) < 3:
            return "open"
        ls = dict(zip(g.heads, g.log_s))
        best = min(done, key=done.get)
        if not all(any(side * (ls[h] - ls[best]) > 0 for h in done) for side in (-1, 1)):
            edge = {g.heads[0]: g.heads[1], g.heads[-1]: g.heads[-2]}.get(best)
            return "edge" if edge in done else "open"
        vertex = self._vertex(key)
        if vertex is None or vertex[1] > self.tolerance:
            return "open"
        worth = self._informative(key, set())
        return "open" if worth is not None and worth[1] >= self.information else "located"

    # ---- information about phi (module docstring) -------------------------------------------------------
    def _informative(self, key: str, pending: set[int]) -> tuple[int, float] | None:
        """(heads, worth) of the untried width of cell ``key`` whose trial most reduces var(phi), with its worth:
        the share of var(phi) it removes over the share of the fewest trials' FLOPs it costs. None when
        ``information`` is off, before a fit, or when the runs so far do not yet determine phi."""
        if self.information <= 0 or not self.jac:
            return None
        g = self.cells[key]
        design = {k: [self.cells[k].index(h) for h in {*self.results[k], *self.incoming[k]}] for k in self.cells}
        design[key] = sorted({*design[key], *(g.index(h) for h in pending)})
        free = [i for i, h in enumerate(g.heads) if i not in design[key] and h not in self.failed[key]]
        now = self._var_phi(design)
        if not free or not now > 0:
            return None
        cuts = [(now - self._var_phi({**design, key: design[key] + [i]})) / now for i in free]
        best = int(np.argmax(cuts))
        return g.heads[free[best]], cuts[best] / (g.budget / self.floor_flops)

    def _var_phi(self, design: dict[str, list[int]]) -> float:
        """var(phi) of the GLS fit to the runs at ``design`` (cell -> width indices), linearised (module
        docstring)."""
        info = np.zeros((len(THETA), len(THETA)))
        for k, idx in design.items():
            if idx:
                j = self.jac[k][idx]
                s = j.sum(axis=0)
                info += (j.T @ j - self.var_cell / (self.var_run + len(idx) * self.var_cell) * np.outer(s, s))
        return float(self.var_run * np.linalg.pinv(info)[5, 5])  # 0 where phi lies in info's null space

    def _vertex(self, key: str) -> tuple[float, float] | None:
        """(log width, standard error) of the vertex of the cell's parabola in log N (analysis.isoflop's),
        or None without an interior minimum. The error propagates the fit's noise through the parabola's
        least-squares coefficients (delta method) and converts log N to log width by the cell's slope."""
        g = self.cells[key]
        done = self.results[key]
        if len(done) < 3:
            return None
        idx = [g.index(h) for h in done]
        x, y = g.log_n[idx], np.array(list(done.values()))
        center = x.mean()
        design = np.vander(x - center, 3, increasing=True)
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        c1, c2 = coef[1], coef[2]
        if c2 <= 0:
            return None
        u = -c1 / (2 * c2)
        if not x.min() <= center + u <= x.max():
            return None
        cov = self.noise ** 2 * np.linalg.pinv(design.T @ design)
        grad = np.array([0.0, -1 / (2 * c2), c1 / (2 * c2 * c2)])
        se_log_n = float(np.sqrt(max(grad @ cov @ grad, 0.0)))
        slope = np.polyfit(g.log_s, g.log_n, 1)[0] if len(g.heads) > 1 else 2.0  # d log N / d log s, ~2
        vertex_log_s = float(np.interp(center + u, g.log_n, g.log_s))
        return vertex_log_s, se_log_n / slope


def fewest_trials(cells: Iterable[Any], branches: bool, deferred: int = 1) -> dict[str, int]:
    """The fewest trials per cell (by key; cells with ``key``, ``budget``, ``r``) the bracket rule allows: 3 (the
    best and a neighbour on either side), or with warmdown branches 3 in each r's largest cell, which no larger
    cell can branch into, none in the ``deferred`` cells just below it (the spec's ``deferred_budgets``; their
    widths can all be larger cells' branches: ``LawSurrogate.waits``) as long as a cheaper cell of the r remains,
    and 1 in every other cell (its first, for the law's fit; its neighbours from larger cells' branches). The
    sampler spends more wherever a guess misses or a trial is worth it for phi; it never spends less."""
    cells = list(cells)
    budgets = {r: sorted({o.budget for o in cells if o.r == r}, reverse=True) for r in {c.r for c in cells}}
    fewest = {}
    for c in cells:
        rank = budgets[c.r].index(c.budget)  # 0: the largest budget of its r
        waits = 1 <= rank <= deferred and rank < len(budgets[c.r]) - 1
        fewest[c.key] = 3 if not branches or rank == 0 else 0 if waits else 1
    return fewest


def _split_by_cell(values: np.ndarray, cell: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values about their cell's mean, the means of the cells that have values)."""
    counts = np.bincount(cell)
    means = np.bincount(cell, values) / np.maximum(counts, 1)
    return values - means[cell], means[counts > 0]


class LawSampler(optuna.samplers.BaseSampler):
    """The Optuna sampler of one cell: its ``heads`` come from the shared ``LawSurrogate``. The searcher hands
    every finished trial (with its warmdown branches) to the surrogate, which refits the law across all cells."""

    def __init__(self, surrogate: LawSurrogate, key: str):
        self.surrogate, self.key = surrogate, key

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        pending = {t.params["heads"] for t in running if t.number != trial.number and "heads" in t.params}
        return self.surrogate.propose(self.key, pending)
