"""Per-cell IsoFLOP optima: a parabola in log N through each (budget C, r) cell's runs (Hoffmann et al. 2022,
approach 2; the paper's per-cell optimum).

Within a cell, L(x) = c0 + c1 (x - x_c) + c2 (x - x_c)^2 with x = log N is fitted by least squares; the optimum
is x* = x_c - c1 / (2 c2), L* = L(x*). D*, N_once*, N_rec* and the width at the optimum follow by interpolating
log D, log N_once, log N_rec and log width against x through the same runs (they are smooth functions of the
width at fixed C and r), so the table needs nothing beyond the runs table.

A cell with fewer than ``min_points`` distinct sizes is flagged "too_few_points"; one whose parabola opens
downward or whose vertex lies outside the sampled sizes is flagged "no_interior_minimum" (as in the paper: the parabola
is biased when the grid is off-centre; an extrapolated optimum is not reported as one). When such a cell's best
run sits on an edge of the widths the sweep let it try (its ``cell_widths``), it is "bound_limited" instead,
with that reason.

Uncertainty: a residual bootstrap (refit to fitted values plus resampled residuals, inflated by
sqrt(n / (n - 3))); resamples whose parabola has no interior minimum are dropped and their share reported as
``boot_valid``. A cell of three runs has no residual (the parabola passes through them), so the bootstrap cannot
draw its noise; it gets a parametric bootstrap instead (Efron & Tibshirani 1993, ch. 6): refits to the fitted
values plus Gaussian noise of the sweep's pooled residual standard deviation, sigma^2 = sum RSS / sum (n - 3)
over the cells with more runs than three (the same noise in every cell: one training recipe, one evaluation
set). Column ``interval`` says which; with no cell of more than three runs there is no noise to pool and no
interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import numbers
from .runs import usable_runs


@dataclass(frozen=True, eq=False)
class IsoflopResult:
    """``table``: one row per (budget, r) cell; ``draws``: per cell, (B, 3) bootstrap (log N*, log D*, L*)."""

    table: pd.DataFrame
    draws: dict[tuple[float, int], np.ndarray] = field(repr=False)


def cell_optima(runs: pd.DataFrame, *, stage: str | None = "search", n_bootstrap: int = 200, seed: int = 0,
                confidence: float = 0.95, min_points: int = 3) -> IsoflopResult:
    """The IsoFLOP optimum of every (budget, r) cell of the usable runs."""
    usable = usable_runs(runs, stage=stage)
    rng = np.random.default_rng(seed)
    tail = 100 * (1 - confidence) / 2
    rows, draws = [], {}
    cells = usable.groupby(["budget_flops", "r"], sort=True)
    sigma = pooled_sigma([cell for _, cell in cells])
    for (budget, r), cell in cells:
        row, cell_draws = _cell(cell, n_bootstrap, rng, tail, min_points, sigma)
        rows.append({"r": int(r), "budget_flops": float(budget), **row})
        draws[(float(budget), int(r))] = cell_draws
    return IsoflopResult(table=pd.DataFrame(rows), draws=draws)


def pooled_sigma(cells: list[pd.DataFrame]) -> float:
    """The pooled residual standard deviation of the cells' parabolas (nats), sqrt(sum RSS / sum (n - 3)) over
    the cells with more than three runs of at least three sizes; NaN when there is none."""
    rss, dof = 0.0, 0
    for cell in cells:
        x, y = _points(cell)
        if len(y) > 3 and np.unique(x).size >= 3:
            design = np.vander(x - x.mean(), 3, increasing=True)
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            rss += float(((y - design @ coef) ** 2).sum())
            dof += len(y) - 3
    return float(np.sqrt(rss / dof)) if dof else np.nan


def _points(cell: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(log N, loss) of a cell's runs."""
    return np.log((cell["N_once"] + cell["N_rec"]).to_numpy(float)), cell["val_loss"].to_numpy(float)


