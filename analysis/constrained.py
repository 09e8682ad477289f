"""Allocation under constraints: the best r and width at a budget when the model must fit a parameter or a memory
cap, and what it costs to serve.

A cap is a largest buildable width per r: ``--max-params P`` caps N = N_once + N_rec (the law's unique
non-embedding parameters; embedding and LM head are not counted, as in the paper), ``--max-memory M`` caps the
bytes of serving, weights + KV cache of ``batch`` sequences of ``context`` tokens in ``dtype``
(``model.inference``). Both grow with width, so the widths that fit are those up to the largest one that does
(analysis/constraints.py: the constraints, their flags and ``largest_width``). At a fixed budget the law's loss
falls with width up to the compute-optimal width and rises after it, so the best model under a cap is today's
allocation (``allocation.allocation_table``) with its continuous optimum clamped to that width: the same code
picks the buildable model, with or without a cap, and ``tests/test_constrained.py`` checks the choice against a
brute-force search over every buildable width and r.

Columns added to the allocation table:
  capped                   the cap binds: the model is narrower than the compute-optimal one
  best                     true on the one row per budget whose r and width give the lowest loss (under the
                           constraints where there are any)
  loop_wins_below_N        for r > 1, the cap on N below which r beats r = 1 at this budget, under the law with
                           continuous widths (``loop_wins_below``): at every cap above it r = 1 is at least as
                           good (inf: r wins even uncapped; NaN: never, from the smallest cap both build at),
                           with _lo/_hi over the law's spread
  weight_bytes, kv_bytes, memory_bytes  serving memory at the stated context, batch and dtype
  forward_flops_per_token, serving_flops, lifetime_flops  serving ``inference_tokens`` tokens at that context,
                           and training (flops_built) plus serving
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from loopscale.model import DTYPE_BYTES, JointLaw, inference

from . import numbers
from .allocation import allocation_table, optimal_width
from .constraints import Constraints, largest_width
from .fit_types import LawFit
from .intervals import LawSpread, with_intervals
from .sizes import PAPER_BATCH_TOKENS, SizeCurve


def allocation_under(law: LawFit | JointLaw, budgets, recurrences, constraints: Constraints, spread: LawSpread | None,
                     *, template: dict[str, Any] | None = None, batch_tokens: int = PAPER_BATCH_TOKENS) -> pd.DataFrame:
    """``allocation_table`` with intervals (``intervals.with_intervals``) under ``constraints``, with the columns
    of the module docstring."""
    point = law.law if isinstance(law, LawFit) else law
    curves = {r: SizeCurve.from_model(r, template) for r in {1, *recurrences}}
    caps = {r: largest_width(curves[r], constraints) for r in recurrences}
    table = allocation_table(point, budgets, recurrences, template=template, batch_tokens=batch_tokens,
                             max_widths=caps)
    table = with_intervals(table, spread, template=template, batch_tokens=batch_tokens, max_widths=caps)
    table["capped"] = table["width"] > table["r"].map(caps)
    table["best"] = _best(table)
    table = table.join(_loop_wins(point, spread, curves, table))
    return table.join(_serving(curves, table, constraints))


def _best(table: pd.DataFrame) -> pd.Series:
    """True on the first row of lowest loss_built per budget."""
    best = table.groupby("budget_flops", sort=False)["loss_built"].idxmin()
    return table.index.isin(best.to_numpy())


def _loop_wins(law: JointLaw, spread: LawSpread | None, curves: dict[int, SizeCurve],
               table: pd.DataFrame) -> pd.DataFrame:
    """``loop_wins_below_N`` of every row (NaN at r = 1), with its interval over ``spread``'s laws."""
    columns = {"loop_wins_below_N": [], "loop_wins_below_N_lo": [], "loop_wins_below_N_hi": []}
    for _, row in table.iterrows():
        r, budget = int(row["r"]), float(row["budget_flops"])
        if r == 1:
            values = [np.nan, np.nan, np.nan]
        else:
            point = loop_wins_below(law, curves[r], curves[1], budget)
            values = [point, np.nan, np.nan]
            if spread is not None:
                constants = spread.laws.to_dict()
                laws = [JointLaw(**{k: float(np.ravel(v)[i]) for k, v in constants.items()})
                        for i in range(np.size(spread.laws.phi))]
                draws = np.array([loop_wins_below(each, curves[r], curves[1], budget) for each in laws])
                values[1:] = map(float, spread.bounds(draws))
        for name, value in zip(columns, values):
            columns[name].append(value)
    return pd.DataFrame(columns, index=table.index)


