"""Validation rungs: the compute-optimal model at a budget above a sweep's largest, as the sweep's fitted law
recommends it, against what that law predicted for it.

The rung. At a rung budget C and r, the rung's model is the buildable compute-optimal one of the allocation
(``allocation.allocation_table``, the very table ``loopscale export`` prints: the better of the two buildable
widths around the continuous optimum, trained for whole optimizer steps).

The prediction interval of one run. The law's bootstrap draws (``LawFit.draws``) give the interval of the MEAN
loss of a model (``intervals``); a single run scatters around that mean by its own noise (the data order and
initialisation of its seed, and any misfit of the law at that width). The sweep measured that scatter: its runs'
residuals from the fitted law, e_i = L_i - L_hat(run i). A new run's loss under draw k is then L_k + e, so the
prediction interval is the percentile interval of L_k + e_i over every pair (k, i) (the bootstrap prediction
interval, Davison & Hinkley 1997, Bootstrap Methods and their Application, section 6.3.3). Fitted residuals are
smaller than the errors they estimate (the fit absorbed part of them), so they are inflated by sqrt(n / (n - p)),
with n fitted rows and p free constants (ibid., eq. 6.9, the leverage-free form). Without bootstrap draws, the
interval is the point plus the residuals alone.

The gap to r = 1 at the same rung budget, predicted (L_r,k + e_i) - (L_1,k + e_j) over draws k and pairs i != j
(two independent runs), against the achieved L_r - L_1.

A miss is reported with what it may mean: the law misspecified at these widths (the rung extrapolates it), a
learning rate that does not transfer to the rung's width, or noise (a 95% interval misses one run in twenty).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from loopscale.model import JointLaw, tokens_for_budget

from . import numbers
from .allocation import allocation_table
from .fit_problem import fit_rows
from .fit_types import CONSTANTS, LawFit
from .options import FitOptions
from .runs import own_rows
from .sizes import SizeCurve

STAGE = "validate"  # the stage tag of rung runs
MAX_NOISE_PAIRS = 4096  # residual pairs behind a gap's noise: every pair of a sweep up to 64 runs, else a seeded draw


def rung_table(fit: LawFit, budgets, recurrences, *, template, batch_tokens: int, min_steps: int) -> pd.DataFrame:
    """One row per (budget, r): the rung's buildable model (budget_flops, r, width, heads, s, N_once, N_rec,
    tokens, steps). A ValueError with one line for a budget whose model cannot be built with ``min_steps``
    optimizer steps."""
    table = allocation_table(fit, budgets, recurrences, template=template, batch_tokens=batch_tokens)
    rows = []
    for row in table.itertuples(index=False):
        curve = SizeCurve.from_model(int(row.r), template)
        width = int(row.width_built)
        steps = tokens_for_budget(curve.config(width), row.budget_flops, batch_tokens) // batch_tokens
        if steps < min_steps:
            raise ValueError(f"rung budget {numbers.flops(row.budget_flops)} FLOPs at r={int(row.r)}: its "
                             f"compute-optimal model (width {width}) trains {steps} optimizer steps of "
                             f"{batch_tokens} tokens, fewer than min_steps={min_steps}; use a larger budget")
        sizes = curve.sizes(width)
        rows.append({"budget_flops": float(row.budget_flops), "r": int(row.r), "width": width,
                     "heads": int(row.heads_built), "s": width / curve.width_unit,
                     "N_once": float(sizes["N_once"]), "N_rec": float(sizes["N_rec"]),
                     "tokens": int(row.tokens_built), "steps": int(steps)})
    return pd.DataFrame(rows)


def noise_residuals(fit: LawFit, runs: pd.DataFrame, options: FitOptions) -> np.ndarray:
    """The sweep's single-run scatter around its law: the fitted rows' residuals (nats), inflated by
    sqrt(n / (n - p)); empty when the fit has no more rows than free constants."""
    rows = fit_rows(runs, options)
    residuals = rows["val_loss"].to_numpy(float) - fit.predict(rows)
    free = len(CONSTANTS) - (fit.fixed_phi is not None or not fit.phi_applicable)
    if len(residuals) <= free:
        return np.array([])
    return residuals * np.sqrt(len(residuals) / (len(residuals) - free))


def predictions(fit: LawFit, rungs: pd.DataFrame, residuals: np.ndarray) -> pd.DataFrame:
    """``rungs`` (columns budget_flops, r, N_once, N_rec, tokens) with the predicted loss of one run and its
    prediction interval (predicted, predicted_lo, predicted_hi) and, for r > 1 where the rungs hold r = 1 at the
    same budget, the predicted gap to it (gap_predicted, gap_lo, gap_hi); NaN where there is none."""
    out = rungs.reset_index(drop=True).copy()
    means = _mean_draws(fit, out)  # (K, rungs): the law's mean loss of each rung under each draw
    tail = 100 * (1 - fit.confidence) / 2
    point = fit.predict(out)
    out["predicted"] = point
    out["predicted_lo"] = out["predicted_hi"] = np.nan
    if residuals.size:
        for i in range(len(out)):
            one_run = (means[:, i][:, None] + residuals[None, :]).ravel()
            out.loc[i, ["predicted_lo", "predicted_hi"]] = np.percentile(one_run, [tail, 100 - tail])
    out["gap_predicted"] = out["gap_lo"] = out["gap_hi"] = np.nan
    noise = _noise_differences(residuals)
    for i, row in out.iterrows():
        base = out.index[(out["r"] == 1) & np.isclose(out["budget_flops"], row["budget_flops"])]
        if row["r"] == 1 or base.empty:
            continue
        out.loc[i, "gap_predicted"] = point[i] - point[base[0]]
        if noise.size:
            gaps = ((means[:, i] - means[:, base[0]])[:, None] + noise[None, :]).ravel()
            out.loc[i, ["gap_lo", "gap_hi"]] = np.percentile(gaps, [tail, 100 - tail])
    return out


def _mean_draws(fit: LawFit, rungs: pd.DataFrame) -> np.ndarray:
    """(K, rungs) the mean loss of each rung under each bootstrap draw of the constants; the point law alone
    (K = 1) when the fit ran no bootstrap."""
    draws = fit.draws()
    if draws.empty:
        return fit.predict(rungs)[None, :]
    laws = JointLaw(**{name: draws[name].to_numpy(float)[:, None] for name in CONSTANTS})
    return np.asarray(laws.loss(rungs["N_once"].to_numpy(float)[None, :], rungs["N_rec"].to_numpy(float)[None, :],
                                rungs["r"].to_numpy(float)[None, :], rungs["tokens"].to_numpy(float)[None, :]))


def _noise_differences(residuals: np.ndarray) -> np.ndarray:
    """e_i - e_j over pairs i != j: the noise of the difference of two independent runs (a seeded draw of
    ``MAX_NOISE_PAIRS`` pairs when there are more)."""
    n = residuals.size
    if n < 2:
        return np.array([])
    i, j = np.where(~np.eye(n, dtype=bool))
    if i.size > MAX_NOISE_PAIRS:
        pick = np.random.default_rng(0).choice(i.size, MAX_NOISE_PAIRS, replace=False)
        i, j = i[pick], j[pick]
    return residuals[i] - residuals[j]


def verdicts(predicted: pd.DataFrame, achieved: pd.DataFrame, fitted_top: float) -> pd.DataFrame:
    """Predictions (``predictions``) joined with the rung runs that ended ``ok`` (``achieved``: budget_flops, r,
    val_loss) into: achieved, verdict (hit, miss or no interval), gap_achieved, gap_verdict and what a miss may
    mean (``note``). ``fitted_top``: the largest budget the law was fitted on."""
    out = predicted.copy()
    losses = {(round(float(c), 6), int(r)): float(v) for c, r, v in
              achieved[["budget_flops", "r", "val_loss"]].itertuples(index=False)}
    out["achieved"] = [losses.get((round(float(c), 6), int(r)), np.nan) for c, r in zip(out["budget_flops"], out["r"])]
    out["verdict"] = [_verdict(a, lo, hi) for a, lo, hi in zip(out["achieved"], out["predicted_lo"],
                                                                out["predicted_hi"])]
    out["gap_achieved"] = np.nan
    for i, row in out.iterrows():
        base = out[(out["r"] == 1) & np.isclose(out["budget_flops"], row["budget_flops"])]
        if row["r"] != 1 and not base.empty:
            out.loc[i, "gap_achieved"] = row["achieved"] - base["achieved"].iloc[0]
    out["gap_verdict"] = [_verdict(a, lo, hi) if np.isfinite(p) else "" for a, p, lo, hi in
                          zip(out["gap_achieved"], out["gap_predicted"], out["gap_lo"], out["gap_hi"])]
    out["note"] = [_meaning(row, fitted_top) for _, row in out.iterrows()]
    return out


def _verdict(achieved: float, lo: float, hi: float) -> str:
    if not np.isfinite(achieved):
        return "not trained"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "no interval"
    return "hit" if lo <= achieved <= hi else "miss"


def _meaning(row: pd.Series, fitted_top: float) -> str:
    """What a miss may mean, of the loss and of the gap to r = 1; '' for hits."""
    reach = f"{row['budget_flops'] / fitted_top:.3g}x the largest fitted budget"
    chance = "or noise (a 95% interval misses one run in twenty)"
    notes = []
    if row["verdict"] == "miss" and row["achieved"] > row["predicted_hi"]:
        notes.append(f"achieved worse than predicted: the law may be misspecified at these widths ({reach}), the "
                     f"learning rate may not transfer to width {int(row['width'])}, {chance}")
    elif row["verdict"] == "miss":
        notes.append(f"achieved better than predicted: the law may be misspecified at these widths ({reach}: the "
                     f"loss falls faster than it says), {chance}")
    if row["gap_verdict"] == "miss":
        notes.append("the achieved gap to r=1 lies outside its interval: a recurrence may be worth another phi at "
                     f"these widths, the learning rate may transfer differently across r, {chance}")
    return "; ".join(notes)


def compare(fit: LawFit, runs: pd.DataFrame, options: FitOptions) -> pd.DataFrame:
    """The rung runs of ``runs`` (stage ``validate``) against ``fit``'s prediction at the sizes they trained;
    empty when there are none, or when the fit's stage takes them in (``--stage all``)."""
    rungs = runs[(runs["stage"] == STAGE) & own_rows(runs)]  # a rung, not a branch point of one
    if rungs.empty or options.stage in (None, STAGE):  # a fit that holds the rungs cannot check them
        return pd.DataFrame()
    trained = rungs.drop_duplicates(["budget_flops", "r"])[["budget_flops", "r", "width", "N_once", "N_rec",
                                                           "tokens"]]
    trained = trained.sort_values(["budget_flops", "r"]).reset_index(drop=True)
    predicted = predictions(fit, trained, noise_residuals(fit, runs, options))
    fitted = runs[runs["stage"] == options.stage]
    return verdicts(predicted, rungs[rungs["status"] == "ok"], float(fitted["budget_flops"].max()))


