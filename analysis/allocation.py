"""Compute-optimal allocation tables from a fitted (or published) joint law.

For a budget C and r, the template fixes every size as a function of width d (``analysis.sizes``, read off
``model``), and tokens follow from the budget, D = C / F(d). The compute-optimal width minimises

    L(d) = E + A * (N_once(d) + r^phi N_rec(d))^(-alpha) + B * (C / F(d))^(-beta)

over a continuous d (a grid in log d, then Brent's method); ``width_built`` is the better of the two buildable
widths (multiples of head_dim) around it, trained for whole optimizer steps (``model.tokens_for_budget``).

Columns next to the optimum answer the paper's questions (Schwethelm et al. 2026; docs/paper.md, "What it
finds": r = 4 with 410M unique parameters performs like a 580M non-looped model, (4 + 4^0.46 * 4) / 20 ~ 0.58,
at the training cost of a 1B one):
  tokens_per_param         D / N (unique parameters)
  tokens_per_flop_param    D / (F / 6): tokens per parameter as the compute counts them (a looped block
                           counts r times), the ratio that stays comparable across r at equal cost
  loss_gap_to_r1           L*_r(C) - L*_1(C), nats
  same_cost_r1_N           N of the non-looped model with the same FLOPs per token (same C, same D)
  equiv_r1_width / _flops  the non-looped model with N = N_eff (same predicted loss on the same D tokens) and
                           the compute it needs, F_1(d_eq) * D
  r1_optimal_flops_to_match  the budget at which the compute-optimal non-looped model reaches the same loss

``buildable`` keeps what a user builds and trains: budget, r, built width and heads, N, D, D/N and loss, with
units in the column names; ``readable`` formats it for reading (Markdown, LaTeX, the terminal).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from loopscale.model import JointLaw, tokens_for_budget

from . import numbers
from .fit_types import LawFit
from .sizes import PAPER_BATCH_TOKENS, SizeCurve

LOG_WIDTH_RANGE = (np.log(8.0), np.log(1e6))


def allocation_table(fit: LawFit | JointLaw, budgets, recurrences, *, template: dict[str, Any] | None = None,
                     batch_tokens: int = PAPER_BATCH_TOKENS, max_widths: dict[int, float] | None = None
                     ) -> pd.DataFrame:
    """One row per (budget, r): the compute-optimal model under ``fit``'s law for the iso-depth ``template``
    (default: the paper's); its buildable model no wider than ``max_widths[r]`` where given (a cap on size:
    analysis/constrained.py)."""
    law = fit.law if isinstance(fit, LawFit) else fit
    budgets = [float(c) for c in budgets]
    recurrences = [int(r) for r in recurrences]
    if not budgets or not recurrences:
        raise ValueError("allocation needs at least one budget and one r")
    if not all(np.isfinite(c) and c > 0 for c in budgets):
        raise ValueError(f"budgets must be positive FLOP counts, got {budgets}")
    if batch_tokens <= 0:
        raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
    curves = {r: SizeCurve.from_model(r, template) for r in {1, *recurrences}}
    rows = []
    for budget in budgets:
        base_width = optimal_width(law, curves[1], budget)
        base_loss = _loss(law, curves[1], base_width, budget)
        for r in recurrences:
            max_width = (max_widths or {}).get(r, np.inf)
            rows.append(_row(law, curves[r], curves[1], budget, base_loss, batch_tokens, max_width))
            if np.isnan(rows[-1]["width_built"]):  # the continuous optimum would be a model nobody can train
                raise ValueError(f"budget {budget:.3g} FLOPs buys no optimizer step of {batch_tokens} tokens at "
                                 f"r={r} for any buildable width (the narrowest is one head, width "
                                 f"{curves[r].head_dim}); use a larger budget")
    table = pd.DataFrame(rows)
    table["r1_optimal_flops_to_match"] = budgets_to_reach(law, curves[1], table["loss"], table["budget_flops"])
    return table


def stacked(laws: Sequence[JointLaw]) -> JointLaw:
    """K laws as one ``JointLaw`` whose constants are (K, 1) arrays: evaluated on a row of widths (1, G) it gives
    every law's losses at once (K, G)."""
    return JointLaw(**{name: np.array([[getattr(law, name)] for law in laws], dtype=float)
                       for name in ("E", "A", "alpha", "B", "beta", "phi")})


