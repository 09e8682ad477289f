"""``loopscale plan``'s wall-time estimate covers the whole command: Ray's start, the calibration stage, the search
stage (each trial's set-up, steps, warmdown branches, evaluations and hand-over, replayed over the slots), the
compile warm-up per shape where trials compile, and the analysis. Step times are given here (a fixed
``Throughput``) so the arithmetic is checked exactly; the probe itself is timed once, side by side."""

from __future__ import annotations

import math
import os

import pytest

from loopscale.model import flops_per_token, tokens_for_budget
from loopscale.objectives.recipe import normalize_recipe, warmdown_start
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.plan import (ANALYSIS_S, OVERHEAD_S_PER_TRIAL, RAY_START_S, STAGE_START_S, Throughput,
                                   estimate, likely_widths, measure_throughput, render_estimate)

STEPS = Throughput(flops_per_s=1e9, step_s=0.05, shape="", device="cpu", setup_s=1.0, side_by_side=1)


def price(spec: SweepSpec, budget: float, s: float, r: int, throughput: Throughput = STEPS) -> float:
    """One trial written out from the trial's definition (objectives/train.py): set-up, its steps and every
    branch's warmdown steps at the step time, and an evaluation (val_tokens / batch_tokens forward passes at a
    third of a step) for itself and each branch."""
    config = spec.model(s, r)
    step = throughput.step_seconds(flops_per_token(config) * spec.batch_tokens)
    recipe = normalize_recipe(spec.recipe)
    steps = tokens_for_budget(config, budget, spec.batch_tokens) // spec.batch_tokens
    last_fork, extra, branches = warmdown_start(recipe, steps), 0, 0
    for c_k in recipe["branch_budgets"]:
        steps_k = tokens_for_budget(config, c_k, spec.batch_tokens) // spec.batch_tokens if c_k < budget else 0
        if 0 < steps_k < steps and warmdown_start(recipe, steps_k) <= last_fork:
            extra += steps_k - warmdown_start(recipe, steps_k)
            branches += 1
    evaluation = spec.val_tokens / spec.batch_tokens * step / 3
    return throughput.setup_s + (steps + extra) * step + (1 + branches) * evaluation


def one_slot(*sets: str) -> SweepSpec:
    return SweepSpec.from_toml("demo", ["resources.max_concurrent=1", *sets])


def test_the_calibration_stage_is_priced_with_its_branches_and_evaluations():
    """The demo's calibration trials, one after the other, each with a warmdown branch at a third of its budget
    (its warmdown steps and its evaluation priced), against the same trials without branches."""
    budget = one_slot().calibrate.budget
    spec = one_slot(f"recipe.branch_budgets=[{budget / 3}]")
    cal = spec.calibrate
    expected = STAGE_START_S + cal.trials * (OVERHEAD_S_PER_TRIAL + price(spec, cal.budget, cal.s, cal.r))
    low, high, trials = estimate(spec, STEPS).stages["calibrate"]
    assert trials == cal.trials and low == high == pytest.approx(expected)
    no_branches = estimate(one_slot("recipe.branch_budgets=[]"), STEPS).stages["calibrate"][0]
    assert low - no_branches > cal.trials * STEPS.step_s  # the branches' warmdown steps and evaluations


def test_one_slot_sums_every_trial_and_the_eta_adds_start_and_analysis():
    spec = one_slot()
    parts = estimate(spec, STEPS)
    search = sum(OVERHEAD_S_PER_TRIAL + price(spec, c.budget, s, c.r)
                 for c in spec.cells() for s in likely_widths(spec, c))
    assert parts.stages["search"][0] == pytest.approx(STAGE_START_S + search)
    narrowest = sum(OVERHEAD_S_PER_TRIAL + price(spec, c.budget, s, c.r)
                    for c in spec.cells() for s in c.widths[:c.n_trials])
    assert parts.stages["search"][1] == pytest.approx(STAGE_START_S + narrowest)  # the costliest widths
    assert parts.analysis_s == ANALYSIS_S
    low = RAY_START_S + parts.stages["calibrate"][0] + parts.stages["search"][0] + parts.analysis_s
    assert parts.total_s[0] == pytest.approx(low)


def test_the_last_long_trial_runs_with_its_slot_neighbour_idle():
    """Two cells of one trial each on two slots: the stage lasts as long as the longer trial, not half the sum."""
    demo = SweepSpec.from_toml("demo")
    spec = SweepSpec.from_toml("demo", ["resources.max_concurrent=2", f"budgets=[{min(demo.budgets)}, "
                                        f"{max(demo.budgets)}]", "recurrences=[1]", "trials_per_cell=1"])
    small, large = spec.cells()
    seconds = [OVERHEAD_S_PER_TRIAL + price(spec, c.budget, c.first_guess, c.r) for c in (small, large)]
    assert estimate(spec, STEPS).stages["search"][0] == pytest.approx(STAGE_START_S + max(seconds))


def test_simulated_trials_cost_their_hand_over_only():
    spec = SweepSpec.from_toml("smoke", ["resources.max_concurrent=2"])
    parts = estimate(spec, STEPS)
    trials = spec.planned_trials() - 1
    expected = STAGE_START_S + math.ceil(trials / 2) * OVERHEAD_S_PER_TRIAL
    assert parts.stages["search"][:2] == (pytest.approx(expected), pytest.approx(expected))


def test_compile_warm_up_is_paid_once_per_shape():
    spec = one_slot("recipe.compile_cpu=true")
    compiled = Throughput(**{**STEPS.__dict__, "compile_s": 100.0})
    shapes = {(s, c.r) for c in spec.cells() for s in likely_widths(spec, c)}
    search = estimate(spec, compiled).stages["search"][0] - estimate(spec, STEPS).stages["search"][0]
    calibrate = estimate(spec, compiled).stages["calibrate"][0] - estimate(spec, STEPS).stages["calibrate"][0]
    assert search == pytest.approx(100.0 * len(shapes)) and calibrate == pytest.approx(100.0)


def test_plan_demo_prints_the_whole_commands_eta(capsys):
    parts = estimate(SweepSpec.from_toml("demo"), STEPS)
    lines = render_estimate(SweepSpec.from_toml("demo"), parts)
    assert any(line.lstrip().startswith("calibrate stage") for line in lines)
    assert any(line.lstrip().startswith("analysis (loopscale analyze)") for line in lines)
    assert lines[-1].startswith("ETA search + analysis: ") and lines[-1].endswith(" = the ETA of loopscale demo")
    cut = SweepSpec.from_toml("demo", ["trials_per_cell=1"])
    assert not render_estimate(cut, estimate(cut, STEPS))[-1].endswith("loopscale demo")  # not the demo any more


@pytest.mark.slow
def test_the_probe_times_the_step_with_the_sweeps_trials_side_by_side(capsys):
    """The demo runs two trials at once on two cores: the probe times its step in two processes at once."""
    spec = SweepSpec.from_toml("demo")
    throughput = measure_throughput(spec, max_steps=1, min_seconds=0.0)
    assert throughput.side_by_side == min(spec.concurrency("search", os.cpu_count()), spec.planned_trials()) >= 2
    assert throughput.flops_per_s > 0 and throughput.step_s >= 0
    assert main(["plan", "demo"]) == 0
    assert "ETA search + analysis: " in capsys.readouterr().out
