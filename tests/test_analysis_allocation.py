"""Allocation tables: the paper's worked example, the budget -> allocation -> FLOPs round trip, the trends."""

from __future__ import annotations

import numpy as np
import pytest

from loopscale.analysis import PAPER_TEMPLATE, SizeCurve, allocation_table, fit_joint_law
from loopscale.model import PAPER_LAW, LoopedConfig, count_params, flops_per_token, tokens_for_budget
from test_analysis_sim import paper_runs

BUDGETS = [4.64e17, 1e18, 1e19, 1e20]


@pytest.mark.parametrize("r", [1, 2, 4, 8])
def test_size_curve_is_the_model_at_every_buildable_width(r):
    curve = SizeCurve.from_model(r)
    for width in (128, 640, 1280, 2048, 4096):
        config = LoopedConfig.iso_depth(width / 64, r, **PAPER_TEMPLATE)
        p = count_params(config)
        sizes = curve.sizes(width)
        assert (sizes["N_once"], sizes["N_rec"], sizes["N_embed"], sizes["F"]) == (
            p.N_once, p.N_rec, p.N_embed, flops_per_token(config))
        assert curve.width_where("N", p.N) == pytest.approx(width, rel=1e-12)
        assert curve.width_where("F", flops_per_token(config)) == pytest.approx(width, rel=1e-12)


def test_paper_worked_example():
    """r = 4: ~410M unique parameters perform like a ~580M non-looped model at the training cost of a ~1B one."""
    table = allocation_table(PAPER_LAW, np.geomspace(1e19, 1e21, 41), [4])
    row = table.iloc[(table["N"] - 410e6).abs().argmin()]
    assert row["N"] == pytest.approx(410e6, rel=0.03)
    # 580M is the paper's rounding of (4 + 4^0.46 * 4) / 20 x 1B, which leaves out the injection's 2 d^2.
    assert row["N_eff"] == pytest.approx(580e6, rel=0.05)
    assert row["N_eff"] / row["N"] == pytest.approx(1.45, abs=0.03)
    assert row["same_cost_r1_N"] == pytest.approx(1.0e9, rel=0.05)
    # The non-looped model of N = N_eff matches the loss on the same tokens for ~60% of the compute.
    assert row["equiv_r1_flops"] / row["budget_flops"] == pytest.approx(0.61, abs=0.05)


def test_budget_allocation_flops_round_trip():
    table = allocation_table(PAPER_LAW, BUDGETS, [1, 2, 4, 8])
    for row in table.itertuples():
        # continuous optimum: F(width) x D = C exactly
        assert row.flops_per_token * row.tokens == pytest.approx(row.budget_flops, rel=1e-12)
        # the buildable model, from the model's own accounting, spends the budget to within one step
        config = LoopedConfig.iso_depth(row.s_built, row.r, **PAPER_TEMPLATE)
        assert config.width == row.width_built and config.width % 128 == 0
        assert tokens_for_budget(config, row.budget_flops, 262_144) == row.tokens_built
        spent = flops_per_token(config) * row.tokens_built
        assert spent == row.flops_built
        assert row.budget_flops - flops_per_token(config) * 262_144 < spent <= row.budget_flops
        assert abs(row.width_built - row.width) <= 128


def test_the_optimum_is_a_minimum_over_width():
    table = allocation_table(PAPER_LAW, [1e19], [4])
    row = table.iloc[0]
    curve = SizeCurve.from_model(4)
    for factor in (0.9, 0.99, 1.01, 1.1):
        sizes = curve.sizes(row["width"] * factor)
        loss = PAPER_LAW.loss(sizes["N_once"], sizes["N_rec"], 4, 1e19 / sizes["F"])
        assert loss > row["loss"]


def test_looped_models_are_wider_train_on_fewer_tokens_and_trail_r1():
    table = allocation_table(PAPER_LAW, BUDGETS, [1, 2, 4, 8])
    for _, rows in table.groupby("budget_flops"):
        rows = rows.sort_values("r")
        assert rows["width"].is_monotonic_increasing
        assert rows["tokens"].is_monotonic_decreasing
        assert rows["tokens_per_flop_param"].is_monotonic_decreasing
        assert rows["loss_gap_to_r1"].iloc[0] == 0 and rows["loss_gap_to_r1"].is_monotonic_increasing
        assert (rows["N_eff"] >= rows["N"]).all()
    # the paper (docs/paper.md): gaps at matched compute over its budgets, r=2 0.03-0.06, r=4 0.05-0.08, r=8 0.09-0.12
    gap = table[table["budget_flops"] == 1e18].set_index("r")["loss_gap_to_r1"]
    assert 0.03 <= gap[2] <= 0.06 and 0.05 <= gap[4] <= 0.09 and 0.08 <= gap[8] <= 0.12


def test_r1_compute_to_match_inverts_the_r1_curve():
    table = allocation_table(PAPER_LAW, [1e19], [1, 4])
    r1, r4 = table.iloc[0], table.iloc[1]
    assert r1["r1_optimal_flops_to_match"] == pytest.approx(1e19, rel=1e-6)
    matched = allocation_table(PAPER_LAW, [r4["r1_optimal_flops_to_match"]], [1]).iloc[0]
    assert matched["loss"] == pytest.approx(r4["loss"], abs=1e-9)
    assert r4["r1_optimal_flops_to_match"] < 1e19


def test_a_fitted_law_can_be_tabulated():
    fit = fit_joint_law(paper_runs(), n_starts=40, n_bootstrap=0)
    ours = allocation_table(fit, [1e19], [4]).iloc[0]
    published = allocation_table(PAPER_LAW, [1e19], [4]).iloc[0]
    assert ours["width"] == pytest.approx(published["width"], rel=1e-3)


@pytest.mark.parametrize("budgets, recurrences, message", [
    ([], [1], "at least one budget"),
    ([-1.0], [1], "positive FLOP"),
    ([1e18], [3], "does not divide"),
])
def test_bad_requests_are_value_errors(budgets, recurrences, message):
    with pytest.raises(ValueError, match=message):
        allocation_table(PAPER_LAW, budgets, recurrences)


def test_another_template():
    cpu = dict(depth=8, prelude=2, coda=2, width_unit=16, head_dim=16, seq_len=128, vocab_size=256)
    table = allocation_table(PAPER_LAW, [1e13], [1, 2, 4], template=cpu, batch_tokens=4096)
    assert (table["width_built"] % 16 == 0).all()
    for row in table.itertuples():
        config = LoopedConfig.iso_depth(row.s_built, row.r, **cpu)
        assert flops_per_token(config) * row.tokens_built == row.flops_built <= 1e13
