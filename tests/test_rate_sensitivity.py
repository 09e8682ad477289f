"""phi's sensitivity to the learning rate (``rate_sensitivity = true``): a tiny real sweep trains each cell's best
width again at the rate x 1/2 and x 2, from the best trial's own seed; ``loopscale analyze`` reports phi and the
gaps to r = 1 at each rate in summary.json (``joint.rate_sensitivity``) with its verdict, and the calibration's
rate with its interval (``calibration``); ``loopscale plan`` prices the extra stages."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from loopscale.analysis.cli import analyze_experiment
from loopscale.analysis.options import DEFAULT_FIT_OPTIONS
from loopscale.analysis.rate_sensitivity import (DECIDES, ROBUST, UNJUDGED, best_runs, lines, rate_sensitivity,
                                                 stage_name)
from loopscale.analysis.suite import fit_suite
from loopscale.model import JointLaw
from loopscale.objectives.noise import Noise
from loopscale.search import SweepSpec
from loopscale.search.precision.design import design_of
from loopscale.search.plan.flops import rate_sensitivity_estimate
from loopscale.search.plan.walltime import Throughput, estimate
from loopscale.search.tune.driver import run_search
from loopscale.search.validate import search_recipe
from test_spec import write_spec

STEPS = Throughput(flops_per_s=5e9, step_s=0.1, shape="", device="cpu", setup_s=2.0, side_by_side=2)


def tiny(tmp_path, **overrides) -> SweepSpec:
    """Budgets 2e9 and 4e9 x r in {1, 2}, two widths per cell on a grid (heads of 8), a seed per trial, after a
    4-trial calibration of base_lr, and the rate sensitivity."""
    return SweepSpec.from_toml(write_spec(
        tmp_path, objective="train", budgets=[2e9, 4e9], recurrences=[1, 2], trials_per_cell=2, sampler="grid",
        seeds="per_trial", val_tokens=2048, data={"source": "kjv"}, recipe={"log_every": 4, "base_lr": 0.02},
        template={"width_unit": 8, "head_dim": 8}, widths={"s_min": 1, "s_max": 4}, rate_sensitivity=True,
        calibrate={"budget": 2e9, "s": 2, "r": 1, "trials": 4, "low": 0.01, "high": 0.08},
        resources={"max_concurrent": 2}, **overrides))


def test_plan_prices_the_rate_stages_and_a_simulated_sweep_is_refused(tmp_path):
    spec = tiny(tmp_path)
    assert [name for name, _ in spec.sensitivity.stages()] == ["rate_x0.5", "rate_x2"]
    assert rate_sensitivity_estimate(spec).startswith("rate sensitivity: 8 trials (each cell's best width at the "
                                                      "rate x 0.5 and x 2)")
    stages = estimate(spec, STEPS).stages
    assert stages["rate_x0.5"][2] == stages["rate_x2"][2] == 4 and stages["rate_x2"][0] > 0
    assert SweepSpec.from_toml(write_spec(tmp_path, filename="off.toml")).sensitivity.stages() == []
    assert tiny(tmp_path).spec_hash == SweepSpec.from_toml(write_spec(  # after the sweep: never hashed
        tmp_path, filename="without.toml", objective="train", budgets=[2e9, 4e9], recurrences=[1, 2],
        trials_per_cell=2, sampler="grid", seeds="per_trial", val_tokens=2048, data={"source": "kjv"},
        recipe={"log_every": 4, "base_lr": 0.02}, template={"width_unit": 8, "head_dim": 8},
        widths={"s_min": 1, "s_max": 4}, calibrate={"budget": 2e9, "s": 2, "r": 1, "trials": 4, "low": 0.01,
                                                     "high": 0.08}, resources={"max_concurrent": 2})).spec_hash
    with pytest.raises(ValueError, match="rate_sensitivity = true needs objective"):
        SweepSpec.from_toml(write_spec(tmp_path, filename="sim.toml", rate_sensitivity=True))


@pytest.mark.slow
@pytest.mark.integration
def test_a_tiny_sweep_reports_phi_and_the_gaps_at_each_rate(tmp_path):
    spec = tiny(tmp_path)
    run_search(spec)
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'", max_results=100)
    by_stage = {}
    for run in runs:
        by_stage.setdefault(run.data.tags["stage"], []).append(run)
    assert {k: len(v) for k, v in by_stage.items()} == {"calibrate": 4, "search": 8, "rate_x0.5": 4, "rate_x2": 4}
    best = {}
    for run in by_stage["search"]:
        cell = run.data.tags["cell"]
        if cell not in best or run.data.metrics["val_loss"] < best[cell].data.metrics["val_loss"]:
            best[cell] = run
    for factor in (0.5, 2):
        for run in by_stage[f"rate_x{factor:g}"]:  # the best width, its seed, its rate x factor
            search = best[run.data.tags["cell"]]
            for key in ("s", "seed", "order_seed"):
                assert run.data.params[key] == search.data.params[key]
            assert float(run.data.params["recipe.base_lr"]) == pytest.approx(
                factor * float(search.data.params["recipe.base_lr"]))

    out = analyze_experiment(spec.name, spec.placement.tracking_uri, out=tmp_path / "analysis", log=False)
    summary = json.loads((out / "summary.json").read_text())
    calibration = summary["calibration"]
    assert calibration["base_lr"] == pytest.approx(float(by_stage["search"][0].data.params["recipe.base_lr"]))
    assert "ci" in calibration and calibration["trials"] == 4
    assert search_recipe(spec)["base_lr"] == calibration["base_lr"]  # the rate validation rungs would train at
    sensitivity = summary["joint"]["rate_sensitivity"]
    assert sensitivity["factors"] == [0.5, 1.0, 2.0] and sensitivity["runs"] == [4, 4, 4]
    assert sensitivity["verdict"] in (ROBUST, DECIDES, UNJUDGED) and len(sensitivity["phi"]) == 3
    loss = {(f, run.data.tags["cell"]): run.data.metrics["val_loss"]
            for f in (0.5, 2.0) for run in by_stage[f"rate_x{f:g}"]}
    loss.update({(1.0, cell): run.data.metrics["val_loss"] for cell, run in best.items()})
    for gap in sensitivity["gaps_to_r1"]:  # each r's best width against r = 1's, per budget, at each rate
        cells = [f"C={gap['budget_flops']:.3g},r={r}" for r in (gap["r"], 1)]
        assert np.allclose(gap["gap"], [loss[(f, cells[0])] - loss[(f, cells[1])] for f in (0.5, 1.0, 2.0)])
    assert len(sensitivity["gaps_to_r1"]) == 2
    for r, factor in sensitivity["best_factor_by_r"].items():
        summed = {f: sum(v for (g, cell), v in loss.items() if g == f and cell.endswith(f"r={r}"))
                  for f in (0.5, 1.0, 2.0)}
        assert factor == min(summed, key=summed.get)
    assert f"verdict: {sensitivity['verdict']}" in (out / "summary.txt").read_text()


def simulated_sweep(tmp_path):
    """A simulated sweep of 9 cells (3 budgets x r in {1, 2, 4}) under the smoke preset's law, quiet enough that
    phi is located from one run per cell, and its joint fit."""
    spec = SweepSpec.from_toml("smoke", ["budgets=[1e12, 3e12, 1e13]", "trials_per_cell=4"],
                               tracking_uri=f"sqlite:///{tmp_path}/unused.db")
    runs = design_of(spec, JointLaw(**spec.simulation.law), Noise(noise=0.001, cell_noise=0.0, misspec=0.0), 2).runs
    options = dataclasses.replace(DEFAULT_FIT_OPTIONS, n_bootstrap=0)
    return runs, fit_suite(runs, options=options).joint, options


def at_rate(best: pd.DataFrame, factor: float, shift) -> pd.DataFrame:
    return best.assign(stage=stage_name(factor), val_loss=best["val_loss"] + best["r"].map(shift))


def test_the_verdict_holds_when_the_rate_shifts_every_r_alike_and_not_when_it_reverses_a_gap(tmp_path):
    runs, joint, options = simulated_sweep(tmp_path)
    assert np.isfinite(joint.phi_profile_ci).all()
    best = best_runs(runs)
    alike = pd.concat([runs, at_rate(best, 0.5, lambda r: 0.004), at_rate(best, 2.0, lambda r: 0.002)])
    robust = rate_sensitivity(alike, joint, options)
    assert robust["verdict"] == ROBUST and robust["runs"] == [9, 9, 9] and np.isfinite(robust["phi"]).all()
    assert all(abs(m) < joint.phi_profile_ci[1] - joint.phi_profile_ci[0] for m in robust["phi_move"])
    assert robust["best_factor_by_r"] == {"1": 1.0, "2": 1.0, "4": 1.0} and robust["best_rate_differs"] == {}
    # at x 2 the unique model loses 0.2 nats and the looped ones gain 0.01: looping starts to pay everywhere
    reversed_gap = pd.concat([runs, at_rate(best, 0.5, lambda r: 0.004),
                              at_rate(best, 2.0, lambda r: 0.2 if r == 1 else -0.01)])
    decided = rate_sensitivity(reversed_gap, joint, options)
    assert decided["verdict"] == DECIDES and "a gap to r = 1 changes sign" in decided["why"]
    assert decided["best_rate_differs"] == {"2": 2.0, "4": 2.0}
    assert any("r=2's best rate is x2, r=1's x1" in line for line in lines(decided))
    assert rate_sensitivity(runs, joint, options) is None  # no rate stage ran
