"""One verdict per fit: phi's profile interval and the F tests of phi = 0 and phi = 1 agree by construction, the
summary carries them, the printed report shows one verdict, and an r the sweep never ran is called
extrapolated."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from loopscale.analysis import fit_suite
from loopscale.analysis.cli import main
from loopscale.analysis.fit_problem import FitData, fit_rows
from loopscale.analysis.options import FitOptions
from loopscale.analysis.profile_interval import NestedTest, Profile, profile_phi, theta_of
from loopscale.analysis.report import analyze
from loopscale.model import PAPER_LAW
from test_analysis_sim import PAPER_GRID, paper_runs

LEVEL = 0.05
QUICK = FitOptions(n_starts=60, n_bootstrap=0)
LOW = {c: PAPER_GRID[c] for c in list(PAPER_GRID)[:3]}


def _excludes(interval: tuple[float, float], value: float) -> bool:
    return not interval[0] <= value <= interval[1]


@pytest.mark.parametrize("phi, noise, grid", [
    (0.46, 0.01, PAPER_GRID),  # the paper's sweep: both 0 and 1 rejected
    (0.0, 0.01, PAPER_GRID),   # a recurrence worth nothing: 0 not rejected, 1 rejected
    (1.0, 0.01, PAPER_GRID),   # worth a unique block: 1 not rejected, 0 rejected
    (0.46, 0.05, LOW),         # three low budgets and more noise: near the level
])
def test_the_profile_interval_excludes_0_and_1_exactly_when_their_tests_reject(phi, noise, grid):
    joint = fit_suite(paper_runs(dataclasses.replace(PAPER_LAW, phi=phi), noise=noise, grid=grid),
                      options=QUICK).joint
    assert _excludes(joint.phi_profile_ci, 0.0) == (joint.p_phi0 <= LEVEL), (joint.phi_profile_ci, joint.p_phi0)
    assert _excludes(joint.phi_profile_ci, 1.0) == (joint.p_phi1 <= LEVEL), (joint.phi_profile_ci, joint.p_phi1)
    assert joint.phi_profile_ci[0] <= joint.phi <= joint.phi_profile_ci[1]
    if phi in (0.0, 1.0):  # the truth itself is not rejected, the other end is
        assert (joint.p_phi0 > LEVEL) == (phi == 0.0) and (joint.p_phi1 > LEVEL) == (phi == 1.0), joint.verdict
    if noise == 0.01 and phi == 0.46:
        assert joint.verdict.startswith("a recurrence is worth more than nothing and less than a unique block")
    if phi == 0.0:
        assert "cannot tell it from nothing (phi = 0)" in joint.verdict
        assert any("phi = 0 fits as well" in w for w in joint.warnings)


def test_inside_delta_the_test_is_the_classical_F_of_nested_least_squares_over_the_design_effect():
    # a truth with phi = 0 and 0.2 milli-nat noise: every log residual of the joint fit and of the phi = 0 fit lies
    # inside the Huber delta (1e-3), where the objective is SS / 2
    runs = paper_runs(dataclasses.replace(PAPER_LAW, phi=0.0), noise=0.0002)
    suite = fit_suite(runs, options=QUICK)
    rows = fit_rows(runs, QUICK)

    def ss(fit):
        return float(((np.log(fit.predict(rows)) - np.log(rows["val_loss"].to_numpy(float))) ** 2).sum())

    for fit in (suite.joint, suite.phi0):
        assert np.abs(np.log(fit.predict(rows) / rows["val_loss"].to_numpy(float))).max() < 1e-3
    classical = (ss(suite.phi0) - ss(suite.joint)) / (ss(suite.joint) / (len(rows) - 6))
    data = FitData.from_runs(rows)
    test = NestedTest.at(data, theta_of(suite.joint), suite.joint.huber, QUICK.delta)
    # the classical F, its scale times the design effect the residuals' cell means show (analysis.overdispersion)
    assert test.statistic(suite.phi0.huber) * test.design_effect == pytest.approx(classical, rel=1e-3)


def test_the_interval_is_the_hull_of_the_accepted_values_and_says_when_it_reaches_a_bound():
    test = NestedTest(f_min=1.0, scale=0.01, dof=100)
    cut = test.f_min + test.scale * 3.936  # F(1, 100) at 95%: 3.936
    values = np.linspace(-3, 3, 7)
    shape = Profile(values=values, f=np.array([cut - 0.01, cut - 0.01, 1.0, cut + 1, 1.0, cut + 1, cut + 1]),
                    thetas=np.zeros((7, 6)), test=test, confidence=0.95, bounds=(-3.0, 3.0))
    assert shape.ci == (-3.0, 1.0) and shape.reaches == (-3.0,) and shape.segments == 2
    assert shape.p(0.0) < LEVEL < shape.p(1.0)
    with pytest.raises(ValueError, match="not a point of the profile"):
        shape.p(0.5)


def test_a_faster_fixed_phi_fitter_drops_in():
    runs = paper_runs(noise=0.01)
    joint = fit_suite(runs, options=QUICK).joint
    data = FitData.from_runs(fit_rows(runs, QUICK))
    calls = []

    def counted(data, phis, warm, options):
        from loopscale.analysis.profile_interval import fit_at_phi

        calls.extend(phis)
        return fit_at_phi(data, phis, warm, options)

    shape = profile_phi(data, theta_of(joint), joint.huber, QUICK, fitter=counted)
    assert set(calls) == set(shape.values) and 0.0 in calls and 1.0 in calls
    assert shape.ci == pytest.approx(joint.phi_profile_ci, abs=2e-3)


def test_summary_and_printed_report_carry_one_verdict():
    result = analyze(paper_runs(noise=0.01), name="paper", options=FitOptions(n_starts=60, n_bootstrap=20))
    joint = result.summary()["joint"]
    assert joint["verdict"] == result.suite.joint.verdict and joint["verdict"].startswith("a recurrence is worth")
    lo, hi = joint["phi_profile_ci"]
    assert lo < joint["phi"] < hi and joint["p_phi0"] < LEVEL and joint["p_phi1"] < LEVEL
    text = result.summary_text()
    assert text.count("verdict: ") == 1 and "phi = 0 fits as well" not in text
    assert "95% profile CI" in text and "bootstrap 95% CI" in text


@pytest.fixture(scope="module")
def paper_table(tmp_path_factory):
    path = tmp_path_factory.mktemp("verdict") / "paper.csv"
    paper_runs(noise=0.01).to_csv(path, index=False)
    return path


FAST = ["--n-starts", "40", "--n-bootstrap", "10"]


@pytest.mark.parametrize("argv", [
    ["predict", "--budget", "1e18", "--r", "16"],
    ["export", "--budgets", "1e18", "--r", "1,16"],
    ["analyze", "--r", "1,16", "--no-log"],
], ids=["predict", "export", "analyze"])
def test_an_r_outside_the_sweep_is_called_extrapolated(argv, paper_table, tmp_path, capsys):
    extra = ["--out", str(tmp_path / "out")] if argv[0] == "analyze" else []
    assert main([*argv, "--experiment", str(paper_table), *extra, *FAST]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "r=16 was not run (the law was fitted on r = 1, 2, 4, 8): the law is extrapolated there" in err
    assert "r=1 was not run" not in err


def test_the_published_law_at_an_r_beyond_the_papers_is_extrapolated(capsys):
    assert main(["predict", "--law", "paper", "--budget", "1e18", "--r", "16"]) == 0
    assert "r=16 was not run (the law was fitted on r = 1, 2, 4, 8): the law is extrapolated there" in " ".join(
        capsys.readouterr().err.split())


def test_an_undecided_verdict_says_how_to_price_a_decisive_one():
    result = analyze(paper_runs(dataclasses.replace(PAPER_LAW, phi=0.0), noise=0.01), name="flat",
                     options=FitOptions(n_starts=60, n_bootstrap=10))
    assert "cannot tell it from nothing" in result.suite.joint.verdict
    text = " ".join(result.summary_text().split())
    assert "loopscale plan SPEC --precision --pilot flat --target-half-width 0.1" in text
