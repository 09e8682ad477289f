"""A fit is never called converged when phi is not identified: phi = 0 fitting as well, or phi's profile
interval reaching a bound, make it UNIDENTIFIED with the reasons; a constant at its bound is named; the report
names the cells to fix."""

from __future__ import annotations

import dataclasses

from loopscale.analysis import FitStatus, fit_suite
from loopscale.analysis.identify import likely_fixes, status_label
from loopscale.analysis.isoflop import cell_optima
from loopscale.analysis.options import DEFAULT_BOUNDS
from loopscale.model import PAPER_LAW
from test_analysis_sim import PAPER_GRID, paper_runs


def test_a_sweep_that_cannot_see_the_recurrence_is_unidentified():
    # the truth has phi = 0 (a recurrence adds nothing): the restricted phi = 0 fit is as good as the joint one
    flat = dataclasses.replace(PAPER_LAW, phi=0.0)
    suite = fit_suite(paper_runs(flat, noise=0.01), n_starts=60, n_bootstrap=0)
    assert suite.joint.status is FitStatus.UNIDENTIFIED
    assert any("phi = 0 fits as well" in w for w in suite.joint.warnings), suite.joint.warnings


def test_the_paper_law_is_identified():
    suite = fit_suite(paper_runs(noise=0.01), n_starts=60, n_bootstrap=0)
    assert suite.joint.status is FitStatus.CONVERGED, suite.joint.warnings
    assert suite.joint.warnings == ()


def test_a_constant_at_its_bound_is_named_in_the_verdict():
    # r = 1 and 2 only, two budgets, 0.1-nat noise: the fit drives E to its lower bound
    grid = {c: PAPER_GRID[c] for c in (4.64e17, 1e18)}
    suite = fit_suite(paper_runs(noise=0.1, grid=grid, recurrences=(1, 2)), n_starts=60, n_bootstrap=0)
    assert suite.joint.status is not FitStatus.CONVERGED
    assert suite.joint.verdict.startswith("not identified: E at its lower bound 0.0498"), suite.joint.verdict
    assert status_label(suite.joint, DEFAULT_BOUNDS) == f"[{suite.joint.status.value}: E at its lower bound 0.0498]"


def test_likely_fixes_name_the_cell_whose_optimum_lies_outside_the_widths():
    # the 1e19 cell trained only widths above its optimum: its loss keeps falling toward the smallest one
    grid = {**PAPER_GRID, 1e19: (24, 28, 32, 36)}
    optima = cell_optima(paper_runs(grid=grid), n_bootstrap=0).table
    fixes = likely_fixes(optima)
    assert any(f.startswith("r=1 C=1e+19: the loss keeps falling toward the smallest width") and "s_min" in f
               for f in fixes), fixes
    assert not any("C=4.64e+17" in f for f in fixes)