def optimal_width(law: JointLaw, curve: SizeCurve, budget: float) -> float:
    """The continuous width minimising the predicted loss at ``budget``."""
    return float(optimal_widths(stacked([law]), curve, budget)[0])


def optimal_widths(laws: JointLaw, curve: SizeCurve, budget) -> np.ndarray:
    """(K,) the continuous width minimising each of ``stacked`` laws' predicted loss at ``budget`` (one for all,
    or (K,) one per law): the best of a grid of 400 log-widths, then golden-section search (Kiefer 1953) between
    its neighbours to 1e-10 in log width, all laws at once."""
    if np.ndim(budget):
        budget = np.asarray(budget, dtype=float).reshape(-1, 1)
    grid = np.linspace(*LOG_WIDTH_RANGE, 400)
    i = np.argmin(_loss(laws, curve, np.exp(grid)[None, :], budget), axis=1)
    lo, hi = grid[np.maximum(i - 1, 0)], grid[np.minimum(i + 1, grid.size - 1)]

    def f(u: np.ndarray) -> np.ndarray:
        return _loss(laws, curve, np.exp(u)[:, None], budget)[:, 0]

    ratio = (np.sqrt(5.0) - 1) / 2
    a, b = lo + (1 - ratio) * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = f(a), f(b)
    while (hi - lo).max() > 1e-10:
        left = fa <= fb  # the minimum lies in [lo, b]: b becomes the upper end, a the new b
        lo, hi = np.where(left, lo, a), np.where(left, b, hi)
        new = np.where(left, lo + (1 - ratio) * (hi - lo), lo + ratio * (hi - lo))
        f_new = f(new)
        a, b, fa, fb = (np.where(left, new, b), np.where(left, a, new),
                        np.where(left, f_new, fb), np.where(left, fa, f_new))
    return np.exp((lo + hi) / 2)


def _loss(law: JointLaw, curve: SizeCurve, width, budget: float):
    sizes = curve.sizes(width)
    return law.loss(sizes["N_once"], sizes["N_rec"], curve.r, budget / sizes["F"])


def _row(law: JointLaw, curve: SizeCurve, base: SizeCurve, budget: float, base_loss: float,
         batch_tokens: int, max_width: float) -> dict[str, Any]:
    width = optimal_width(law, curve, budget)
    sizes = curve.sizes(width)
    tokens = budget / sizes["F"]
    loss = float(law.loss(sizes["N_once"], sizes["N_rec"], curve.r, tokens))
    n_eff = float(law.n_eff(sizes["N_once"], sizes["N_rec"], curve.r))
    built = _built(law, curve, min(width, max_width), budget, batch_tokens)
    same_cost_width = base.width_where("F", sizes["F"])
    equiv_width = float(base.width_where("N", n_eff))
    return {
        "budget_flops": budget, "r": curve.r, "s": width / curve.width_unit, "width": width,
        "N_once": float(sizes["N_once"]), "N_rec": float(sizes["N_rec"]), "N": float(sizes["N"]), "N_eff": n_eff,
        "tokens": tokens, "tokens_per_param": tokens / float(sizes["N"]),
        "tokens_per_flop_param": 6 * tokens / float(sizes["F"]), "flops_per_token": float(sizes["F"]),
        "loss": loss, "loss_gap_to_r1": loss - base_loss, **built,
        "same_cost_r1_N": float(base.sizes(same_cost_width)["N"]),
        "equiv_r1_width": equiv_width, "equiv_r1_flops": float(base.sizes(equiv_width)["F"]) * tokens,
    }


def _built(law: JointLaw, curve: SizeCurve, width: float, budget: float, batch_tokens: int) -> dict[str, Any]:
    """The better buildable model next to the continuous optimum ``width``, trained for whole steps. A width
    capped at a buildable one (a multiple of head_dim) builds exactly that: the loss at fixed budget falls with
    width up to the optimum, so under a cap below it the widest model allowed is the best."""
    built = {name: values[0].item() for name, values in
             built_models(stacked([law]), curve, np.array([width]), budget, batch_tokens).items()}
    whole = ("width_built", "heads_built")  # counts read as such (51552, not 51552.0)
    built = {name: int(v) if name in whole and np.isfinite(v) else v for name, v in built.items()}
    if np.isfinite(built["width_built"]):  # the exact count, past float64's 2^53 too
        built["tokens_built"] = tokens_for_budget(curve.config(built["width_built"]), budget, batch_tokens)
    else:
        built["tokens_built"] = 0
    return built


