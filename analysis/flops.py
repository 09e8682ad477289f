"""FLOPs spent, and the figure they are measured against: the paper's fixed grid.

Schwethelm et al. 2026 ran a hindsight grid of 116 runs (docs/paper.md, "The grid": 4-6 widths per budget, the
same for every r in {1, 2, 4, 8}). What it cost follows from ``model``'s accounting, exactly as a sweep
counts its own trials: per run, training FLOPs per token times the tokens its budget buys in whole optimizer
steps (``tokens_for_budget``), which is a hair under the budget C. A sweep that covers those cells with the same
template and batch is compared with that figure (``paper_grid_reference``); any other sweep is not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from loopscale.model import LoopedConfig, account, tokens_for_budget

from .runs import own_rows, template_of
from .sizes import PAPER_BATCH_TOKENS, PAPER_TEMPLATE

# The paper's widths s per budget C (FLOPs), run for every r in PAPER_RECURRENCES.
PAPER_GRID: dict[float, tuple[int, ...]] = {
    4.64e17: (6, 8, 10, 12), 1e18: (6, 8, 10, 12, 14), 2.15e18: (8, 10, 12, 14, 16),
    4.64e18: (10, 12, 14, 16, 18, 20), 1e19: (12, 16, 18, 20, 24), 2.15e19: (18, 24, 28, 34)}
PAPER_RECURRENCES = (1, 2, 4, 8)


def run_flops(s: float, r: int, budget: float, template: dict[str, Any], batch_tokens: int) -> float:
    """Training FLOPs of one run at width s in cell (budget, r): F x the tokens the budget buys."""
    config = LoopedConfig.iso_depth(s, r, **template)
    return float(account(config).flops_per_token * tokens_for_budget(config, budget, batch_tokens))


def paper_grid_flops(template: dict[str, Any] | None = None, batch_tokens: int = PAPER_BATCH_TOKENS) -> float:
    """FLOPs of the paper's 116 runs (about 7.26e20 with the paper's template and batch)."""
    template = dict(PAPER_TEMPLATE if template is None else template)
    return sum(run_flops(s, r, budget, template, batch_tokens)
               for budget, widths in PAPER_GRID.items() for r in PAPER_RECURRENCES for s in widths)


def paper_grid_reference(budgets: Iterable[float], recurrences: Iterable[int], template: dict[str, Any],
                         batch_tokens: int) -> float | None:
    """The paper grid's FLOPs when a sweep covers its cells (every paper budget and r; more cells are allowed:
    the ``paper`` preset adds two cheap budgets below the paper's) with its template and batch; else None (not
    comparable). The share is then what the whole sweep spent against what the paper spent on its part."""
    covers = ({float(b) for b in budgets} >= set(PAPER_GRID)
              and {int(r) for r in recurrences} >= set(PAPER_RECURRENCES))
    same_model = all(template.get(k) == v for k, v in PAPER_TEMPLATE.items()) and batch_tokens == PAPER_BATCH_TOKENS
    return paper_grid_flops(template, batch_tokens) if covers and same_model else None


def flops_text(spent: float, reference: float | None) -> str:
    """``5.1e+20 FLOPs``, with its share of the paper grid's when comparable."""
    runs = sum(len(w) for w in PAPER_GRID.values()) * len(PAPER_RECURRENCES)
    share = f" ({spent / reference:.0%} of the paper grid's {reference:.3g} for its {runs} runs)" if reference else ""
    return f"{spent:.3g} FLOPs{share}"


def flops_spent(runs: pd.DataFrame) -> dict[str, Any]:
    """What a runs table spent: ``total`` (every run that reports it, calibration included), ``per_cell``
    (cell key -> FLOPs of its search runs) and ``paper_grid`` (the grid's figure when comparable, else None).
    A warmdown branch's row spent nothing of its own: its warmdown is in its trial's ``flops_spent``."""
    runs = runs[own_rows(runs)]
    spent = runs.assign(flops_spent=pd.to_numeric(runs.get("flops_spent"), errors="coerce").fillna(0.0))
    search = spent[spent["stage"] == "search"] if "stage" in spent else spent
    per_cell = {f"C={b:.3g},r={int(r)}": float(f) for (b, r), f in
                search.groupby(["budget_flops", "r"], sort=True)["flops_spent"].sum().items()}
    template, batch_tokens, _ = template_of(runs)
    reference = paper_grid_reference(search["budget_flops"].unique(), search["r"].unique(), template, batch_tokens)
    return {"total": float(spent["flops_spent"].sum()), "per_cell": per_cell, "paper_grid": reference}