def loop_wins_below(law: JointLaw, curve: SizeCurve, base: SizeCurve, budget: float) -> float:
    """The cap on N below which ``curve``'s r beats r = 1 (``base``) at ``budget``, under the law with widths
    taken continuously: each r's model is its compute-optimal one, or under a cap P the one with N = P where that
    is narrower (the loss falls with width up to the optimum), trained on C / F tokens. Above the cap returned,
    r = 1 is at least as good at every cap. Buildable models move in steps of one head, so near this cap the
    table's ``best`` may go either way."""
    optima = [optimal_width(law, c, budget) for c in (curve, base)]
    top = max(float(c.sizes(w)["N"]) for c, w in zip((curve, base), optima))
    bottom = max(float(c.sizes(c.head_dim)["N"]) for c in (curve, base))  # the smallest cap both r build at

    def gap(log_cap):
        losses = []
        for c, optimum in zip((curve, base), optima):
            sizes = c.sizes(np.minimum(optimum, c.width_where("N", np.exp(log_cap))))
            losses.append(law.loss(sizes["N_once"], sizes["N_rec"], c.r, budget / sizes["F"]))
        return losses[0] - losses[1]

    grid = np.linspace(np.log(bottom), np.log(top), 400)
    wins = gap(grid) < 0
    if wins[-1]:
        return np.inf
    if not wins.any():
        return np.nan
    i = np.flatnonzero(wins)[-1]
    return float(np.exp(brentq(gap, grid[i], grid[i + 1], xtol=1e-12)))


def _serving(curves: dict[int, SizeCurve], table: pd.DataFrame, constraints: Constraints) -> pd.DataFrame:
    """Serving memory and FLOPs of each row's built model (``model.inference``)."""
    size = DTYPE_BYTES[constraints.dtype]
    rows = []
    for _, row in table.iterrows():
        curve = curves[int(row["r"])]
        context = constraints.context_of(curve)
        cost = inference(curve.config(int(row["width_built"])), context)
        kv = cost.kv_bytes_per_token(size) * context * constraints.batch
        serving = constraints.inference_tokens * cost.forward_flops_per_token
        rows.append({"weight_bytes": cost.weight_bytes(size), "kv_bytes": kv,
                     "memory_bytes": cost.memory_bytes(constraints.batch, size),
                     "forward_flops_per_token": cost.forward_flops_per_token, "serving_flops": serving,
                     "lifetime_flops": float(row["flops_built"]) + serving})
    return pd.DataFrame(rows, index=table.index)


# The short table's columns under constraints, after ``allocation.buildable``'s: column -> header.
SHORT = {"best": "best", "loop_wins_below_N": "loop wins below N", "loop_wins_below_N_lo": "loop wins below N lo",
         "loop_wins_below_N_hi": "loop wins below N hi", "capped": "capped", "memory_bytes": "memory (bytes)",
         "flops_built": "train FLOPs", "serving_flops": "serve FLOPs", "lifetime_flops": "lifetime FLOPs"}


def short_table(table: pd.DataFrame, constraints: Constraints) -> pd.DataFrame:
    """``allocation.buildable``'s table with ``best`` and the cap below which looping wins; with ``capped`` under a
    cap, the memory under a memory cap, and training, serving and lifetime FLOPs when tokens are served."""
    from .allocation import buildable

    wanted = ["best", "loop_wins_below_N"] + [c for c in ("loop_wins_below_N_lo", "loop_wins_below_N_hi")
                                              if table[c].notna().any()]
    wanted += ["capped"] * constraints.capped + ["memory_bytes"] * (constraints.max_memory is not None)
    wanted += ["flops_built", "serving_flops", "lifetime_flops"] * bool(constraints.inference_tokens)
    return buildable(table).join(table[wanted].rename(columns=SHORT))


def readable_table(short: pd.DataFrame) -> pd.DataFrame:
    """``allocation.readable`` of ``short_table``, its own columns formatted alike (counts with 3 significant
    figures, the cap's interval as one ``lo-hi`` column, "any" for a cap looping wins at uncapped)."""
    from .allocation import readable

    def text(value, form) -> str:
        if isinstance(value, (bool, np.bool_)):
            return str(bool(value))
        return "" if np.isnan(value) else "any" if np.isinf(value) else form(value)

    out = readable(short)
    for header in SHORT.values():
        if header in short and not header.endswith((" lo", " hi")):
            form = numbers.flops if "FLOPs" in header else numbers.count
            out[header] = [text(v, form) for v in short[header]]
    if "loop wins below N lo" in short:
        spans = [numbers.span(lo, hi, numbers.count) if np.isfinite([lo, hi]).all() else ""
                 for lo, hi in zip(short["loop wins below N lo"], short["loop wins below N hi"])]
        out.insert(out.columns.get_loc("loop wins below N") + 1, "loop wins below N lo-hi", spans)
    return out


def loop_wins_text(value: float, low: float = np.nan, high: float = np.nan) -> str:
    """``loop_wins_below_N`` in words, with its interval where it has one."""
    if np.isnan(value):
        return "never beats r=1 (at every cap both build at, r=1 is at least as good)"
    if np.isinf(value):
        return "beats r=1 at every cap, uncapped too"
    span = numbers.span(low, high, numbers.count) if np.isfinite(low) and np.isfinite(high) else ""
    return f"beats r=1 under caps on N below {numbers.count(value)}" + (f" ({span})" if span else "")
