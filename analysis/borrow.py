"""Borrowing another sweep's r = 1 runs: when it is sound, and the one way every command does it.

A sweep of looped models only (r = 2, 4, ...) cannot fit phi alone: the r = 1 runs anchor the base law that
r^phi scales (Schwethelm et al. 2026 compare designs this way: r = 1 has no loop to change). A run at r = 1 of
another sweep measures the same thing only when the two sweeps train the same model at r = 1 on the same loss:
what determines the r = 1 model the law sees equal, its N and FLOPs per token at each width, and the loss's
scale. That is checked on the runs themselves, not on how they were counted: the borrower's template must
reproduce the lender's r = 1 runs' N = N_once + N_rec (at r = 1, r^phi = 1: the split is a name) and FLOPs per
token (``sizes.template_mismatch``: depth, vocabulary, sequence length, widths, an own architecture whose plain
stack differs), and the two must share the objective, the batch and the vocabulary (the loss per token's scale).
An own architecture that is the built-in's plain stack at r = 1 is measured as the closed form counts it
(model/measured.py), so its sweep borrows the built-in's r = 1 runs.

``with_borrowed_r1`` is what compare, ``analyze --baseline``, ``predict --baseline`` and ``export --baseline``
call, so each gives the same phi for the same data.
"""

from __future__ import annotations

import pandas as pd

from .runs import template_of, usable_runs
from .sizes import template_mismatch

# template keys that set the loss's scale beyond the sizes (a vocabulary of 256 bytes against 4,096 BPE tokens)
LOSS_SCALE_KEYS = ("vocab_size", "seq_len")


def borrow_refusal(lender: pd.DataFrame, borrower: pd.DataFrame, stage: str | None) -> str:
    """'' when ``borrower`` may use ``lender``'s r = 1 runs, else why not, in words."""
    lent = usable_runs(lender, stage=stage)
    lent = lent[lent["r"] == 1]
    if lent.empty:
        return "the other sweep has no usable r = 1 runs"
    for column in ("objective", "batch_tokens"):
        if column in lender and column in borrower:
            theirs, ours = (set(t[column].dropna().astype(str)) - {""} for t in (lender, borrower))
            if theirs and ours and theirs != ours:
                return f"the sweeps differ in {column} ({', '.join(sorted(theirs))} vs {', '.join(sorted(ours))})"
    try:
        template_lent, _, _ = template_of(lender)
        template_own, _, _ = template_of(borrower)
    except ValueError as err:
        return f"cannot read the templates: {err}"
    for key in LOSS_SCALE_KEYS:
        if template_lent.get(key) != template_own.get(key):
            return f"the templates differ in {key} ({template_lent.get(key)} vs {template_own.get(key)})"
    mismatch = template_mismatch(lent, template_own)
    return f"the templates differ at r = 1: {mismatch}" if mismatch else ""


def with_borrowed_r1(own: pd.DataFrame, lender: pd.DataFrame, stage: str | None) -> tuple[pd.DataFrame, str]:
    """(``own`` with ``lender``'s usable r = 1 runs at ``own``'s budgets added, a line saying what was done).
    Nothing is borrowed by a sweep with r = 1 runs of its own, or from a template that is not equal
    (``borrow_refusal``); the line then says why."""
    used = usable_runs(own, stage=stage)
    if (used["r"] == 1).any():
        return own, "has r = 1 runs of its own: borrows none"
    refusal = borrow_refusal(lender, own, stage)
    if refusal:
        return own, f"borrows no r = 1 runs: {refusal}"
    lent = usable_runs(lender, stage=stage)
    lent = lent[(lent["r"] == 1) & budget_keys(lent["budget_flops"]).isin(set(budget_keys(used["budget_flops"])))]
    if lent.empty:
        return own, "borrows no r = 1 runs: the other sweep ran r = 1 at none of its budgets"
    return pd.concat([own, lent], ignore_index=True), f"borrows the other sweep's {len(lent)} r = 1 runs"


def budget_keys(budgets: pd.Series) -> pd.Series:
    """Budgets rounded to 6 significant digits, so 1e18 from two sweeps matches despite float noise."""
    return budgets.map(lambda c: float(f"{c:.6g}"))