def _cell(cell: pd.DataFrame, n_bootstrap: int, rng: np.random.Generator, tail: float,
          min_points: int, sigma: float) -> tuple[dict, np.ndarray]:
    cell = cell.sort_values("N_once")
    x, y = _points(cell)
    n_sizes = np.unique(x).size
    row = {"n_points": len(cell), "status": "ok", "reason": ""}
    nothing = np.full((n_bootstrap, 3), np.nan)
    if n_sizes < max(min_points, 3):
        row.update(status="too_few_points", reason=f"{n_sizes} distinct sizes (< {max(min_points, 3)})")
        return row, nothing
    center = x.mean()
    design = np.vander(x - center, 3, increasing=True)  # columns 1, x - x_c, (x - x_c)^2
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    row.update(c0=coef[0], c1=coef[1], c2=coef[2], x_center=center, logN_min=x.min(), logN_max=x.max())
    vertex = _vertex(coef[None], center, x.min(), x.max())[0]
    if not np.isfinite(vertex):
        side = "opens downward" if coef[2] <= 0 else (
            "minimum below the smallest size" if center - coef[1] / (2 * coef[2]) < x.min()
            else "minimum above the largest size")
        row.update(status="no_interior_minimum", reason=f"parabola {side}")
        row.update(_bound_limited(cell, y))
        return row, nothing

    interp = _interpolators(cell, x)
    n_opt = np.exp(vertex)
    d_opt = float(interp["tokens"](vertex))
    # float(): a column the table lacks (width) interpolates to a 0-d NaN array, which no JSON writer takes
    row.update(N_opt=n_opt, D_opt=d_opt, L_opt=_parabola(coef, center, vertex),
               N_once_opt=float(interp["N_once"](vertex)), N_rec_opt=float(interp["N_rec"](vertex)),
               width_opt=float(interp["width"](vertex)), tokens_per_param=d_opt / n_opt)

    residual = y - design @ coef
    noise = None
    if n_bootstrap == 0:
        row["interval"] = "none: no bootstrap"
    elif len(y) > 3:
        row["interval"] = "residual bootstrap"
        noise = np.sqrt(len(y) / (len(y) - 3)) * residual[rng.integers(0, len(y), size=(n_bootstrap, len(y)))]
    elif np.isfinite(sigma):
        row["interval"] = f"parametric bootstrap, pooled noise {numbers.sig(sigma)} nats"
        noise = sigma * rng.standard_normal((n_bootstrap, len(y)))
    else:
        row["interval"] = "none: no cell has more than 3 runs to estimate the noise"
    if noise is None:
        row.update(N_lo=np.nan, N_hi=np.nan, D_lo=np.nan, D_hi=np.nan, L_lo=np.nan, L_hi=np.nan, boot_valid=np.nan)
        point = np.array([vertex, np.log(d_opt), row["L_opt"]])
        return row, np.tile(point, (n_bootstrap, 1))
    fake = design @ coef + noise
    boot_coef = np.linalg.lstsq(design, fake.T, rcond=None)[0].T  # (B, 3)
    boot_vertex = _vertex(boot_coef, center, x.min(), x.max())
    valid = np.isfinite(boot_vertex)
    safe = np.where(valid, boot_vertex, vertex)
    cell_draws = np.stack([np.where(valid, boot_vertex, np.nan),
                           np.where(valid, np.log(interp["tokens"](safe)), np.nan),
                           np.where(valid, _parabola(boot_coef.T, center, safe), np.nan)], axis=1)
    lo, hi = np.nanpercentile(cell_draws, [tail, 100 - tail], axis=0) if valid.any() else np.full((2, 3), np.nan)
    row.update(N_lo=np.exp(lo[0]), N_hi=np.exp(hi[0]), D_lo=np.exp(lo[1]), D_hi=np.exp(hi[1]), L_lo=lo[2],
               L_hi=hi[2], boot_valid=valid.mean())
    return row, cell_draws


