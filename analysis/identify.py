"""Is phi identified by the sweep? A fit can converge to a phi the data do not determine.

Two signs that they do not:

* phi's bootstrap interval reaches a bound of the fit (paper: phi in [-3, 3]): some resamples of the cells
  push phi as far as it is allowed to go, so the interval is set by the bound, not by the data.
* phi = 0 fits as well: the restricted fit (N_eff = N_once + N_rec, recurrence worth nothing) leaves a residual
  sum of squares within noise of the joint fit's. With n fitted rows, k = 6 free constants and
  SS = n * RMSE^2, the nested-model F test F = (SS_0 - SS_joint) / (SS_joint / (n - k)) on (1, n - k) degrees
  of freedom; p > 0.05 means the data cannot tell phi from 0.

The usual cause is a cell whose IsoFLOP optimum is not bracketed by the widths trained (the loss keeps falling
toward the largest or smallest size): the cell then says nothing about where its optimum lies. ``likely_fixes`` names
those cells and the spec keys that would bracket them.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
from scipy import stats

from .fit_types import FitStatus, LawFit
from .options import Bounds

SIGNIFICANCE = 0.05
FREE_CONSTANTS = 6


def phi_problems(joint: LawFit, phi0: LawFit, phi_bounds: tuple[float, float]) -> list[str]:
    """Why ``joint``'s phi is not identified (empty when it is); ``phi0`` is the same fit with phi fixed at 0,
    ``phi_bounds`` the fit's bounds on phi."""
    if joint.fixed_phi is not None:
        return []
    problems = []
    lo, hi = phi_bounds
    tolerance = 1e-3 * (hi - lo)
    ci_lo, ci_hi = joint.phi_ci
    touches = [b for b, near in ((lo, min(joint.phi, ci_lo) - lo <= tolerance),
                                 (hi, hi - max(joint.phi, ci_hi) <= tolerance)) if near]
    if touches:
        problems.append(f"phi's {100 * joint.confidence:.0f}% interval ({ci_lo:.3f} to {ci_hi:.3f}) reaches the "
                        f"fit's bound {', '.join(f'{b:g}' for b in touches)}: the data do not bound phi")
    dof = joint.n_runs - FREE_CONSTANTS
    ss_joint, ss_0 = joint.n_runs * joint.rmse ** 2, phi0.n_runs * phi0.rmse ** 2
    if dof > 0 and ss_joint > 0:
        f_stat = max(ss_0 - ss_joint, 0.0) / (ss_joint / dof)
        p = float(stats.f.sf(f_stat, 1, dof))
        if p > SIGNIFICANCE:
            problems.append(f"phi = 0 fits as well (R^2 {phi0.r2:.4f} vs {joint.r2:.4f}, RMSE {phi0.rmse:.4g} vs "
                            f"{joint.rmse:.4g} nats; F test p = {p:.2f} over {joint.n_runs} rows): the sweep "
                            "cannot tell what a recurrence is worth")
    return problems


def with_identification(joint: LawFit, phi0: LawFit, bounds: Bounds) -> LawFit:
    """``joint`` marked UNIDENTIFIED (if it had converged) with the reasons when the data do not determine its
    phi; ``phi0`` is the same fit with phi fixed at 0."""
    problems = tuple(phi_problems(joint, phi0, bounds.phi))
    if not problems:
        return joint
    status = FitStatus.UNIDENTIFIED if joint.status is FitStatus.CONVERGED else joint.status
    return dataclasses.replace(joint, status=status, warnings=problems)


def likely_fixes(optima: pd.DataFrame) -> list[str]:
    """What would make phi identifiable, from the per-cell IsoFLOP optima (``analysis.isoflop.cell_optima``):
    cells whose optimum the trained widths do not bracket, and cells with too few sizes."""
    if optima.empty or "status" not in optima:
        return ["add recurrences further apart (e.g. r = 1 and r = 8), more budgets or more trials per cell"]
    fixes = []
    for row in optima[optima["status"] != "ok"].itertuples(index=False):
        cell = f"r={int(row.r)} C={row.budget_flops:.3g}"
        reason = str(row.reason)
        if "above the largest" in reason:
            fixes.append(f"{cell}: the loss keeps falling toward the largest width: its optimum lies outside the "
                         "widths tried: raise [widths] s_max or lower the low end of [widths] tokens_per_param")
        elif "below the smallest" in reason:
            fixes.append(f"{cell}: the loss keeps falling toward the smallest width: its optimum lies outside the "
                         "widths tried: lower [widths] s_min or raise the high end of [widths] tokens_per_param")
        elif row.status == "too_few_points":
            fixes.append(f"{cell}: {reason}: raise trials_per_cell or widen [widths]")
        else:
            fixes.append(f"{cell}: no IsoFLOP optimum ({reason}): more trials_per_cell (the losses are noisy)")
    if not fixes:
        fixes.append("every cell brackets its optimum: add recurrences further apart (e.g. r = 1 and r = 8), "
                     "more budgets, or more trials per cell to lower the noise")
    return fixes
