"""Allocation under constraints (analysis/constrained.py): the chosen r and width against a brute-force search of
the same law over every buildable width and r, the ``best`` column, the cap below which looping wins, and bad caps
refused in one line before any work."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.analysis.cli import main
from loopscale.analysis.constrained import allocation_under, loop_wins_below
from loopscale.analysis.constraints import Constraints
from loopscale.analysis.intervals import spread_of
from loopscale.analysis.sizes import SizeCurve
from loopscale.model import DTYPE_BYTES, PAPER_LAW, LoopedConfig, account, inference, tokens_for_budget

BATCH = 262_144
RECURRENCES = [1, 2, 4, 8]
BUDGETS = [1e19, 1e20]
# A small template: its budgets buy a step at every buildable width up to a few hundred heads.
SMALL = dict(depth=10, prelude=1, coda=1, width_unit=16, head_dim=16, seq_len=256, vocab_size=512)
SMALL_BATCH = 4096
SMALL_BUDGETS = [1e15, 1e16]


def brute_force(law, budgets, recurrences, constraints, template, batch_tokens):
    """Every buildable width of every r, counted one model at a time (``model.account``, ``model.inference``,
    ``model.tokens_for_budget``), those that fit and train a step: per budget, the lowest loss per r and over r."""
    defaults = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, seq_len=2048)
    shape = {**defaults, **(template or {})}
    size = DTYPE_BYTES[constraints.dtype]
    context = constraints.context or shape["seq_len"]
    found = {}
    for budget in budgets:
        for r in recurrences:
            heads, best = 1, None
            while True:
                config = LoopedConfig.iso_depth(heads * shape["head_dim"] / shape["width_unit"], r,
                                                **(template or {}))
                tokens = tokens_for_budget(config, budget, batch_tokens)
                if tokens == 0:
                    break  # wider models buy no step either
                counts = account(config)
                memory = inference(config, context).memory_bytes(constraints.batch, size)
                if ((constraints.max_params is None or counts.N <= constraints.max_params)
                        and (constraints.max_memory is None or memory <= constraints.max_memory)):
                    loss = law.loss(counts.N_once, counts.N_rec, r, tokens)
                    if best is None or loss < best[0]:
                        best = (loss, config.width)
                heads += 1
            found[budget, r] = best
    return found


CASES = [
    (None, {}, BUDGETS, BATCH),
    (None, {"max_params": 1e8}, BUDGETS, BATCH),
    (None, {"max_params": 4e8}, BUDGETS, BATCH),
    (None, {"max_memory": 6e8}, BUDGETS, BATCH),
    (None, {"max_memory": 2e9, "context": 8192, "batch": 4}, BUDGETS, BATCH),
    (SMALL, {"max_params": 3e5}, SMALL_BUDGETS, SMALL_BATCH),
    (SMALL, {"max_params": 2e6, "max_memory": 2e7, "dtype": "float32"}, SMALL_BUDGETS, SMALL_BATCH),
]


@pytest.mark.parametrize("template,caps,budgets,batch_tokens", CASES)
def test_the_choice_is_a_brute_force_search_over_every_buildable_width_and_r(template, caps, budgets,
                                                                              batch_tokens):
    constraints = Constraints(**caps)
    table = allocation_under(PAPER_LAW, budgets, RECURRENCES, constraints, None, template=template,
                             batch_tokens=batch_tokens)
    expected = brute_force(PAPER_LAW, budgets, RECURRENCES, constraints, template, batch_tokens)
    for _, row in table.iterrows():
        loss, width = expected[row["budget_flops"], row["r"]]
        assert row["width_built"] == width, (row["budget_flops"], row["r"])
        assert row["loss_built"] == pytest.approx(loss, rel=1e-12)
    for budget in budgets:
        rows = table[table["budget_flops"] == budget]
        assert rows["best"].sum() == 1
        chosen = rows[rows["best"]].iloc[0]
        r_best = min(RECURRENCES, key=lambda r: expected[budget, r][0])
        assert (chosen["r"], chosen["width_built"]) == (r_best, expected[budget, r_best][1])


def test_a_cap_binds_only_below_the_compute_optimal_model():
    free = allocation_under(PAPER_LAW, BUDGETS, RECURRENCES, Constraints(), None)
    capped = allocation_under(PAPER_LAW, BUDGETS, RECURRENCES, Constraints(max_params=1e8), None)
    assert not free["capped"].any() and capped["capped"].all()
    assert (capped["N_built"] <= 1e8).all() and (capped["loss_built"] > free["loss_built"]).all()
    loose = allocation_under(PAPER_LAW, BUDGETS, RECURRENCES, Constraints(max_params=1e12), None)
    pd.testing.assert_frame_equal(loose.drop(columns="capped"), free.drop(columns="capped"))


def test_looping_wins_below_its_cap_and_loses_above_it():
    """Under the continuous law: just below the cap r's model beats r = 1's, just above it r = 1's is better."""
    budget, base = 1e21, SizeCurve.from_model(1)
    for r in (2, 4, 8):
        curve = SizeCurve.from_model(r)
        cap = loop_wins_below(PAPER_LAW, curve, base, budget)
        assert np.isfinite(cap)

        def loss(c, n):
            from loopscale.analysis.allocation import optimal_width

            sizes = c.sizes(min(optimal_width(PAPER_LAW, c, budget), float(c.width_where("N", n))))
            return PAPER_LAW.loss(sizes["N_once"], sizes["N_rec"], c.r, budget / sizes["F"])

        assert loss(curve, 0.99 * cap) < loss(base, 0.99 * cap)
        assert loss(curve, 1.01 * cap) > loss(base, 1.01 * cap)


