"""The typed trial config: built and checked once where the search makes a trial, shipped through Tune as plain
data and back, and taken as it is by the objectives."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle

import pytest

from loopscale.objectives import TrialConfig, simulate, train
from loopscale.search import SweepSpec
from loopscale.search.tune.searcher import CellSearcher
from loopscale.search.tune.studies import CellStudy, make_studies
from test_spec import write_spec


@pytest.fixture
def demo():
    return SweepSpec.from_toml("demo")


@pytest.mark.parametrize("budget, message", [
    (1e3, r"budget 1e\+03 FLOPs buys no optimizer step of 4096 tokens at width {width} \(s=2, r={r}\)"),
    (-1e12, r"budget_flops must be a positive finite FLOP count, got -1000000000000.0"),
    (math.nan, r"budget_flops must be a positive finite FLOP count, got nan"),
])
def test_a_bad_budget_is_refused_in_one_line_where_the_trial_is_built(demo, budget, message):
    cell = dataclasses.replace(demo.cells()[0], budget=budget)
    message = message.format(width=demo.grid.model(2.0, cell.r).width, r=cell.r)
    with pytest.raises(ValueError, match=f"^trial config: {message}$"):
        demo.trial_config(cell, 2.0)
    good = demo.trial_config(demo.cells()[0], 2.0)
    with pytest.raises(ValueError, match=f"^trial config: {message}$"):  # a changed copy is checked too
        dataclasses.replace(good, budget_flops=budget)


def test_a_spec_whose_budget_buys_too_few_steps_is_refused_before_any_trial(tmp_path):
    with pytest.raises(ValueError, match=r"^spec.toml: budget 1e\+06 FLOPs buys fewer than min_steps=10 optimizer "
                                         r"steps of 512 tokens even at the narrowest width \(s=1, r=1\); [^\n]*$"):
        SweepSpec.from_toml(write_spec(tmp_path, budgets=[1e6, 1e13]))


def test_params_round_trip_through_json_as_tune_ships_them(demo, tmp_path):
    simulated = SweepSpec.from_toml(write_spec(tmp_path, simulate={"noise": 0.0}))
    for spec in (demo, simulated):
        for stage in ("calibrate", "search"):
            for cell in spec.cells(stage):
                trial = spec.trial_config(cell, cell.first_guess)
                params = json.loads(json.dumps(trial.to_params()))
                assert TrialConfig.from_params(params) == trial
                assert simulate(TrialConfig.from_params(params))["val_loss"] == simulate(trial)["val_loss"]


def test_a_dict_written_before_trials_were_typed_reads_back_the_same(demo):
    """What search/space.py wrote before TrialConfig (the dict in Tune's saved state, hashed into receipts and
    logged as MLflow params) decodes into the same trial and encodes into the same dict: a resumed sweep keeps
    its receipts and params."""
    cell = demo.cells()[0]
    old = {"budget_flops": cell.budget, "r": cell.r, "s": 2.0, "template": demo.grid.model_template(),
           "batch_tokens": demo.grid.batch_tokens, "seed": demo.sampling.seed, "objective": "train",
           "data": demo.training.data,
           "recipe": dict(demo.training.recipe), "device": "cpu", "num_threads": 1,
           "cache_dir": demo.placement.cache_dir,
           "val_tokens": demo.training.val_tokens}
    trial = TrialConfig.from_params(old)
    assert trial == demo.trial_config(cell, 2.0) and trial.to_params() == old


@pytest.mark.parametrize("params, what", [
    ({"objective": "train", "budget_flops": 1e12, "r": 1, "s": 2.0, "template": {}, "batch_tokens": 4096,
      "lanes": 2}, "unknown key\\(s\\) lanes"),
    ({"objective": "bake", "budget_flops": 1e12}, "objective 'bake'"),
    ({"objective": "train", "r": 1}, "no budget_flops, s, template, batch_tokens"),
])
def test_a_dict_this_version_did_not_write_is_refused_in_one_line(params, what):
    with pytest.raises(ValueError, match=f"^trial config with {what}: it was not written by this version"):
        TrialConfig.from_params(params)


def test_the_searcher_builds_typed_trials_and_ships_their_params(demo):
    """A cell's study turns each proposal into a TrialConfig (checked as it is built); Tune gets its params, which
    decode into the very trial the study built."""
    (study,) = make_studies(demo, "calibrate", demo.training.recipe)
    _, trial = study.ask()  # the spec's own rate first
    assert isinstance(trial, TrialConfig) and trial.recipe["base_lr"] == demo.training.recipe["base_lr"]
    searcher = CellSearcher(make_studies(demo, "search", demo.training.recipe))
    suggested = searcher.suggest("t0")
    trial = TrialConfig.from_params(suggested["trial"])
    assert trial.s == suggested["trial"]["s"] and trial.budget_flops == min(demo.grid.budgets)


def test_a_searcher_saved_with_a_dict_base_resumes_typed(demo):
    """Tune's pickled searcher of a sweep started before trials were typed holds each cell's base trial as a
    dict; restored now, the study holds the TrialConfig and proposes as before."""
    (study,) = make_studies(demo, "calibrate", demo.training.recipe)
    state = pickle.loads(pickle.dumps(study)).__getstate__()
    state["base"] = study.base.to_params()  # the old layout
    restored = CellStudy.__new__(CellStudy)
    restored.__setstate__(state)
    assert restored.base == study.base
    assert restored.ask()[1] == study.ask()[1]


def test_the_train_objective_takes_the_typed_config_not_a_dict(demo):
    """train reads the trial's fields, never dict keys: a plain dict (unchecked) cannot reach it."""
    trial = demo.trial_config(demo.cells()[0], 2.0)
    with pytest.raises(AttributeError, match="'dict' object has no attribute"):
        train(trial.to_params())