def lines(table: pd.DataFrame, confidence: float = 0.95) -> list[str]:
    """The comparison as lines of the report (within ``numbers.COLUMNS``): each rung's predicted loss with its
    interval and the achieved one, each gap to r = 1 likewise, a miss with what it may mean."""
    if table.empty:
        return []
    hits = int((table["verdict"] == "hit").sum())
    misses = int((table["verdict"] == "miss").sum())
    pct = f"{100 * confidence:.0f}%"
    out = [f"validation rungs: {hits} hit, {misses} miss of {len(table)} (predicted: the sweep's law, with the "
           f"{pct} prediction interval of one run: its bootstrap draws plus the sweep's run-to-run scatter)"]
    for row in table.itertuples(index=False):
        head = f"  C={numbers.flops(row.budget_flops)} r={int(row.r)} width {int(row.width)}:"
        out.append(f"{head} predicted {_with_span(row.predicted, row.predicted_lo, row.predicted_hi)}, achieved "
                   f"{_value(row.achieved)}: {row.verdict}")
        if np.isfinite(row.gap_predicted):
            out.append(f"{' ' * len(head)} gap to r=1 predicted "
                       f"{_with_span(row.gap_predicted, row.gap_lo, row.gap_hi, signed=True)}, achieved "
                       f"{_value(row.gap_achieved, signed=True)}: {row.gap_verdict}")
        if row.note:
            out.append(f"{' ' * len(head)} {row.note}")
    return numbers.wrap("\n".join(out)).split("\n")