def test_the_cap_grows_with_budget_and_shrinks_with_r_and_carries_phi_s_interval():
    spread, _ = spread_of(PAPER_LAW)
    table = allocation_under(PAPER_LAW, [1e20, 1e21], RECURRENCES, Constraints(), spread)
    looped = table[table["r"] > 1]
    assert table.loc[table["r"] == 1, "loop_wins_below_N"].isna().all()
    for budget in (1e20, 1e21):
        caps = looped.loc[looped["budget_flops"] == budget, "loop_wins_below_N"].to_numpy()
        assert (np.diff(caps) < 0).all()
    assert (looped.loc[looped["budget_flops"] == 1e21, "loop_wins_below_N"].to_numpy()
            > looped.loc[looped["budget_flops"] == 1e20, "loop_wins_below_N"].to_numpy()).all()
    assert (looped["loop_wins_below_N_lo"] <= looped["loop_wins_below_N"]).all()
    assert (looped["loop_wins_below_N"] <= looped["loop_wins_below_N_hi"]).all()


def test_export_writes_best_and_a_figure(tmp_path, capsys):
    out, plot = tmp_path / "table.csv", tmp_path / "capacity.png"
    assert main(["export", "--law", "paper", "--budgets", "1e20,1e21", "--max-params", "5e8", "--out", str(out),
                 "--plot", str(plot)]) == 0
    table = pd.read_csv(out)
    assert table.groupby("budget (FLOPs)")["best"].sum().tolist() == [1, 1]
    assert (table["N (params)"] <= 5e8).all() and table["capped"].all()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert "N = N_once + N_rec (unique non-embedding parameters) <= 500M" in err
    assert main(["export", "--law", "paper", "--budgets", "1e20", "--out", str(out)]) == 0
    assert pd.read_csv(out)["best"].sum() == 1  # without any constraint too


@pytest.mark.parametrize("argv, message", [
    (["--max-params", "0"], "--max-params must be a positive number, got 0"),
    (["--max-params", "-5000000"], "--max-params must be a positive number, got -5e+06"),
    (["--max-params=-5e6"], "--max-params must be a positive number, got -5e+06"),
    (["--max-memory", "0"], "--max-memory must be a positive number, got 0"),
    (["--max-params", "1e6"], "the constraints are below the smallest buildable model at r=1 (width 128: N 3.94M)"),
    (["--max-memory", "1e7"], "the constraints are below the smallest buildable model at r=1 (width 128: N 3.94M, "),
    (["--dtype", "int3"], "--dtype must be one of float32, bfloat16, float16, float8, got 'int3'"),
    (["--plot", "figure.gif"], "must name a .png, .svg or .pdf file"),
])
@pytest.mark.parametrize("command", ["export", "predict"])
def test_bad_caps_are_one_line_exit_2_before_any_work(tmp_path, capsys, command, argv, message):
    if command == "predict" and argv[0] == "--plot":
        return  # export's flag
    out = tmp_path / "table.csv"
    request = ["--budgets", "1e20", "--out", str(out)] if command == "export" else ["--budget", "1e20", "--r", "1"]
    assert main([command, "--law", "paper", *request, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not any(tmp_path.iterdir())


def test_predict_under_a_cap_says_what_serving_costs(capsys):
    assert main(["predict", "--law", "paper", "--budget", "1e20", "--r", "4", "--max-params", "2e8",
                 "--inference-tokens", "1e12"]) == 0
    out, err = capsys.readouterr()
    table = allocation_under(PAPER_LAW, [1e20], [4], Constraints(max_params=2e8, inference_tokens=1e12), None)
    row = table.iloc[0]
    lines = out.replace("\n  ", " ").splitlines()
    assert lines[2].startswith(f"buildable: width {int(row['width_built'])} ")
    assert lines[3].startswith("capped; to serve: ") and "lifetime " in lines[3]
    assert lines[4].startswith("r=4 beats r=1 under caps on N below ")
    assert "N = N_once + N_rec (unique non-embedding parameters) <= 200M" in err
    assert row["serving_flops"] == 1e12 * inference(SizeCurve.from_model(4).config(int(row["width_built"])),
                                                    2048).forward_flops_per_token
    assert all(len(line) <= 120 for line in (out + err).splitlines())


def test_a_fitted_law_s_draws_give_the_intervals_under_a_cap():
    from test_analysis_sim import paper_runs

    from loopscale.analysis import fit_joint_law

    fit = fit_joint_law(paper_runs(noise=0.01), n_starts=40, n_bootstrap=20)
    spread, _ = spread_of(fit)
    table = allocation_under(fit, [1e20], [1, 4], Constraints(max_params=3e8), spread)
    row = table[table["r"] == 4].iloc[0]
    assert row["N_built"] <= 3e8 and row["N_built_hi"] <= 3e8
    assert row["loss_built_lo"] <= row["loss_built"] <= row["loss_built_hi"]
    assert row["loop_wins_below_N_lo"] <= row["loop_wins_below_N"] <= row["loop_wins_below_N_hi"]
