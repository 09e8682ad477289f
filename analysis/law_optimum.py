"""Compute-optimal N*(C) and D*(C) from the fitted law alone, for runs of any model family: the allocation of
a runs table that no iso-depth template builds (no ``width`` column, or the template's sizes disagree with the
runs'; ``report.template_mismatch``).

Without a template there is no width to optimise, so the cost of a model is taken from the runs themselves:
training FLOPs C = k N D, with N = N_once + N_rec the unique non-embedding parameters and D the tokens (Kaplan et
al. 2020, C ~ 6 N D; Hoffmann et al. 2022, eq. 2). Per r,

  k    = the median of flops_per_token / N over the runs of that r where the table has flops_per_token, else
         6 (N_once + r N_rec) / N: 6 FLOPs per parameter pass, a looped block passed r times (6 at r = 1);
  f    = the median share N_rec / N of its runs, so that N_eff = N_once + r^phi N_rec = m N, m = 1 - f + r^phi f.

The law L = E + A (m N)^-alpha + B D^-beta under D = C / (k N) has its minimum where dL/dN = 0:

  N*(C) = G (C / k)^(beta / (alpha + beta)),  G = (alpha A m^-alpha / (beta B))^(1 / (alpha + beta)),
  D*(C) = C / (k N*),

Hoffmann et al. 2022, eq. 4, with A m^-alpha in place of A. Each bootstrap draw of the constants gives its own
N*, D* and loss; their percentile intervals are the table's ``_lo`` / ``_hi`` columns (``intervals.LawSpread``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from loopscale.model import JointLaw

from . import numbers
from .allocation import BUILDABLE, BUILDABLE_INTERVALS, buildable
from .fit_types import LawFit
from .intervals import LawSpread

FLOPS_PER_PARAM_PASS = 6.0  # forward and backward: 2 + 4 FLOPs per parameter and token (Kaplan et al. 2020)
WITH_INTERVAL = ("N", "tokens", "loss")


@dataclass(frozen=True)
class RunCosts:
    """Per r of a runs table: ``k`` (training FLOPs per token and unique parameter), ``rec_share`` (N_rec / N),
    and ``note``, the line that says where k comes from."""

    k: dict[int, float]
    rec_share: dict[int, float]
    note: str

    @classmethod
    def of(cls, used: pd.DataFrame) -> RunCosts:
        """The costs of the (usable) runs ``used``; r = 1 is always included (the reference of the gap)."""
        n = used["N_once"] + used["N_rec"]
        k, share, measured = {}, {}, []
        for r in sorted({1, *(int(v) for v in used["r"].unique())}):
            mine = used["r"] == r
            share[r] = float((used["N_rec"][mine] / n[mine]).median()) if mine.any() else 0.0
            per_param = (used["flops_per_token"][mine] / n[mine]).dropna()
            if len(per_param):
                k[r] = float(per_param.median())
                measured.append(r)
            else:
                k[r] = FLOPS_PER_PARAM_PASS * (1 - share[r] + r * share[r])
        where = ", ".join(f"r={r} {numbers.sig(k[r])}" for r in k)
        if len(measured) == len(k):
            note = f"C = k N D with k from the runs' flops_per_token / N (median per r: {where})"
        elif not measured:
            note = f"C = k N D with k = 6 per parameter pass, the table has no flops_per_token (k: {where})"
        else:
            note = (f"C = k N D with k from the runs' flops_per_token / N where they have it, else 6 per "
                    f"parameter pass (k: {where})")
        return cls(k=k, rec_share=share, note=note)

    def check(self, recurrences) -> None:
        """A ValueError line for an r the runs say nothing of (the share of N_rec at that r is unknown)."""
        for r in recurrences:
            if int(r) not in self.k:
                raise ValueError(f"no template sizes models at r={int(r)} and the runs have none of that r "
                                 f"(they have r={', '.join(map(str, sorted(self.k)))}): ask for those")


def optimum(law: JointLaw, costs: RunCosts, budget: float, r: int) -> dict[str, np.ndarray]:
    """N*, D* and the loss at ``budget`` and ``r`` (module docstring), for a law or ``stacked`` laws (arrays)."""
    k, f = costs.k[r], costs.rec_share[r]
    m = 1 - f + np.power(float(r), law.phi) * f
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = (law.alpha * law.A * m ** -law.alpha / (law.beta * law.B)) ** (1 / (law.alpha + law.beta))
        n = scale * (budget / k) ** (law.beta / (law.alpha + law.beta))
        tokens = budget / (k * n)
        loss = law.E + law.A * (m * n) ** -law.alpha + law.B * tokens ** -law.beta
    finite = np.isfinite(n) & (n > 0) & np.isfinite(loss)  # alpha or beta 0: no interior optimum
    return {"N": np.where(finite, n, np.nan), "tokens": np.where(finite, tokens, np.nan),
            "loss": np.where(finite, loss, np.nan), "m": m}


def optimum_table(fit: LawFit | JointLaw, budgets, recurrences, *, costs: RunCosts,
                  spread: LawSpread | None = None) -> pd.DataFrame:
    """One row per (budget, r): the compute-optimal N (with N_once, N_rec by the runs' share), N_eff, D, D/N,
    k and the loss, its gap to r = 1 at the same budget, and ``<column>_lo`` / ``_hi`` for N, tokens and loss
    from ``spread`` (NaN without one)."""
    law = fit.law if isinstance(fit, LawFit) else fit
    costs.check(recurrences)
    rows = []
    for budget in (float(c) for c in budgets):
        base = optimum(law, costs, budget, 1)
        for r in (int(v) for v in recurrences):
            point = optimum(law, costs, budget, r)
            n, f = float(point["N"]), costs.rec_share[r]
            row = {"budget_flops": budget, "r": r, "N": n, "N_once": n * (1 - f), "N_rec": n * f,
                   "N_eff": float(point["m"] * n), "tokens": float(point["tokens"]),
                   "tokens_per_param": float(point["tokens"]) / n, "flops_per_param_token": costs.k[r],
                   "loss": float(point["loss"]), "loss_gap_to_r1": float(point["loss"] - base["loss"])}
            drawn = optimum(spread.laws, costs, budget, r) if spread is not None else None
            for column in WITH_INTERVAL:
                low, high = spread.bounds(drawn[column][:, 0]) if drawn is not None else (np.nan, np.nan)
                row[f"{column}_lo"], row[f"{column}_hi"] = float(low), float(high)
            rows.append(row)
    return pd.DataFrame(rows)


# The short table of a law optimum: ``allocation.buildable``'s columns and headers without the built model's
# width and heads (the continuous optimum's N and D in place of the built model's), so ``readable`` formats both.
SHORT = {column.replace("_built", ""): header for column, header in (*BUILDABLE.items(),
                                                                      *BUILDABLE_INTERVALS.items())
         if column not in ("width_built", "heads_built")}


def short_table(table: pd.DataFrame) -> pd.DataFrame:
    """What a user plans with, per (budget, r): ``allocation.buildable`` for a template's allocation table, and
    for a law optimum (``optimum_table``) budget, r, N*, D*, D/N and loss with their intervals."""
    if "width_built" in table:
        return buildable(table)
    return table[[c for c in SHORT if c in table]].rename(columns=SHORT)
