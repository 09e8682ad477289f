"""Warmdown branches: a wsd trial records the loss at smaller budgets' token counts by branching a warmdown
from its constant phase; each branch is a point of the runs table with the accounting's tokens and FLOPs."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from loopscale.analysis.flops import flops_spent
from loopscale.analysis.runs import validate_runs
from loopscale.model import flops_per_token, tokens_for_budget
from loopscale.objectives import TrialConfig, simulate, train, validate_recipe
from loopscale.objectives.branches import branch_budgets
from loopscale.objectives.recipe import normalize_recipe, warmdown_start
from test_train import BATCH, cache_dir, trial  # noqa: F401 (fixture)

WSD = {"schedule": "wsd", "warmdown_frac": 0.25}
BRANCHES = [3e10, 6e10]


@pytest.fixture(scope="module")
def branched(cache_dir):
    return train(trial(cache_dir, 2, 2, 1e11, {**WSD, "branch_budgets": BRANCHES}))


def test_branch_points_have_the_accountings_tokens_and_flops(branched, cache_dir):
    config = trial(cache_dir, 2, 2, 1e11).model_config
    f = flops_per_token(config)
    recipe = normalize_recipe(WSD)
    warmdown_tokens = 0
    for i, budget in enumerate(BRANCHES):
        tokens = tokens_for_budget(config, budget, BATCH)
        steps = tokens // BATCH
        assert branched[f"branch{i}.budget_flops"] == budget
        assert branched[f"branch{i}.tokens"] == tokens and branched[f"branch{i}.steps"] == steps
        assert branched[f"branch{i}.flops_spent"] == f * tokens
        assert branched[f"branch{i}.cost_flops"] == f * (steps - warmdown_start(recipe, steps)) * BATCH
        warmdown_tokens += (steps - warmdown_start(recipe, steps)) * BATCH
    assert branched["tokens"] == tokens_for_budget(config, 1e11, BATCH)
    assert branched["flops_spent"] == f * (branched["tokens"] + warmdown_tokens)  # the branches' cost counted
    assert branched["status"] == "ok"


@pytest.fixture(scope="module")
def outright(cache_dir):
    return train(trial(cache_dir, 2, 2, BRANCHES[1], WSD))


def test_a_branch_is_the_run_trained_for_its_tokens_outright(branched, outright):
    assert outright["tokens"] == branched["branch1.tokens"]
    assert branched["branch1.val_loss"] == pytest.approx(outright["val_loss"], abs=1e-4)
    # and the main run, restored after each branch, ends lower than its branches
    assert branched["val_loss"] < branched["branch1.val_loss"] < branched["branch0.val_loss"]


def test_each_branch_is_a_row_of_the_runs_table(branched):
    row = {"run_id": "t1", "stage": "search", **{k: v for k, v in branched.items() if k != "reason"}}
    runs = validate_runs(pd.DataFrame([row]))
    assert list(runs["run_id"]) == ["t1", "t1/branch0", "t1/branch1"]
    assert list(runs["branch_of"]) == ["", "t1", "t1"]
    assert list(runs["budget_flops"]) == [1e11, *BRANCHES]
    assert list(runs["tokens"]) == [branched["tokens"], branched["branch0.tokens"], branched["branch1.tokens"]]
    assert (runs["status"] == "ok").all() and runs["N_once"].nunique() == 1
    assert not any(c.startswith("branch0.") for c in runs.columns)
    # what the analysis says was spent is the trial's own figure (its branches' warmdowns included), once
    assert flops_spent(runs)["total"] == branched["flops_spent"]


def test_a_branch_repeating_a_trained_run_enters_the_fit_once(branched, outright):
    rows = [{"run_id": run_id, "stage": "search", **{k: v for k, v in m.items() if k != "reason"}}
            for run_id, m in (("t1", branched), ("t1b", branched), ("t2", outright))]
    runs = validate_runs(pd.DataFrame(rows))
    status = dict(zip(runs["run_id"], runs["status"]))
    # t2 was trained for branch1's tokens: that branch of t1 and of its twin t1b repeat it; t1b's branch0
    # repeats t1's; t1b itself is a trial, never marked (two trials are two measurements)
    assert status == {"t1": "ok", "t1b": "ok", "t2": "ok", "t1/branch0": "ok", "t1/branch1": "repeat",
                      "t1b/branch0": "repeat", "t1b/branch1": "repeat"}
    assert runs.loc[runs["status"] == "repeat", "reason"].str.contains("repeating a run").all()


def test_branches_need_the_wsd_schedule():
    with pytest.raises(ValueError, match="needs schedule"):
        validate_recipe({"branch_budgets": [1e11]})
    with pytest.raises(ValueError, match="list of positive"):
        validate_recipe({"schedule": "wsd", "branch_budgets": [-1]})


def test_a_simulated_trial_records_the_branches_its_config_asks_for_at_the_accountings_figures():
    """The law sampler's per-trial branches (trial key ``branch_budgets``) in a simulated trial: the same steps,
    tokens, FLOPs and warmdown cost as a training trial records, the point's own cell's offset and curve, and
    the independent noise of the run it branched from."""
    config = TrialConfig(budget_flops=1e19, s=16.0, r=2, template={"depth": 20, "prelude": 2, "coda": 2,
                         "width_unit": 64, "head_dim": 128, "vocab_size": 32064}, batch_tokens=262144, seed=3,
                         objective="simulate")
    budgets = (2.15e18, 4.64e18)
    branched = simulate(dataclasses.replace(config, branch_budgets=budgets))
    model = config.model_config
    f = flops_per_token(model)
    cost = 0
    for i, budget in enumerate(budgets):
        steps = tokens_for_budget(model, budget, 262144) // 262144
        fork = warmdown_start(normalize_recipe(None), steps)
        assert branched[f"branch{i}.tokens"] == steps * 262144
        assert branched[f"branch{i}.flops_spent"] == f * steps * 262144
        assert branched[f"branch{i}.cost_flops"] == f * (steps - fork) * 262144
        cost += (steps - fork) * 262144
        outright = simulate(dataclasses.replace(config, budget_flops=budget))
        assert outright["tokens"] == branched[f"branch{i}.tokens"]
        # same point, same cell deviation; only the run's own noise differs (the branch shares its trial's)
        quiet = dataclasses.replace(config, noise=0.0)
        assert simulate(dataclasses.replace(quiet, branch_budgets=budgets))[f"branch{i}.val_loss"] == pytest.approx(
            simulate(dataclasses.replace(quiet, budget_flops=budget))["val_loss"], rel=1e-12)
        assert branched[f"branch{i}.val_loss"] != outright["val_loss"]
    plain = simulate(config)
    assert branched["val_loss"] == plain["val_loss"]  # branching does not change the trial's own point
    assert branched["flops_spent"] == plain["flops_spent"] + f * cost
    both = dataclasses.replace(trial("", 2, 2, 1e11, {**WSD, "branch_budgets": [6e10]}), branch_budgets=(3e10, 6e10))
    assert branch_budgets(both) == [3e10, 6e10]
