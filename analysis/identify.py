"""Is phi identified by the sweep, and what does the fit say about it? One verdict per fit.

phi's interval is the profile-likelihood interval of the objective the fit minimises (``analysis.profile_interval``),
and the tests of phi = 0 and phi = 1 are the same nested F test at those two points, so the verdict cannot
disagree with the interval. Signs that the data do not determine phi:

* the profile interval reaches a bound of the fit (paper: phi in [-3, 3]): held anywhere out to the bound, phi
  fits as well by the F test, so the interval is set by the bound, not by the data;
* phi = 0 fits as well (the test against 0 does not reject): the sweep cannot tell a recurrence from nothing;
* a constant sits at a bound of the fit (``FitStatus.AT_BOUND``): the optimum may lie outside the box.

The usual cause is a cell whose IsoFLOP optimum is not bracketed by the widths trained (the loss keeps falling
toward the largest or smallest size): the cell then says nothing about where its optimum lies. ``likely_fixes``
names those cells and the spec keys that would bracket them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from . import numbers
from .fit_problem import FitData, fit_rows
from .fit_types import FitStatus, LawFit
from .options import THETA, Bounds, FitOptions
from .profile_interval import Profile, profile_phi, theta_of

# the public name of each internal parameter (theta holds log A, log B, log E)
PUBLIC = {"a": "A", "alpha": "alpha", "b": "B", "beta": "beta", "e": "E", "phi": "phi"}


def bound_names(fit: LawFit, bounds: Bounds) -> list[str]:
    """Each constant of ``fit`` at a bound, named with the bound: e.g. 'E at its lower bound 0.0498'."""
    theta, (lower, upper) = theta_of(fit), bounds.arrays()
    names = []
    for name in fit.at_bound:
        i = THETA.index(name)
        side, value = ("lower", lower[i]) if abs(theta[i] - lower[i]) <= abs(upper[i] - theta[i]) else \
            ("upper", upper[i])
        shown = np.exp(value) if name in ("a", "b", "e") else value
        names.append(f"{PUBLIC[name]} at its {side} bound {shown:.3g}")
    return names


def status_label(fit: LawFit, bounds: Bounds) -> str:
    """The fit's status as a line shows it: '[at_bound: E at its lower bound 0.0498]' names the constant."""
    held = bound_names(fit, bounds)
    return f"[{fit.status.value}: {'; '.join(held)}]" if held else f"[{fit.status.value}]"


def judged(joint: LawFit, runs: pd.DataFrame, options: FitOptions, *, phi0: LawFit | None = None,
           phi1: LawFit | None = None) -> LawFit:
    """``joint`` with phi's profile interval, the tests of phi = 0 and 1, the verdict line, and (if it had
    converged) UNIDENTIFIED with the reasons when the data do not determine phi. ``phi0`` and ``phi1``: fits
    already made with phi held at 0 and 1 (their objectives join the profile's points)."""
    if joint.fixed_phi is not None or not joint.phi_applicable:
        return dataclasses.replace(joint, verdict=verdict_line(joint, None, options.bounds))
    known = {phi: fit.huber for phi, fit in ((0.0, phi0), (1.0, phi1)) if fit is not None}
    profile = profile_phi(FitData.from_runs(fit_rows(runs, options)), theta_of(joint), joint.huber, options,
                          known=known)
    lo, hi = options.bounds.phi
    p0 = profile.p(0.0) if lo <= 0 <= hi else np.nan
    p1 = profile.p(1.0) if lo <= 1 <= hi else np.nan
    joint = dataclasses.replace(joint, phi_profile_ci=profile.ci, phi_profile_stretches=profile.stretches, p_phi0=p0,
                                p_phi1=p1)
    problems = tuple(phi_problems(joint, profile))
    status = FitStatus.UNIDENTIFIED if problems and joint.status is FitStatus.CONVERGED else joint.status
    return dataclasses.replace(joint, status=status, warnings=problems,
                               verdict=verdict_line(joint, profile, options.bounds))


