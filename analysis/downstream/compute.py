"""The gap to the reference r (r = 1 where the sweep ran it) at matched compute, per axis.

Per budget C both r and the reference ran, a(r, C) is the mean score of that cell's kept models (at their trained
r) and v(r, C) the variance of that mean over items (their se^2 summed, over the count squared). Over the B shared
budgets

    gap(r) = (1/B) sum_C [a(r, C) - a(ref, C)],    var = (1/B^2) sum_C [v(r, C) + v(ref, C)]

with the normal interval gap +- z sqrt(var): the accuracy a recurrence costs or buys at equal training compute,
its interval over the items only (a cell's kept model is one draw of its training seed).
"""

from __future__ import annotations

import math

import pandas as pd

from .accuracy import normal_interval


def reference_r(table: pd.DataFrame) -> int:
    """The r the others are compared with: 1 where it was run, else the smallest."""
    return int(table["r"].min())


def gap_at_compute(trained: pd.DataFrame, confidence: float = 0.95) -> dict[int, dict]:
    """For one axis' rows at their trained r: per r other than the reference, ``gap`` (a fraction), its ``ci``
    and the ``budgets`` it averages over (module docstring); an r sharing no budget with the reference is left
    out."""
    ref = reference_r(trained)
    cells = trained.groupby(["r", "budget_flops"]).agg(score=("score", "mean"), var=("se", lambda s: (s ** 2).sum()),
                                                        models=("score", "size"))
    cells["var"] = cells["var"] / cells["models"] ** 2
    out = {}
    for r in sorted(int(r) for r in trained["r"].unique() if r != ref):
        shared = sorted(set(cells.loc[r].index) & set(cells.loc[ref].index))
        if not shared:
            continue
        diffs = [cells.loc[(r, c), "score"] - cells.loc[(ref, c), "score"] for c in shared]
        var = sum(cells.loc[(r, c), "var"] + cells.loc[(ref, c), "var"] for c in shared) / len(shared) ** 2
        gap = sum(diffs) / len(diffs)
        out[r] = {"gap": float(gap), "ci": list(normal_interval(gap, math.sqrt(var), confidence)),
                  "budgets": len(shared)}
    return out