def _value(x: float, signed: bool = False) -> str:
    if not np.isfinite(x):
        return "none"
    return f"{x:+.3f}" if signed else numbers.loss(x)


def _with_span(x: float, lo: float, hi: float, signed: bool = False) -> str:
    span = f" ({_value(lo, signed)} to {_value(hi, signed)})" if np.isfinite(lo) and np.isfinite(hi) else ""
    return _value(x, signed) + span


def band(fit: LawFit, rungs: pd.DataFrame, fitted_budgets, *, template, batch_tokens: int,
         points: int = 24) -> pd.DataFrame:
    """The law's compute-optimal loss per r of the rungs from the sweep's smallest budget to past its largest
    rung, with the interval of its mean (``intervals.with_intervals``): loss, loss_lo, loss_hi by budget_flops
    and r."""
    from .intervals import spread_of, with_intervals

    budgets = np.geomspace(min(fitted_budgets), 1.5 * rungs["budget_flops"].max(), points)
    recurrences = sorted(int(r) for r in rungs["r"].unique())
    table = allocation_table(fit, budgets, recurrences, template=template, batch_tokens=batch_tokens)
    table = with_intervals(table, spread_of(fit)[0], template=template, batch_tokens=batch_tokens)
    return table[["budget_flops", "r", "loss", "loss_lo", "loss_hi"]]


def mlflow_metrics(table: pd.DataFrame) -> dict[str, float]:
    """The comparison as metrics of the analysis run: counts, and per rung its predicted, interval and achieved
    loss (``validate_r<r>_C<budget>_...``)."""
    if table.empty:
        return {}
    metrics = {"validate_rungs": float(len(table)), "validate_hits": float((table["verdict"] == "hit").sum())}
    for row in table.itertuples(index=False):
        name = f"validate_r{int(row.r)}_C{row.budget_flops:.3e}".replace("+", "")
        for column in ("predicted", "predicted_lo", "predicted_hi", "achieved", "gap_predicted", "gap_achieved"):
            value = getattr(row, column)
            if np.isfinite(value):
                metrics[f"{name}_{column}"] = float(value)
    return metrics
