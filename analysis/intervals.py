"""Intervals on what a law predicts (the compute-optimal N*, D* and loss of an allocation, a given model's loss)
under the uncertainty of the law's constants.

From a fit (``LawFit``): each bootstrap draw of the constants (``LawFit.draws``) is a law; a quantity is computed
under every one of them, and its interval is the percentile interval of those values at the fit's confidence
(the percentile bootstrap, Efron & Tibshirani 1993, ch. 13). These are the draws behind the constants' own
intervals, so a quantity's interval carries their joint uncertainty, correlations included.

From the published law (Schwethelm et al. 2026; docs/paper.md): the paper gives an interval for phi alone (95%
CI 0.41 to 0.53, ``model.PAPER_PHI_CI``) and none for the other constants. There the interval is the range of
the quantity over phi at the two ends of its interval and at the point, the other constants held: phi's share of
the uncertainty only, and said so (at r = 1, where phi plays no part, it is the point itself).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loopscale.model import PAPER_LAW, PAPER_PHI_CI, JointLaw

from . import numbers
from .allocation import built_models, optimal_widths, stacked
from .fit_types import CONSTANTS, LawFit
from .sizes import PAPER_BATCH_TOKENS, SizeCurve

# allocation_table columns that get an interval: <column>_lo and <column>_hi
WITH_INTERVAL = ("N", "tokens", "loss", "N_built", "tokens_built", "loss_built")


@dataclass(frozen=True, eq=False)
class LawSpread:
    """K laws that spread a law's uncertainty (``laws``: ``allocation.stacked``, constants (K, 1)), how to read
    an interval off the K values of a quantity, and a line that says where the interval comes from."""

    laws: JointLaw
    percentile: bool   # True: the percentile interval at ``confidence``; False: the range over the K laws
    confidence: float
    note: str

    def bounds(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) over the first axis of ``values`` (K, ...); NaN values (a draw with no model) left out."""
        if self.percentile:
            tail = 100 * (1 - self.confidence) / 2
            return tuple(np.nanpercentile(values, [tail, 100 - tail], axis=0))
        return np.nanmin(values, axis=0), np.nanmax(values, axis=0)


def spread_of(law: LawFit | JointLaw) -> tuple[LawSpread | None, str]:
    """The spread behind ``law``'s intervals and a line saying what it is; (None, why not) where there is none."""
    if isinstance(law, LawFit):
        draws = law.draws()
        if draws.empty:
            return None, "no interval: the fit ran no bootstrap (--n-bootstrap 0)"
        pct = f"{100 * law.confidence:.0f}%"
        note = f"{pct} intervals from the fit's {len(draws)} {law.interval}-bootstrap draws of its constants"
        laws = JointLaw(**{name: draws[name].to_numpy(float)[:, None] for name in CONSTANTS})
        return LawSpread(laws=laws, percentile=True, confidence=law.confidence, note=note), note
    if law == PAPER_LAW:
        lo, hi = PAPER_PHI_CI
        note = (f"the published law carries no interval but phi's (95% CI {numbers.sig(lo, 2)} to "
                f"{numbers.sig(hi, 2)}); these are phi's share alone")
        ends = [dataclasses.replace(law, phi=phi) for phi in (lo, law.phi, hi)]
        return LawSpread(laws=stacked(ends), percentile=False, confidence=0.95, note=note), note
    return None, "no interval: these constants carry none"


def with_intervals(table: pd.DataFrame, spread: LawSpread | None, *, template: dict[str, Any] | None = None,
                   batch_tokens: int = PAPER_BATCH_TOKENS, max_widths: dict[int, float] | None = None
                   ) -> pd.DataFrame:
    """An ``allocation_table`` with ``<column>_lo`` and ``<column>_hi`` for each of ``WITH_INTERVAL``: the
    compute-optimal model, and the buildable one next to it (no wider than ``max_widths[r]`` where given),
    re-optimised under each law of ``spread``. NaN where there is no spread."""
    out = table.copy()
    for column in WITH_INTERVAL:
        out[f"{column}_lo"] = out[f"{column}_hi"] = np.nan
    if spread is None:
        return out
    curves: dict[int, SizeCurve] = {}
    for index, row in table.iterrows():
        r = int(row["r"])
        curve = curves.setdefault(r, SizeCurve.from_model(r, template))
        values = optimum_under(spread.laws, curve, float(row["budget_flops"]), batch_tokens,
                               (max_widths or {}).get(r, np.inf))
        for column in WITH_INTERVAL:
            out.loc[index, [f"{column}_lo", f"{column}_hi"]] = spread.bounds(values[column])
    return out


def optimum_under(laws: JointLaw, curve: SizeCurve, budget: float, batch_tokens: int,
                  max_width: float = np.inf) -> dict[str, np.ndarray]:
    """(K,) per law of ``stacked`` ``laws``: its compute-optimal N, tokens and loss at ``budget`` and the
    buildable model next to that optimum, no wider than ``max_width`` (``allocation.built_models``)."""
    widths = optimal_widths(laws, curve, budget)
    sizes = curve.sizes(widths[:, None])
    tokens = budget / sizes["F"]
    loss = laws.loss(sizes["N_once"], sizes["N_rec"], curve.r, tokens)[:, 0]
    built = built_models(laws, curve, np.minimum(widths, max_width), budget, batch_tokens)
    return {"N": sizes["N"][:, 0], "tokens": tokens[:, 0], "loss": loss, **built}
