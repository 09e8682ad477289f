"""Delta-phi: how much more (or less) one recurrence is worth in sweep B than in sweep A.

The paper proposes phi as a diagnostic for changes to the looped architecture or its training (Schwethelm
et al. 2026; docs/paper.md, "What it finds"): truncated backprop gives phi 0.38 against the baseline's 0.46 (a
worse loop, even though it saves compute), hyperconnections 0.65 (a real gain).

Delta-phi is one model (``analysis.delta``): both sweeps fitted jointly with one base law and phi_B = phi_A +
Delta, Delta's interval from its profile and the test of Delta = 0 from the same F test. Beside it, each sweep's
own fit (a sweep without r = 1 runs borrows the other's when the templates are equal, ``analysis.borrow``, as
``analyze --baseline`` does) with its verdict, and the model-free evidence of the matched cells
(``analysis.cell_evidence``). By default both sweeps are restricted to the budgets they share, because phi
drifts with the budget range (paper: 0.44 on the low half of the budgets, 0.49 on the high half).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import numbers
from .borrow import borrow_refusal, budget_keys, with_borrowed_r1
from .cell_evidence import evidence_text, matched_cells
from .delta import SharedBase, fit_shared_base
from .downstream.designs import design_lines
from .fit import fit_joint_law
from .fit_types import FitStatus, LawFit
from .identify import status_label
from .options import DEFAULT_FIT_OPTIONS, FitOptions
from .runs import exclusions, usable_runs
from .suite import judged_with_restrictions


@dataclass(frozen=True, eq=False)
class Comparison:
    name_a: str
    name_b: str
    fit_a: LawFit
    fit_b: LawFit
    shared: SharedBase | None  # the one-model fit; None when the sweeps cannot share a base law
    shared_note: str           # why there is no shared model, or ''
    cells: pd.DataFrame        # the matched cells (analysis.cell_evidence)
    budgets: tuple[float, ...]
    borrow_notes: tuple[str, str]  # per sweep, what it borrowed and why (not)
    verdict: str
    excluded: tuple[str, str]  # per sweep, the runs left out and why, in words
    options: FitOptions = DEFAULT_FIT_OPTIONS
    spec_notes: tuple[str, ...] = ()  # the spec keys that differ and the differences that cannot act
    downstream: tuple[str, ...] = ()  # per axis both scored, B against A at matched loss (downstream/designs.py)

    @property
    def delta(self) -> float:
        return self.shared.delta if self.shared is not None else self.fit_b.phi - self.fit_a.phi

    def text(self) -> str:
        pct = f"{100 * self.options.confidence:.0f}%"
        lines = []
        for name, fit, note in ((self.name_a, self.fit_a, self.borrow_notes[0]),
                                (self.name_b, self.fit_b, self.borrow_notes[1])):
            lines.append(f"{name}: {fit.phi_text().replace('phi ', 'phi = ', 1)}, R^2 {fit.r2:.4f}, {fit.n_runs} "
                         f"runs {status_label(fit, self.options.bounds)}; {note}")
            lines.append(f"  verdict: {fit.verdict}")
        lines += [f"{name}: excluded {text}" for name, text in zip((self.name_a, self.name_b), self.excluded)]
        lines.append(f"budgets compared: {', '.join(f'{c:.3g}' for c in self.budgets)}")
        if self.shared is None:
            lines.append(f"Delta-phi (B - A) = {self.delta:+.3f} (the two separate fits' difference; no one-model "
                         f"interval: {self.shared_note})")
        else:
            ci = numbers.stretches(self.shared.profile.stretches, lambda v: f"{v:+.3f}")
            lines.append(f"Delta-phi (B - A) = {self.delta:+.3f} ({pct} profile CI {ci}; F test "
                         f"p = {self.shared.p_zero:.2g} against Delta = 0), one model: a base law shared by "
                         f"{sum(self.shared.n_rows)} rows, phi_A {self.shared.phi_a:.3f}, phi_B "
                         f"{self.shared.phi_b:.3f}")
        lines += evidence_text(self.cells, self.name_a, self.name_b, self.options.confidence)
        lines.append(self.verdict)
        lines += list(self.downstream)
        lines += list(self.spec_notes)
        return "\n".join(lines)


def compare_runs(runs_a: pd.DataFrame, runs_b: pd.DataFrame, *, name_a: str = "A", name_b: str = "B",
                 options: FitOptions = DEFAULT_FIT_OPTIONS, all_budgets: bool = False) -> Comparison:
    """Fit both sweeps, each on its own (borrowing r = 1 runs where it has none) and jointly as one model, and
    compare their phi."""
    used_a, used_b = (usable_runs(t, stage=options.stage) for t in (runs_a, runs_b))
    for name, used in ((name_a, used_a), (name_b, used_b)):
        if used.empty:
            raise ValueError(f"{name} has no usable runs")
    if not all_budgets:
        common = set(budget_keys(used_a["budget_flops"])) & set(budget_keys(used_b["budget_flops"]))
        if not common:
            raise ValueError(f"{name_a} and {name_b} share no budget; compare with all_budgets to fit each on all")
        used_a = used_a[budget_keys(used_a["budget_flops"]).isin(common)]
        used_b = used_b[budget_keys(used_b["budget_flops"]).isin(common)]
    own_a, note_a = with_borrowed_r1(used_a, used_b, stage=None)
    own_b, note_b = with_borrowed_r1(used_b, used_a, stage=None)
    for name, used in ((name_a, own_a), (name_b, own_b)):
        if used["r"].nunique() < 2 and options.fix_phi is None:  # a single r fits the plain law: no phi to compare
            raise ValueError(f"{name} has runs of one r only (r={int(used['r'].iloc[0])}): phi is not applicable to "
                             "it, so there is no Delta-phi to compare")
    fit_a, _, _ = judged_with_restrictions(fit_joint_law(own_a, options=options), own_a, options)
    fit_b, _, _ = judged_with_restrictions(fit_joint_law(own_b, options=options), own_b, options)
    refusal = borrow_refusal(used_a, used_b, stage=None) or borrow_refusal(used_b, used_a, stage=None)
    shared, shared_note = None, ""
    if options.fix_phi is not None:
        shared_note = "phi is held"
    elif refusal and "no usable r = 1 runs" not in refusal:
        shared_note = f"one base law needs equal templates: {refusal}"
    else:
        shared = fit_shared_base(used_a, used_b, fit_a, fit_b, options)
    cells = matched_cells(used_a, used_b, stage=None, n_bootstrap=options.n_bootstrap, seed=options.seed,
                          confidence=options.confidence)
    budgets = tuple(sorted(set(used_a["budget_flops"]) | set(used_b["budget_flops"])))
    return Comparison(name_a=name_a, name_b=name_b, fit_a=fit_a, fit_b=fit_b, shared=shared,
                      shared_note=shared_note, cells=cells, budgets=budgets, borrow_notes=(note_a, note_b),
                      verdict=verdict(name_a, name_b, fit_a, fit_b, shared),
                      excluded=(excluded_text(runs_a, options.stage), excluded_text(runs_b, options.stage)),
                      options=options, downstream=tuple(design_lines(runs_a, runs_b, name_a, name_b,
                                                                     options.confidence, options.stage)))


def excluded_text(runs: pd.DataFrame, stage: str | None) -> str:
    """'none' or e.g. '3 runs: 2 failed (worker died); 1 diverged (loss is nan)'."""
    counts = exclusions(runs, stage=stage)
    if counts.empty:
        return "none"
    parts = "; ".join(f"{n} {status} ({reason})" for status, reason, n in counts.itertuples(index=False))
    return f"{counts['count'].sum()} runs: {parts}"


def verdict(name_a: str, name_b: str, fit_a: LawFit, fit_b: LawFit, shared: SharedBase | None) -> str:
    """One plain sentence on what the one-model interval of Delta-phi says, with a caveat for an untrustworthy
    fit."""
    phi_a, phi_b = (shared.phi_a, shared.phi_b) if shared is not None else (fit_a.phi, fit_b.phi)
    worth = (f"(at r = 4 the shared block counts as {4 ** phi_b:.2f} unique copies in {name_b} "
             f"against {4 ** phi_a:.2f} in {name_a})")
    if shared is None:
        text = f"No interval (no one-model fit); the point estimates differ as shown {worth}."
    elif shared.profile.reaches:
        text = f"Not identified: Delta-phi's interval reaches the bound {shared.profile.reaches[0]:g} {worth}."
    elif shared.profile.segments > 1:
        text = (f"Not identified: Delta-phi's interval splits into {shared.profile.segments} stretches with values the "
                f"test rejects between them {worth}.")
    elif shared.ci[0] > 0:
        text = f"A recurrence is worth more in {name_b} than in {name_a}: the interval lies above 0 {worth}."
    elif shared.ci[1] < 0:
        text = f"A recurrence is worth less in {name_b} than in {name_a}: the interval lies below 0 {worth}."
    else:
        text = f"No clear difference: the interval includes 0 {worth}."
    doubtful = [n for n, f in ((name_a, fit_a), (name_b, fit_b)) if f.status is not FitStatus.CONVERGED]
    if doubtful:
        text += f" Caution: the fit of {', '.join(doubtful)} did not converge cleanly."
    return text