def built_models(laws: JointLaw, curve: SizeCurve, widths: np.ndarray, budget: float,
                 batch_tokens: int) -> dict[str, np.ndarray]:
    """(K,) per ``stacked`` law k, the better of the two buildable widths (multiples of head_dim) around its
    continuous optimum ``widths[k]`` under that law, trained for whole optimizer steps
    (``model.tokens_for_budget``); NaN where neither trains a step."""
    unit = curve.head_dim
    below = np.maximum(unit, np.floor(widths / unit) * unit)
    above = np.maximum(unit, np.ceil(widths / unit) * unit)
    tokens_of = {w: tokens_for_budget(curve.config(int(w)), budget, batch_tokens)
                 for w in np.unique(np.concatenate([below, above]))}
    choices = []
    for candidate in (below, above):
        tokens = np.array([tokens_of[w] for w in candidate], dtype=float)
        sizes = curve.sizes(candidate[:, None])
        with np.errstate(divide="ignore"):
            loss = laws.loss(sizes["N_once"], sizes["N_rec"], curve.r, tokens[:, None])[:, 0]
        choices.append((candidate, tokens, np.where(tokens > 0, loss, np.inf)))
    (w0, t0, l0), (w1, t1, l1) = choices
    take = l1 < l0
    width, tokens, loss = np.where(take, w1, w0), np.where(take, t1, t0), np.minimum(l0, l1)
    trains = np.isfinite(loss)
    width = np.where(trains, width, np.nan)
    sizes = curve.sizes(width)
    return {"width_built": width, "s_built": width / curve.width_unit, "heads_built": width // unit,
            "N_built": sizes["N"], "tokens_built": np.where(trains, tokens, 0),
            "flops_built": np.where(trains, sizes["F"] * tokens, 0.0), "loss_built": np.where(trains, loss, np.nan)}


def budgets_to_reach(law: JointLaw, base: SizeCurve, losses, budgets) -> np.ndarray:
    """(K,) per row the budget C' at which the compute-optimal non-looped model reaches ``losses[k]``,
    L*_1(C') = losses[k], searched from ``budgets[k]``: L*_1 falls monotonically with compute, so a bracket
    around log C widened in steps of 2 (to e^60 times the budget either way: 0 where even e^-60 of it reaches the
    loss, inf where e^60 of it does not, or the loss is at or below E), then bisection to 1e-10 in log C, all rows
    at once (one ``optimal_widths`` of K rows per step)."""
    losses = np.asarray(losses, dtype=float)
    start = np.log(np.asarray(budgets, dtype=float))
    laws = stacked([law] * losses.size)

    def gap(log_c: np.ndarray) -> np.ndarray:
        c = np.exp(log_c)
        return _loss(law, base, optimal_widths(laws, base, c), c) - losses

    answer = np.where(losses <= law.E, np.inf, np.nan)

    def widen(edge: np.ndarray, step: float, beyond: Callable, too_far: float) -> np.ndarray:
        """``edge`` moved by ``step`` until the root is on its inner side; rows gone 60 past ``start`` (e^60
        times the budget either way: the loss is no bound) get ``too_far`` as their answer."""
        while (open_ := np.isnan(answer) & beyond(gap(edge))).any():
            edge = edge + np.where(open_, step, 0.0)
            answer[open_ & (np.abs(edge - start) > 60)] = too_far
        return edge

    lo = widen(start - 2.0, -2.0, lambda g: g < 0, 0.0)
    hi = widen(start + 2.0, 2.0, lambda g: g > 0, np.inf)
    for _ in range(int(np.ceil(np.log2((hi - lo).max() / 1e-10)))):
        middle = (lo + hi) / 2
        above = gap(middle) > 0  # L*_1 there is still above the loss: the root lies beyond
        lo, hi = np.where(above, middle, lo), np.where(above, hi, middle)
    return np.where(np.isnan(answer), np.exp((lo + hi) / 2), answer)


