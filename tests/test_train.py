"""The real training trial on CPU (tiny shapes, small budgets, the embedded KJV bytes) and its recipe."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from loopscale.model import LoopedConfig, LoopedLM, flops_per_token
from loopscale.objectives import (METRIC_KEYS, RECIPE_DEFAULTS, TrialConfig, device_peak_flops, simulate, train,
                                  validate_recipe)
from loopscale.objectives.peak import peak_description
from loopscale.objectives import lr_rules
from loopscale.objectives.optimizers import build_optimizers
from loopscale.objectives.recipe import group_lrs, lr_multiplier, normalize_recipe, trial_lrs
from loopscale.objectives.training import trial_data

T = 128
BATCH = 4096
TEMPLATE = dict(depth=8, prelude=2, coda=2, width_unit=16, head_dim=16, seq_len=T, vocab_size=256)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("train-cache"))


def trial(cache_dir, s, r, budget, recipe=None, **extra):
    """Rates quoted at this batch (ref_batch): the paper's 262,144-token anchor is 64x away."""
    return TrialConfig(budget_flops=float(budget), s=float(s), r=r, template=TEMPLATE, batch_tokens=BATCH, seed=0,
                       data={"source": "kjv"}, cache_dir=cache_dir, val_tokens=8192, num_threads=1,
                       recipe={"ref_batch": BATCH, **(recipe or {})}, **extra)


@pytest.fixture(scope="module")
def small(cache_dir):
    """d = 32, r = 2 at 2e11 FLOPs (~46 steps of 4k tokens), with the progress reports it made."""
    reports = []
    return train(trial(cache_dir, 2, 2, 2e11), report=reports.append), reports


def test_trial_finishes_within_one_step_of_its_budget_and_beats_unigram(small, cache_dir):
    metrics, reports = small
    config = trial(cache_dir, 2, 2, 2e11)
    packed = trial_data(config, config.model_config).packed
    assert set(metrics) == set(METRIC_KEYS) == set(simulate(trial(cache_dir, 2, 2, 2e11)))
    assert metrics["status"] == "ok" and metrics["reason"] == ""
    step_flops = metrics["flops_per_token"] * BATCH
    assert 0 <= metrics["budget_flops"] - metrics["flops_spent"] < step_flops
    assert metrics["flops_spent"] == metrics["flops_per_token"] * metrics["tokens"] == step_flops * metrics["steps"]
    unigram = packed.meta["unigram_entropy"]  # ~3.0 nats per byte for the KJV
    assert metrics["val_loss"] < unigram - 0.5, (metrics["val_loss"], unigram)
    assert metrics["val_bpb"] == pytest.approx(metrics["val_loss"] / math.log(2))
    assert 0 < metrics["mfu"] < 1 and metrics["tokens_per_s"] > 0 and metrics["wall_s"] > 0
    assert metrics["lr"] == trial_lrs(config)["matrices"]
    # progress: every log_every steps and at the end, counting steps and tokens
    assert [r["step"] for r in reports] == [1] + list(range(10, metrics["steps"], 10)) + [metrics["steps"]]
    assert all(r["tokens"] == r["step"] * BATCH and math.isfinite(r["train_loss"]) for r in reports)
    assert reports[-1]["train_loss"] < reports[0]["train_loss"] - 1.0


@pytest.mark.slow
def test_larger_budget_at_the_same_width_lowers_the_loss(small, cache_dir):
    bigger = train(trial(cache_dir, 2, 2, 6e11))
    assert bigger["steps"] >= 3 * small[0]["steps"] - 1
    assert bigger["val_loss"] < small[0]["val_loss"] - 0.1, (bigger["val_loss"], small[0]["val_loss"])


def test_larger_width_at_a_small_budget_is_undertrained(small, cache_dir):
    """At 2e11 FLOPs the d = 32 model is near its compute-optimal size; d = 128 (16x the parameters) gets
    under a third of the tokens and ends clearly worse: it sits far right of the IsoFLOP minimum."""
    wide = train(trial(cache_dir, 8, 2, 2e11))
    assert wide["N"] > 10 * small[0]["N"] and wide["tokens"] < small[0]["tokens"] / 3
    assert wide["val_loss"] > small[0]["val_loss"] + 0.1, (wide["val_loss"], small[0]["val_loss"])


