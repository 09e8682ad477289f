"""Delta-phi: how much more (or less) one recurrence is worth in sweep B than in sweep A.

The paper proposes phi as a diagnostic for changes to the looped architecture or its training (Schwethelm
et al. 2026; docs/paper.md, "What it finds"): truncated backprop gives phi 0.38 against the baseline's 0.46 (a
worse loop, even though it saves compute), hyperconnections 0.65 (a real gain). Both sweeps are fitted the
same way; the interval of Delta-phi = phi_B - phi_A is the percentile interval of the differences of their
independent block-bootstrap draws. As in the paper, a sweep without r = 1 runs borrows the other's (r = 1 has
no loop to change), and by default both are restricted to the budgets they share, because phi drifts with the
budget range (paper: 0.44 on the low half of the budgets, 0.49 on the high half).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .fit import fit_joint_law
from .fit_types import FitStatus, LawFit
from .options import DEFAULT_FIT_OPTIONS, FitOptions
from .runs import exclusions, usable_runs


@dataclass(frozen=True, eq=False)
class Comparison:
    name_a: str
    name_b: str
    fit_a: LawFit
    fit_b: LawFit
    delta: float
    delta_ci: tuple[float, float]
    budgets: tuple[float, ...]
    borrowed_r1: str   # "" or the name of the sweep that borrowed the other's r = 1 runs
    verdict: str
    excluded: tuple[str, str]  # per sweep, the runs left out and why, in words
    spec_notes: tuple[str, ...] = ()  # the spec keys that differ and the differences that cannot act

    def text(self) -> str:
        pct = f"{100 * self.fit_a.confidence:.0f}%"
        lines = [f"{name}: phi = {fit.phi:.3f} ({pct} CI {fit.phi_ci[0]:.3f} to {fit.phi_ci[1]:.3f}), "
                 f"R^2 {fit.r2:.4f}, {fit.n_runs} runs [{fit.status.value}]"
                 for name, fit in ((self.name_a, self.fit_a), (self.name_b, self.fit_b))]
        lines += [f"{name}: excluded {text}" for name, text in zip((self.name_a, self.name_b), self.excluded)]
        lines.append(f"budgets compared: {', '.join(f'{c:.3g}' for c in self.budgets)}")
        if self.borrowed_r1:
            lines.append(f"{self.borrowed_r1} has no r=1 runs and uses the other sweep's")
        lines.append(f"Delta-phi (B - A) = {self.delta:+.3f} ({pct} CI {self.delta_ci[0]:+.3f} to "
                     f"{self.delta_ci[1]:+.3f})")
        lines.append(self.verdict)
        lines += list(self.spec_notes)
        return "\n".join(lines)


def compare_runs(runs_a: pd.DataFrame, runs_b: pd.DataFrame, *, name_a: str = "A", name_b: str = "B",
                 options: FitOptions = DEFAULT_FIT_OPTIONS, all_budgets: bool = False) -> Comparison:
    """Fit both sweeps' joint laws and compare their phi."""
    used_a, used_b = (usable_runs(t, stage=options.stage) for t in (runs_a, runs_b))
    for name, used in ((name_a, used_a), (name_b, used_b)):
        if used.empty:
            raise ValueError(f"{name} has no usable runs")
    if not all_budgets:
        common = _keys(used_a["budget_flops"]) & _keys(used_b["budget_flops"])
        if not common:
            raise ValueError(f"{name_a} and {name_b} share no budget; compare with all_budgets to fit each on all")
        used_a = used_a[_keys_of(used_a["budget_flops"]).isin(common)]
        used_b = used_b[_keys_of(used_b["budget_flops"]).isin(common)]
    borrowed = ""
    if not (used_b["r"] == 1).any() and (used_a["r"] == 1).any():
        used_b, borrowed = pd.concat([used_b, used_a[used_a["r"] == 1]]), name_b
    elif not (used_a["r"] == 1).any() and (used_b["r"] == 1).any():
        used_a, borrowed = pd.concat([used_a, used_b[used_b["r"] == 1]]), name_a
    for name, used in ((name_a, used_a), (name_b, used_b)):
        if used["r"].nunique() < 2 and options.fix_phi is None:  # a single r fits the plain law: no phi to compare
            raise ValueError(f"{name} has runs of one r only (r={int(used['r'].iloc[0])}): phi is not applicable to "
                             "it, so there is no Delta-phi to compare")
    fit_a = fit_joint_law(used_a, options=options)
    fit_b = fit_joint_law(used_b, options=dataclasses.replace(options, seed=options.seed + 1))
    delta = fit_b.phi - fit_a.phi
    n = min(fit_a.n_bootstrap, fit_b.n_bootstrap)
    if n:
        tail = 100 * (1 - options.confidence) / 2
        phi_a, phi_b = fit_a.draws()["phi"].to_numpy()[:n], fit_b.draws()["phi"].to_numpy()[:n]
        lo, hi = np.percentile(phi_b - phi_a, [tail, 100 - tail])
    else:
        lo = hi = np.nan
    budgets = tuple(sorted(set(used_a["budget_flops"]) | set(used_b["budget_flops"])))
    return Comparison(name_a=name_a, name_b=name_b, fit_a=fit_a, fit_b=fit_b, delta=float(delta),
                      delta_ci=(float(lo), float(hi)), budgets=budgets, borrowed_r1=borrowed,
                      verdict=verdict(name_a, name_b, fit_a, fit_b, float(lo), float(hi)),
                      excluded=(excluded_text(runs_a, options.stage), excluded_text(runs_b, options.stage)))


def excluded_text(runs: pd.DataFrame, stage: str | None) -> str:
    """'none' or e.g. '3 runs: 2 failed (worker died); 1 diverged (loss is nan)'."""
    counts = exclusions(runs, stage=stage)
    if counts.empty:
        return "none"
    parts = "; ".join(f"{n} {status} ({reason})" for status, reason, n in counts.itertuples(index=False))
    return f"{counts['count'].sum()} runs: {parts}"


def verdict(name_a: str, name_b: str, fit_a: LawFit, fit_b: LawFit, lo: float, hi: float) -> str:
    """One plain sentence on what the interval of Delta-phi says, with a caveat for an untrustworthy fit."""
    worth = (f"(at r = 4 the shared block counts as {4 ** fit_b.phi:.2f} unique copies in {name_b} "
             f"against {4 ** fit_a.phi:.2f} in {name_a})")
    if not np.isfinite(lo):
        text = f"No interval (no bootstrap resamples); the point estimates differ as shown {worth}."
    elif lo > 0:
        text = f"A recurrence is worth more in {name_b} than in {name_a}: the interval lies above 0 {worth}."
    elif hi < 0:
        text = f"A recurrence is worth less in {name_b} than in {name_a}: the interval lies below 0 {worth}."
    else:
        text = f"No clear difference: the interval includes 0 {worth}."
    doubtful = [n for n, f in ((name_a, fit_a), (name_b, fit_b)) if f.status is not FitStatus.CONVERGED]
    if doubtful:
        text += f" Caution: the fit of {', '.join(doubtful)} did not converge cleanly."
    return text


def _keys_of(budgets: pd.Series) -> pd.Series:
    """Budgets rounded to 6 significant digits, so 1e18 from two sweeps matches despite float noise."""
    return budgets.map(lambda c: float(f"{c:.6g}"))


def _keys(budgets: pd.Series) -> set[float]:
    return set(_keys_of(budgets))