def phi_problems(joint: LawFit, profile: Profile) -> list[str]:
    """Why ``joint``'s phi is not identified by its ``profile`` (empty when it is)."""
    problems = []
    pct = f"{100 * joint.confidence:.0f}%"
    ci_lo, ci_hi = profile.ci
    if profile.reaches:
        problems.append(f"phi's {pct} profile interval ({ci_lo:.3f} to {ci_hi:.3f}) reaches the fit's bound "
                        f"{', '.join(f'{b:g}' for b in profile.reaches)}: the data do not bound phi")
    if profile.segments > 1:
        problems.append(f"phi's {pct} profile interval splits into {profile.segments} stretches "
                        f"({numbers.stretches(profile.stretches)}), the values between them rejected: the data fit "
                        "phi in each, so they do not tell which it is; r = 1 runs (or --baseline a sweep's) pin the "
                        "base law that a sweep without them leaves free")
    if joint.p_phi0 > 1 - joint.confidence:
        problems.append(f"phi = 0 fits as well (F test p = {joint.p_phi0:.2g} over {joint.n_runs} rows): the sweep "
                        "cannot tell what a recurrence is worth")
    return problems


def verdict_line(fit: LawFit, profile: Profile | None, bounds: Bounds) -> str:
    """What the fit says about a recurrence's worth, in one plain line, with the numbers behind it."""
    if not fit.phi_applicable:
        return f"no verdict on phi: runs of one r (r={fit.single_r}) cannot measure what a recurrence is worth"
    if profile is None:
        return f"no verdict on phi: it was held at {fit.fixed_phi:g}"
    held = bound_names(fit, bounds)
    pct = f"{100 * fit.confidence:.0f}%"
    lo, hi = fit.phi_profile_ci
    shown = (f"(phi {fit.phi:.3f}, {pct} profile CI {numbers.stretches(fit.phi_profile_stretches)}; F test p = "
             f"{fit.p_phi0:.2g} against phi = 0, {fit.p_phi1:.2g} against phi = 1)")
    if held:
        return f"not identified: {'; '.join(held)}, so the optimum may lie outside the fit's bounds {shown}"
    if profile.reaches:
        return f"not identified: phi's interval reaches the fit's bound {profile.reaches[0]:g} {shown}"
    if profile.segments > 1:
        return (f"not identified: phi's interval splits into {profile.segments} stretches with values the test "
                f"rejects between them {shown}")
    alpha = 1 - fit.confidence
    not_0, not_1 = fit.p_phi0 <= alpha, fit.p_phi1 <= alpha
    if not_0 and not_1:
        if hi < 0:
            words = "a recurrence is worth less than nothing (phi < 0: looping more hurts)"
        elif lo > 1:
            words = "a recurrence is worth more than a unique block (phi > 1)"
        else:
            words = "a recurrence is worth more than nothing and less than a unique block"
    elif not_0:
        words = "a recurrence is worth more than nothing; cannot tell it from a unique block (phi = 1)"
    elif not_1:
        words = "a recurrence is worth less than a unique block; cannot tell it from nothing (phi = 0)"
    else:
        words = "cannot tell a recurrence from nothing (phi = 0) or from a unique block (phi = 1)"
    return f"{words} {shown}"


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
        elif row.status == "bound_limited":  # its reason names the edge and what moves it (analysis/isoflop.py)
            fixes.append(f"{cell}: {reason}")
        elif row.status == "too_few_points":
            fixes.append(f"{cell}: {reason}: raise trials_per_cell or widen [widths]")
        else:
            fixes.append(f"{cell}: no IsoFLOP optimum ({reason}): more trials_per_cell (the losses are noisy)")
    if not fixes:
        fixes.append("every cell brackets its optimum: add recurrences further apart (e.g. r = 1 and r = 8), "
                     "more budgets, or more trials per cell to lower the noise")
    return fixes