def _bound_limited(cell: pd.DataFrame, y: np.ndarray) -> dict[str, str]:
    """Status "bound_limited" with its reason when the cell's best run sits on an edge of the widths the
    cell may try (the ``cell_widths`` "lo-hi" a sweep records: s_min / s_max or the tokens-per-parameter
    window): its optimum may lie beyond; else nothing."""
    widths = {str(w) for w in cell.get("cell_widths", pd.Series(dtype=str))} - {"", "nan"}
    if len(widths) != 1 or "s" not in cell:
        return {}
    lo, _, hi = widths.pop().partition("-")
    run = cell.iloc[int(np.argmin(y))]
    best = float(run["s"])
    for edge, side, beyond in ((float(lo), "narrowest", "below"), (float(hi), "widest", "above")):
        if abs(best - edge) < 1e-9:
            return {"status": "bound_limited",
                    "reason": f"best run at s={best:g}, the {side} width the cell may try (s_min/s_max or the "
                              f"tokens_per_param window); its optimum may lie {beyond}: {_edge_fix(side, run)}"}
    return {}


def _edge_fix(side: str, run: pd.Series) -> str:
    """What moves a bound-limited cell's edge: the widths' range, unless its best run is one head wide, the
    narrowest model the template builds, which only a smaller head (and width unit) can undercut."""
    if side == "widest":
        return "raise [widths] s_max (or lower the low end of tokens_per_param)"
    width, head_dim = run.get("width"), run.get("template.head_dim")
    if pd.notna(width) and pd.notna(head_dim) and float(width) <= float(head_dim):
        return (f"width {float(width):g} is one head, the narrowest model the template builds: a smaller "
                "[template] head_dim and width_unit, not more trials")
    return "lower [widths] s_min (or raise the high end of tokens_per_param)"


def _vertex(coef: np.ndarray, center: float, lo: float, hi: float) -> np.ndarray:
    """x* of each parabola (rows of coef), NaN where it opens downward or the vertex leaves [lo, hi]."""
    c1, c2 = coef[:, 1], coef[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = center - c1 / (2 * c2)
    return np.where((c2 > 0) & (x >= lo) & (x <= hi), x, np.nan)


def _parabola(coef, center: float, x):
    u = np.asarray(x) - center
    return coef[0] + coef[1] * u + coef[2] * u * u


def _interpolators(cell: pd.DataFrame, x: np.ndarray) -> dict:
    """Each quantity as a polynomial (degree <= 2) in log N through the cell's runs: of its log where it is
    positive throughout (sizes and tokens are near power laws of N), else of the value itself."""
    degree = min(2, np.unique(x).size - 1)
    out = {}
    for name in ("tokens", "N_once", "N_rec", "width"):
        v = cell[name].to_numpy(float)
        if np.all(np.isfinite(v) & (v > 0)):
            poly = np.poly1d(np.polyfit(x, np.log(v), degree))
            out[name] = lambda t, poly=poly: np.exp(poly(t))
        elif np.all(np.isfinite(v)):
            poly = np.poly1d(np.polyfit(x, v, degree))
            out[name] = poly
        else:
            out[name] = lambda t: np.full(np.shape(t), np.nan)
    return out


def cell_gaps(optima: pd.DataFrame) -> pd.DataFrame:
    """Per budget and r > 1, the measured gap L*_r - L*_1 between the cells' optima (nats)."""
    ok = optima[optima["status"] == "ok"]
    base = ok[ok["r"] == 1].set_index("budget_flops")["L_opt"]
    looped = ok[ok["r"] > 1]
    gap = looped["L_opt"].to_numpy() - base.reindex(looped["budget_flops"]).to_numpy()
    return pd.DataFrame({"budget_flops": looped["budget_flops"].to_numpy(), "r": looped["r"].to_numpy(),
                         "gap_to_r1": gap}).dropna().reset_index(drop=True)
