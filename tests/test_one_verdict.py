"""Every printed interval agrees with its test and its verdict: a profile with two valleys (a sweep without r = 1
runs fits phi near -2.6 and near 0.5) prints both stretches and is not identified, for phi and for Delta-phi; a
forecast's power counts only the copies whose verdict is identified; a matched cell without a noise estimate says
it has no interval; a constant's estimate lies inside its printed interval, or the line says why not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from loopscale.analysis import fit_suite
from loopscale.analysis.cell_evidence import evidence_text, matched_cells
from loopscale.analysis.compare import verdict as compare_verdict
from loopscale.analysis.delta import SharedBase
from loopscale.analysis.identify import verdict_line
from loopscale.analysis.options import DEFAULT_BOUNDS, FitOptions
from loopscale.analysis.precision import forecast_phi
from loopscale.analysis.profile_interval import NestedTest, Profile
from loopscale.analysis.report import analyze
from test_analysis_sim import paper_runs

LEVEL = 0.05
QUICK = FitOptions(n_starts=60, n_bootstrap=0)


def inside(stretches, value: float) -> bool:
    return any(lo <= value <= hi for lo, hi in stretches)


@pytest.fixture(scope="module")
def looped_only():
    """The paper's grid at r = 2 and 4 only: its profile of phi has a valley near -2.7 and one near 0.45."""
    return paper_runs(noise=0.01, recurrences=(2, 4))


def two_valleys() -> Profile:
    """A profile over [-3, 3] that the test accepts at -2 and at 0.5 only: 0 and 1 rejected, no bound reached."""
    test = NestedTest(f_min=1.0, scale=0.01, dof=100)
    cut = test.f_min + test.scale * 3.936  # F(1, 100) at 95%: 3.936
    values = np.array([-3.0, -2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0])
    f = np.array([cut + 1, 1.0, cut + 1, cut + 1, 1.0, cut + 1, cut + 1, cut + 1])
    return Profile(values=values, f=f, thetas=np.zeros((8, 6)), test=test, confidence=0.95, bounds=(-3.0, 3.0))


def test_a_two_valley_profile_prints_both_stretches_and_its_verdict_is_not_identified(looped_only):
    result = analyze(looped_only, name="looped", options=QUICK)
    joint = result.suite.joint
    assert len(joint.phi_profile_stretches) == 2, joint.phi_profile_stretches
    for value, p in ((0.0, joint.p_phi0), (1.0, joint.p_phi1)):  # the printed interval holds a value iff its test
        assert inside(joint.phi_profile_stretches, value) == (p > LEVEL), (value, p, joint.phi_profile_stretches)
    assert joint.verdict.startswith("not identified") and joint.status.value == "unidentified"
    (a, b), (c, d) = joint.phi_profile_stretches
    assert f"95% profile CI {a:.3f} to {b:.3f} and {c:.3f} to {d:.3f}" in result.summary_text().replace("\n  ", " ")

    shape = two_valleys()
    assert shape.stretches == ((-2.0, -2.0), (0.5, 0.5)) and shape.ci == (-2.0, 0.5) and not shape.reaches
    assert shape.p(0.0) < LEVEL and shape.p(1.0) < LEVEL
    fit = dataclasses.replace(joint, phi=-2.0, phi_profile_ci=shape.ci, phi_profile_stretches=shape.stretches,
                              p_phi0=shape.p(0.0), p_phi1=shape.p(1.0), at_bound=())
    line = verdict_line(fit, shape, DEFAULT_BOUNDS)  # no "worth more than nothing" beside an interval holding -2
    assert line.startswith("not identified: phi's interval splits into 2 stretches"), line
    assert "95% profile CI -2.000 to -2.000 and 0.500 to 0.500" in line


def test_a_two_valley_profile_of_delta_is_not_identified(looped_only):
    fit = fit_suite(looped_only, options=QUICK).joint
    shared = SharedBase(theta=np.zeros(6), delta=0.5, profile=two_valleys(), n_rows=(10, 10))
    assert shared.p_zero < LEVEL and shared.ci[0] < 0 < shared.ci[1]
    text = compare_verdict("A", "B", fit, fit, shared)
    assert text.startswith("Not identified: Delta-phi's interval splits into 2 stretches"), text


def test_a_forecast_counts_in_its_power_only_copies_whose_phi_is_identified():
    copies = [paper_runs(noise=0.01, seed=seed, recurrences=(2, 4)) for seed in range(2)]
    forecast = forecast_phi(copies, QUICK)
    assert forecast.unidentified == 1.0
    # every copy's test rejects phi = 0, its interval's hull holds 0: its verdict tells nothing, and so neither does
    # the power
    assert (forecast.p_values["phi = 0"] <= LEVEL).all() and (forecast.half_widths > 1).all()
    assert forecast.power("phi = 0") == 0.0 and forecast.power("phi = 1") == 0.0


def test_a_matched_cell_without_a_noise_estimate_says_it_has_no_interval():
    grid = {1e18: (8, 10, 12), 2.15e18: (10, 12, 14), 4.64e18: (12, 14, 16)}  # 3 runs a cell: no residual
    a, b = (paper_runs(noise=0.01, seed=seed, grid=grid, recurrences=(1, 2)) for seed in (0, 1))
    cells = matched_cells(a, b, stage=None, n_bootstrap=20, seed=0, confidence=0.95)
    assert len(cells) == 6 and not np.isfinite(cells["lo"]).any()
    text = "\n".join(evidence_text(cells, "A", "B", 0.95))
    assert "nan" not in text and text.count("(no interval;") == 6 and "6 without an interval" in text


def test_a_constant_whose_bootstrap_interval_misses_its_estimate_is_named_beside_it():
    result = analyze(paper_runs(noise=0.01), name="paper", options=FitOptions(n_starts=40, n_bootstrap=20))
    joint = result.suite.joint
    for name in ("E", "A", "alpha", "B", "beta", "phi"):  # a well-determined fit: each estimate inside its interval
        assert joint.ci[name][0] <= getattr(joint, name) <= joint.ci[name][1], name
    assert joint.outside_bootstrap() == [] and "lies wholly" not in result.summary_text()
    # resamples whose refits all settle above the data's A, as a fit of a flat objective's edge had them
    shifted = dataclasses.replace(joint, ci={**joint.ci, "A": (joint.A * 1.005, joint.A * 2400)})
    result.suite = dataclasses.replace(result.suite, joint=shifted)
    text = result.summary_text().replace("\n  ", " ")
    assert "warning: the bootstrap interval of A (" in text and f"lies wholly above its estimate" in text
    assert result.summary()["bootstrap_outside_estimate"] == shifted.outside_bootstrap()
