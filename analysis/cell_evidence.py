"""The model-free side of a comparison: in every (budget, r) cell both sweeps ran, which reached the lower loss.

Per matched cell, each sweep's optimal loss is its IsoFLOP optimum L* where the cell has an interior one
(``analysis.isoflop``), else its best trial's loss. The difference L*_B - L*_A (negative: B is better) gets an
interval from the trial noise: the percentile interval of the differences of the two cells' bootstrap draws of
L* when both have an optimum (each cell's own trials, so the draws are independent), else
+- z sqrt(sigma_A^2 + sigma_B^2) with each sweep's pooled trial noise sigma (``isoflop.pooled_sigma``). No law
is fitted: this is the evidence a reader can check by eye against the law's Delta-phi.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from .borrow import budget_keys
from .isoflop import IsoflopResult, cell_optima, pooled_sigma
from .runs import usable_runs


# Why a matched cell has no interval: neither its optima's draws nor a pooled noise estimate (``pooled_sigma``)
NO_NOISE = ("no trial noise is measured in a sweep whose every cell has at most 3 runs, which its parabola fits "
            "exactly, or fewer than 3 sizes: more trials_per_cell")


def matched_cells(runs_a: pd.DataFrame, runs_b: pd.DataFrame, *, stage: str | None, n_bootstrap: int, seed: int,
                  confidence: float) -> pd.DataFrame:
    """One row per (budget, r) cell both sweeps ran themselves: each one's optimal loss, how it was read, the
    difference B - A and its interval."""
    used = [usable_runs(t, stage=stage) for t in (runs_a, runs_b)]
    optima = [cell_optima(u, stage=None, n_bootstrap=n_bootstrap, seed=seed, confidence=confidence) for u in used]
    sigmas = [pooled_sigma([cell for _, cell in u.groupby(["budget_flops", "r"])]) for u in used]
    keyed = [_by_cell(u, o) for u, o in zip(used, optima)]
    tail = 100 * (1 - confidence) / 2
    z = stats.norm.ppf(1 - tail / 100)
    rows = []
    for key in sorted(set(keyed[0]) & set(keyed[1])):
        (loss_a, draws_a, how_a), (loss_b, draws_b, how_b) = keyed[0][key], keyed[1][key]
        both = draws_a is not None and draws_b is not None
        pair = np.isfinite(draws_a) & np.isfinite(draws_b) if both else np.zeros(0, bool)
        if pair.any():
            lo, hi = np.percentile(draws_b[pair] - draws_a[pair], [tail, 100 - tail])
        else:
            half = z * np.hypot(*sigmas)
            lo, hi = loss_b - loss_a - half, loss_b - loss_a + half
        rows.append({"budget_flops": key[0], "r": key[1], "loss_a": loss_a, "loss_b": loss_b, "read_a": how_a,
                     "read_b": how_b, "difference": loss_b - loss_a, "lo": float(lo), "hi": float(hi)})
    return pd.DataFrame(rows, columns=["budget_flops", "r", "loss_a", "loss_b", "read_a", "read_b", "difference",
                                       "lo", "hi"])


def _by_cell(used: pd.DataFrame, optima: IsoflopResult) -> dict[tuple[float, int], tuple]:
    """(budget key, r) -> (optimal loss, its bootstrap draws of L* or None, 'optimum' or 'best trial')."""
    out = {}
    table = optima.table.assign(key=budget_keys(optima.table["budget_flops"]))
    best = used.assign(key=budget_keys(used["budget_flops"])).groupby(["key", "r"])["val_loss"].min()
    for row in table.itertuples(index=False):
        cell = (float(row.key), int(row.r))
        if row.status == "ok":
            # a cell without a noise estimate has its point as every draw: no interval from those
            draws = optima.draws[(float(row.budget_flops), int(row.r))][:, 2] if np.isfinite(row.L_lo) else None
            out[cell] = (float(row.L_opt), draws, "optimum")
        else:
            out[cell] = (float(best[cell]), None, "best trial")
    return out


def evidence_text(cells: pd.DataFrame, name_a: str, name_b: str, confidence: float) -> list[str]:
    """The matched cells in a few lines: how many favour B, how many clearly, and each difference."""
    if cells.empty:
        return ["matched cells: none (the sweeps share no (budget, r) cell of their own runs)"]
    favour = int((cells["difference"] < 0).sum())
    clear_b, clear_a = int((cells["hi"] < 0).sum()), int((cells["lo"] > 0).sum())
    missing = int((~np.isfinite(cells["lo"]) | ~np.isfinite(cells["hi"])).sum())
    pct = f"{100 * confidence:.0f}%"
    lines = [f"matched cells (model-free): {favour} of {len(cells)} favour {name_b} (lower loss); {clear_b} "
             f"clearly ({pct} interval below 0), {clear_a} clearly favour {name_a}"
             + (f"; {missing} without an interval ({NO_NOISE})" if missing else "")]
    lines += [f"  C={row.budget_flops:.3g} r={row.r}: {row.difference:+.4f} nats ("
              + (f"{pct} CI {row.lo:+.4f} to {row.hi:+.4f}" if np.isfinite(row.lo) and np.isfinite(row.hi)
                 else "no interval") + f"; {row.read_a} vs {row.read_b})" for row in cells.itertuples(index=False)]
    return lines
