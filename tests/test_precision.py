"""``loopscale plan SPEC --precision``: phi's forecast interval narrows as a design grows, its test of phi = 0
rejects at about its level when phi is 0, the cheapest-design search returns a design that meets its target in a
simulation of its own, the noise a pilot's residuals show is measured back, and bad input is one line, exit 2.
No Ray: the designs come from the spec's sampler driven in-process, the copies from the simulated loss model."""

from __future__ import annotations

import dataclasses

import pytest

from loopscale.analysis import fit_joint_law
from loopscale.analysis.options import Bounds, FitOptions
from loopscale.analysis.precision import forecast_phi, measured_noise
from loopscale.model import JointLaw
from loopscale.objectives.noise import Noise
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.precision.design import design_of
from loopscale.search.precision.forecast import Target, cheapest, forecast
from loopscale.search.precision.inputs import setting_of

# phi's bounds narrowed to [-1, 2]: the profile's grid has half the points, and no copy's interval reaches them
OPTIONS = FitOptions(n_starts=20, bounds=Bounds(phi=(-1.0, 2.0)))
# the smoke preset's simulated cells on a grid of widths, r = 1 and 2, independent noise only
SMALL = ['sampler="grid"', "recurrences=[1, 2]", "simulate.cell_noise=0", "simulate.misspec=0"]
# 0.002 nats: about 0.0007 in log loss, inside the fit's Huber delta (1e-3), where the fit is least squares and an
# interval narrows with more runs as 1 / sqrt(n); at 0.01 nats four copies cannot tell 12 runs from 48 (both 0.06)
QUIET = "simulate.noise=0.002"


def small(*sets: str) -> SweepSpec:
    return SweepSpec.from_toml("smoke", [*SMALL, *sets])


def setting(spec: SweepSpec, sims: int, law: JointLaw | None = None):
    found = setting_of(spec, None, None, sims, 2, OPTIONS)
    return found if law is None else dataclasses.replace(found, law=law)


def test_the_forecast_half_width_shrinks_as_the_design_grows():
    few = small(QUIET, "trials_per_cell=3")
    many = small(QUIET, "trials_per_cell=12", "budgets=[1e12, 1e13, 1e14]")
    narrow = {}
    for name, spec in (("few", few), ("many", many)):
        outcome = forecast(spec, setting(spec, 4))
        narrow[name] = outcome.phi
    assert narrow["many"].median < 0.7 * narrow["few"].median, (narrow["many"].median, narrow["few"].median)
    assert narrow["many"].n == narrow["few"].n == 4


def test_the_test_of_phi_0_rejects_at_about_its_level_when_phi_is_0():
    spec = small("trials_per_cell=3")
    at_null = setting(spec, 16)
    at_null = dataclasses.replace(at_null, law=dataclasses.replace(at_null.law, phi=0.0))
    outcome = forecast(spec, at_null)
    assert outcome.phi.power("phi = 0") <= 0.2  # nominal 0.05; 16 copies: one standard error is 0.055
    assert outcome.phi.power("phi = 1") >= 0.8  # and the same copies tell phi = 0 from 1


def test_the_cheapest_design_meets_its_target_in_its_own_resimulation():
    spec = small(QUIET, "trials_per_cell=3")
    sims = 4
    chosen = setting(spec, sims)
    own = forecast(spec, chosen)
    target = Target(half_width=0.8 * own.phi.median)
    found = cheapest(spec, lambda sets: small(QUIET, "trials_per_cell=3", *sets), chosen, own, target, reported=1)
    assert found.met, (own.phi.median, found.best.phi.median if found.best else None)
    best = found.met[0]
    assert best.design.flops >= own.design.flops and best.phi.median <= target.half_width
    again = forecast_phi((best.design.copy(chosen.law, chosen.noise, k) for k in range(sims, 3 * sims)), OPTIONS)
    assert again.median <= target.half_width + 2 * again.median_error, (again.median, target.half_width)


def test_the_noise_of_a_pilot_is_measured_back():
    spec = small("trials_per_cell=8", "budgets=[1e12, 3e12, 1e13, 3e13]", "recurrences=[1, 2, 4]")
    truth = Noise(noise=0.01, cell_noise=0.02, misspec=0.0)
    chosen = setting(spec, 1)
    runs = design_of(spec, chosen.law, truth, 2).copy(chosen.law, truth, 0)
    within, offsets = measured_noise(fit_joint_law(runs, options=dataclasses.replace(OPTIONS, n_bootstrap=0)),
                                     runs, OPTIONS)
    assert 0.007 < within < 0.014 and 0.01 < offsets < 0.035, (within, offsets)


def test_delta_phi_against_a_baseline_runs_table(capsys, tmp_path):
    spec = small(QUIET, "trials_per_cell=3")
    chosen = setting(spec, 1)
    base = design_of(spec, chosen.law, chosen.noise, 2).copy(chosen.law, chosen.noise, 0)
    base.drop(columns=["width"]).to_csv(tmp_path / "base.csv", index=False)  # a table without widths, too
    argv = ["plan", "smoke", *(a for item in (*SMALL, QUIET, "trials_per_cell=3") for a in ("--set", item)),
            "--precision", "--baseline", str(tmp_path / "base.csv"), "--delta", "0.5", "--sims", "2"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())  # the lines wrap
    assert f"Delta-phi against the baseline (sweep '{tmp_path / 'base.csv'}'" in out
    assert "at Delta = 0.5, one model with a shared base law" in out and "power to tell it from 0: 100%" in out


@pytest.mark.parametrize("argv, message", [
    (["--precision", "--sims", "1"], "--sims must be between 2"),
    (["--precision", "--mfu", "1.5"], "--mfu must be in (0, 1]"),
    (["--precision", "--gpu-flops", "0"], "--gpu-flops must be a positive"),
    (["--pilot", "demo"], "--pilot is an option of the precision forecast: add --precision"),
    (["--precision", "--baseline", "a", "--baseline-phi", "0.5"], "exclude each other"),
    (["--precision", "--power", "1"], "--power must be in (0, 1)"),
    (["--precision", "--delta", "0"], "--delta must not be 0"),
    (["--precision", "--target-half-width", "-0.1"], "--target-half-width must be > 0"),
    (["--precision", "--pilot", "no-such-sweep"], "no MLflow database at"),
])
def test_bad_precision_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["plan", "smoke", *argv, *(["--tracking-uri", uri] if "--pilot" in argv[1:] else [])]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "mlflow.db"])