def test_absurd_learning_rate_diverges_without_raising(cache_dir):
    recipe = {"lr": 1e3, "embedding_lr": 1e4, "head_lr": 1e4, "norm_lr": 1e4, "log_every": 2}
    metrics = train(trial(cache_dir, 2, 2, 2e11, recipe=recipe))
    assert set(metrics) == set(METRIC_KEYS)
    assert metrics["status"] == "diverged" and metrics["reason"]
    assert math.isnan(metrics["val_loss"]) and metrics["steps"] < 20


def test_gradient_accumulation_matches_the_whole_batch(cache_dir):
    """Micro-batches of 1k tokens give the same training as whole 4k batches (up to float rounding)."""
    whole = train(trial(cache_dir, 2, 2, 3e10, recipe={"optimizer": "adamw"}))
    accumulated = train(trial(cache_dir, 2, 2, 3e10, recipe={"optimizer": "adamw", "micro_batch": 1024}))
    assert whole["steps"] == accumulated["steps"] >= 5
    assert accumulated["val_loss"] == pytest.approx(whole["val_loss"], abs=2e-3)


def test_budget_too_small_and_bad_batch_cannot_make_a_trial(cache_dir):
    """A trial whose budget buys no step, or whose batch is not whole rows, is refused in one line where it is
    built (or changed), so training never meets one; the micro-batch depends on the workers sharing each step
    and is checked by training, before any work."""
    with pytest.raises(ValueError, match=r"^trial config: budget 1e\+06 FLOPs buys no optimizer step of 4096 tokens "
                                         r"at width 32 \(s=2, r=2\)$"):
        trial(cache_dir, 2, 2, 1e6)
    with pytest.raises(ValueError, match="^trial config: batch_tokens 4000 is not a multiple of seq_len 128$"):
        dataclasses.replace(trial(cache_dir, 2, 2, 2e11), batch_tokens=4000)
    with pytest.raises(ValueError, match="micro_batch 1000 must be a multiple"):
        train(trial(cache_dir, 2, 2, 2e11, recipe={"micro_batch": 1000}))


def test_schedules():
    paper = normalize_recipe({})
    assert paper["warmup_frac"] == 0.0
    assert lr_multiplier(paper, 0, 100) == 1.0 and lr_multiplier(paper, 99, 100) == pytest.approx(0.1)
    assert lr_multiplier(paper, 50, 101) == pytest.approx(0.55)
    cosine = normalize_recipe({"schedule": "cosine", "warmup_frac": 0.1})
    values = [lr_multiplier(cosine, s, 100) for s in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == 1.0
    assert values[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(values[9:], values[10:]))


def test_transfer_rules():
    """the paper's three rules, each checked on its own: batch on every group, data on the matrices, width on
    the AdamW groups; at the reference point every group runs at its base rate."""
    ref = LoopedConfig.iso_depth(10, 1, **TEMPLATE)  # the template's s = 10 model: width 160
    d_ref = lr_rules.reference_tokens(TEMPLATE, 1)
    recipe = normalize_recipe({"optimizer": "muonh", "ref_batch": BATCH, "ref_width": 160})
    base = group_lrs(recipe, TEMPLATE, ref, round(d_ref), BATCH)
    assert base == pytest.approx({"matrices": 0.014, "embedding": 0.3, "lm_head": 0.004, "norms": 0.005,
                                  "lanes": 0.01})
    batch = group_lrs(recipe, TEMPLATE, ref, round(d_ref), 4 * BATCH)  # x 4^0.558 on every group
    assert batch == pytest.approx({k: v * 4 ** 0.558 for k, v in base.items()})
    data = group_lrs(recipe, TEMPLATE, ref, round(8 * d_ref), BATCH)  # x 8^-0.32 on the matrices only
    assert data == pytest.approx({**base, "matrices": 0.014 * 8 ** -0.32})
    wide = LoopedConfig.iso_depth(40, 1, **TEMPLATE)  # x 4^-0.5 on the AdamW groups only
    width = group_lrs(recipe, TEMPLATE, wide, round(d_ref), BATCH)
    assert width == pytest.approx({k: v * (0.5 if k != "matrices" else 1) for k, v in base.items()})
    adamw = normalize_recipe({"optimizer": "adamw", "base_lr": 0.004, "ref_batch": BATCH, "ref_width": 160})
    assert group_lrs(adamw, TEMPLATE, wide, round(8 * d_ref), BATCH)["matrices"] == pytest.approx(0.002)
    given = normalize_recipe({"lr": 0.01})
    assert group_lrs(given, TEMPLATE, wide, 10**6, 64 * BATCH)["matrices"] == 0.01  # given, not derived


def test_reference_models_follow_the_template():
    """D_ref = 10 x (N_once + r_ref N_rec) of the template's s = 10 model: the plain stack for r = 1, the
    looped model at r = 4 for r > 1 (the paper's 2 + 4x4 + 2), whatever the trial's own r."""
    paper = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, vocab_size=32064)
    assert lr_rules.reference_tokens(paper, 1) == 10 * 20 * (12 * 640**2 + 2 * 640) + 10 * 2 * 640
    looped = lr_rules.reference_config(paper, 8)
    assert (looped.n_prelude, looped.n_recur, looped.n_coda, looped.r, looped.injection) == (2, 4, 2, 4, "linear")
    assert lr_rules.reference_tokens(paper, 2) == lr_rules.reference_tokens(paper, 8) == 1_016_102_400
    odd = dict(paper, depth=9, prelude=2, coda=1)  # shared depth 6: 4 does not divide it, 3 does
    assert lr_rules.reference_config(odd, 2).r == 3