# The short table: the buildable model per (budget, r); column -> header with its unit.
BUILDABLE = {"budget_flops": "budget (FLOPs)", "r": "r", "width_built": "width", "heads_built": "heads",
             "N_built": "N (params)", "tokens_built": "D (tokens)", "tokens_per_param_built": "D/N",
             "loss_built": "loss (nats)"}


# Its intervals, where the table has them (analysis/intervals.py): column -> header.
BUILDABLE_INTERVALS = {"N_built_lo": "N lo", "N_built_hi": "N hi", "tokens_built_lo": "D lo",
                       "tokens_built_hi": "D hi", "loss_built_lo": "loss lo", "loss_built_hi": "loss hi"}


def buildable(table: pd.DataFrame) -> pd.DataFrame:
    """The buildable model of each row of an ``allocation_table``: N is the built model's unique
    non-embedding parameters, D its tokens for whole optimizer steps; with their intervals where the table
    has them (``intervals.with_intervals``)."""
    columns = list(BUILDABLE) + [c for c in BUILDABLE_INTERVALS if c in table]
    short = table.assign(tokens_per_param_built=table["tokens_built"] / table["N_built"])[columns]
    counts = ["r", "width_built", "heads_built", "N_built", "tokens_built"]
    if short[counts].notna().all().all():  # whole numbers read as such (51552, not 51552.0)
        # those that fit: the tokens of a 1e50-FLOP budget do not (int64 ends at 9.2e18)
        short = short.astype({c: "int64" for c in counts if short[c].map(abs).max() < 2**63})
    return short.rename(columns={**BUILDABLE, **BUILDABLE_INTERVALS})


def readable(short: pd.DataFrame) -> pd.DataFrame:
    """``buildable``'s table as text in one format per column (analysis/numbers.py): budgets as 1.00e18, counts
    with a k/M/B/T suffix and 3 significant figures (412M, 8.21B), D/N with one decimal, loss with three; each
    interval as one column ``<quantity> lo-hi`` of ``low-high`` ranges in its quantity's format."""
    formats = {"budget (FLOPs)": numbers.flops, "r": _integer, "width": _integer, "heads": _integer,
               "N (params)": numbers.count, "D (tokens)": numbers.count, "D/N": "{:.1f}".format,
               "loss (nats)": numbers.loss}
    text = {c: [("" if pd.isna(v) else formats[c](v)) for v in short[c]] for c in formats if c in short}
    for quantity, form in (("N", numbers.count), ("D", numbers.count), ("loss", numbers.loss)):
        if f"{quantity} lo" in short:
            text[f"{quantity} lo-hi"] = [numbers.span(lo, hi, form) for lo, hi in
                                            zip(short[f"{quantity} lo"], short[f"{quantity} hi"])]
    return pd.DataFrame(text)


def _integer(value: float) -> str:
    return str(int(value))


def outside_fitted(budgets, fitted_budgets) -> list[float]:
    """The budgets that lie outside the range of budgets the law was fitted on (extrapolations)."""
    lo, hi = min(fitted_budgets), max(fitted_budgets)
    return [float(c) for c in budgets if not lo * (1 - 1e-9) <= c <= hi * (1 + 1e-9)]


def r1_not_run(fitted_recurrences) -> str:
    """A warning ("" when r = 1 was run) for a law fitted without r = 1 runs: every comparison with r = 1 (the gap to
    r = 1, where r beats r = 1) reads the law at an r it was not fitted on, where r^phi N_rec = N_rec holds by the
    law's form alone, so it is extrapolated there as a budget outside the fitted ones is."""
    fitted = sorted({int(r) for r in fitted_recurrences})
    if not fitted or fitted[0] == 1:
        return ""
    return (f"r=1 was not run (the law was fitted on r = {', '.join(map(str, fitted))}): every comparison with r=1 "
            "(the gap to r=1, where r beats r=1) is the law extrapolated to r=1; `--baseline SWEEP` borrows a sweep's "
            "r = 1 runs")
