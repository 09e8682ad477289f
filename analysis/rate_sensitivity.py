"""phi's sensitivity to the learning rate: how phi and the gaps to r = 1 move when each cell's best width trains at
another rate (a sweep's ``rate_sensitivity = true``, search/rate_sensitivity.py).

Each search cell's best trial (the lowest loss that trained) was trained again, at its width and from its seed, at
its rate x k for k in ``RATE_FACTORS``, in the stage ``rate_x<k>``. At each rate the sweep then has one run per
cell of one design: the best widths, the x 1 runs being the best trials themselves. The joint law is fitted to
each rate's runs alone, so the fits differ by the rate only, and phi_k - phi_1 is the move the rate makes; the
gaps to r = 1 are the runs' own, per budget L(C, r) - L(C, 1), at each rate.

Verdict: "the rate decides it" when a gap to r = 1 changes sign across the rates (looping starts or stops paying at
a budget) or phi moved by phi_k - phi_1 leaves the sweep's own profile interval at a rate tried; "robust to the
rate" when neither happens; "cannot tell" when no gap changes sign but phi is not located at every rate (or the
sweep's interval is not), so the move cannot be judged. Each r's best rate is the factor of its lowest summed loss
over the budgets; a looped r whose best rate differs from r = 1's is named, since its phi then rests on a rate tuned
for r = 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .options import FitOptions

if TYPE_CHECKING:
    from .fit_types import LawFit

RATE_FACTORS = (0.5, 2.0)  # the rates tried, as multiples of the rate the search trained with
RATE_STAGE = "rate_x"  # the stages' names: rate_x0.5, rate_x2
ROBUST, DECIDES, UNJUDGED = "robust to the rate", "the rate decides it", "cannot tell"


def stage_name(factor: float) -> str:
    return f"{RATE_STAGE}{factor:g}"


def best_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Each search cell's run of the lowest loss among its trials (branches left out) that trained."""
    from .runs import usable_runs  # here, not at the top: the spec reads this module's stage names without scipy

    trials = usable_runs(runs, stage="search")
    if "branch_of" in trials:
        trials = trials[trials["branch_of"].fillna("").eq("")]
    return trials.loc[trials.groupby(["budget_flops", "r"])["val_loss"].idxmin()]


def rate_sensitivity(runs: pd.DataFrame, joint: LawFit, options: FitOptions) -> dict[str, Any] | None:
    """phi, its move and the gaps to r = 1 at each rate (module docstring); None when no rate stage ran."""
    tried = [f for f in RATE_FACTORS if (runs["stage"] == stage_name(f)).any()]
    if not tried:
        return None
    factors = sorted([1.0, *tried])
    from .runs import usable_runs

    tables = {f: best_runs(runs) if f == 1.0 else usable_runs(runs, stage=stage_name(f)) for f in factors}
    phis = {f: _phi(t, options) for f, t in tables.items()}
    losses = pd.DataFrame({f: t.set_index(["budget_flops", "r"])["val_loss"] for f, t in tables.items()})
    gaps = []
    for (budget, r), row in losses.iterrows():
        if r != 1 and (budget, 1) in losses.index:
            gaps.append({"budget_flops": float(budget), "r": int(r),
                         "gap": [float(row[f] - losses.loc[(budget, 1), f]) for f in factors]})
    best = {str(int(r)): float(g.sum().idxmin()) for r, g in losses.groupby(level="r")}
    lo, hi = joint.phi_profile_ci
    moves = {f: phis[f] - phis[1.0] for f in factors}
    located = math.isfinite(lo) and math.isfinite(hi) and all(math.isfinite(m) for m in moves.values())
    inside = located and all(lo <= joint.phi + m <= hi for m in moves.values())
    signs = all(len({np.sign(v) for v in g["gap"]}) == 1 for g in gaps)
    looped = {r: f for r, f in best.items() if r != "1" and "1" in best and f != best["1"]}
    return {"factors": factors, "phi": [phis[f] for f in factors], "phi_move": [moves[f] for f in factors],
            "runs": [len(tables[f]) for f in factors], "gaps_to_r1": gaps, "best_factor_by_r": best,
            "best_rate_differs": looped, "verdict": _verdict(located, inside, signs),
            "why": _why(located, inside, signs)}


def _phi(table: pd.DataFrame, options: FitOptions) -> float:
    """phi of the joint law fitted to one rate's runs (NaN where they cannot be fitted)."""
    from .fit import fit_joint_law

    try:
        return float(fit_joint_law(table.assign(stage="search"), options=options, n_bootstrap=0).phi)
    except ValueError:
        return math.nan


def _verdict(located: bool, inside: bool, signs: bool) -> str:
    if not signs or (located and not inside):
        return DECIDES
    return ROBUST if located else UNJUDGED


def _why(located: bool, inside: bool, signs: bool) -> str:
    reasons = [] if signs else ["a gap to r = 1 changes sign"]
    if not located:
        reasons.append("phi at a rate, or the sweep's interval, is not located")
    elif not inside:
        reasons.append("phi moves outside its own interval")
    return "; ".join(reasons) or "phi stays inside its interval and every gap to r = 1 keeps its sign"


def lines(sensitivity: dict[str, Any] | None) -> list[str]:
    """What ``loopscale analyze`` prints of it."""
    if not sensitivity:
        return []
    factors = " / ".join(f"x{f:g}" for f in sensitivity["factors"])
    phis = " / ".join(f"{p:.3f}" for p in sensitivity["phi"])
    out = [f"rate sensitivity (each cell's best width again at the rate {factors}): phi {phis} (one run per cell at "
           f"each rate); verdict: {sensitivity['verdict']} ({sensitivity['why']})"]
    if sensitivity["gaps_to_r1"]:
        out.append("  gaps to r=1 at the best widths (nats, " + factors + "): " + "; ".join(
            f"C={g['budget_flops']:.3g} r={g['r']} " + " / ".join(f"{v:+.4f}" for v in g["gap"])
            for g in sensitivity["gaps_to_r1"]))
    for r, f in sensitivity["best_rate_differs"].items():
        out.append(f"  r={r}'s best rate is x{f:g}, r=1's x{sensitivity['best_factor_by_r']['1']:g}: its phi rests "
                   "on a rate tuned for r = 1")
    return out