def test_optimizer_groups():
    model = LoopedLM(LoopedConfig.iso_depth(2, 2, injection="hyperconnect", **TEMPLATE))
    for name, kinds in (("muonh", {"AdamW", "MuonH"}), ("adamw", {"AdamW"}),
                        ("muon", {"AdamW", "Muon"} if hasattr(torch.optim, "Muon") else None)):
        if kinds is None:
            continue
        recipe = normalize_recipe({"optimizer": name})
        lrs = group_lrs(recipe, TEMPLATE, model.config, 10**6, BATCH)
        optimizers = build_optimizers(model, lrs, recipe)
        assert {type(o).__name__ for o in optimizers} == kinds
        covered = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        assert len(covered) == len({id(p) for p in covered}) == len(list(model.parameters()))
        lane_group = next(g for g in optimizers[0].param_groups if g["params"][0] is model.inject.alpha)
        assert lane_group["lr"] == lrs["lanes"]


@pytest.mark.parametrize("recipe, message", [
    ({"lr": -1.0}, "recipe.lr must be > 0"),
    ({"learning_rate": 0.1}, "unknown key 'learning_rate'"),
    ({"shedule": "paper"}, "did you mean 'schedule'?"),
    ({"schedule": "cosin"}, "did you mean 'cosine'?"),
    ({"optimizer": "sgd"}, "choose one of muonh, muon, adamw"),
    ({"betas": [0.9]}, "recipe.betas must be two numbers"),
    ({"micro_batch": 1.5}, "recipe.micro_batch must be an integer"),
    ({"diverge_factor": 1.0}, "recipe.diverge_factor must be > 1"),
    ({"final_lr_frac": 2}, "recipe.final_lr_frac must be in [0, 1]"),
    ({"bf16": "yes"}, "recipe.bf16 must be true or false"),
    ([], "recipe must be a table"),
])
def test_bad_recipes_fail_with_one_clear_line(recipe, message):
    with pytest.raises(ValueError) as err:
        validate_recipe(recipe)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert RECIPE_DEFAULTS["betas"] == (0.8, 0.95)


def test_cpu_peak_is_measured_once():
    cpu = torch.device("cpu")
    peak = device_peak_flops(cpu)
    assert 1e9 < peak < 1e13 and "measured fp32 matmul" in peak_description(cpu)
    assert device_peak_flops(cpu) == peak  # measured once per process and thread count


def test_flops_per_token_is_the_model_s_own(small):
    config = LoopedConfig.iso_depth(2, 2, **TEMPLATE)
    assert small[0]["flops_per_token"] == flops_per_token(config)


def test_paper_grid_matrix_rates_span_papers_range():
    """The paper: under iso-FLOPs the data rule gives MuonH matrix rates of 0.0072-0.020 across the grid."""
    grid = {4.64e17: (6, 8, 10, 12), 1e18: (6, 8, 10, 12, 14), 2.15e18: (8, 10, 12, 14, 16),
            4.64e18: (10, 12, 14, 16, 18, 20), 1e19: (12, 16, 18, 20, 24), 2.15e19: (18, 24, 28, 34)}
    template = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, vocab_size=32064, seq_len=2048,
                    injection="linear")
    rates = [trial_lrs(TrialConfig(budget_flops=c, s=float(s), r=r, template=template, batch_tokens=262_144,
                                   recipe={"optimizer": "muonh"}))["matrices"]
             for c, widths in grid.items() for s in widths for r in (1, 2, 4, 8)]
    assert round(min(rates), 4) == 0.0072 and round(max(rates), 3) == 0.020
