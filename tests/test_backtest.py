"""The extrapolation backtest of ``loopscale analyze`` on the simulated paper replay: refit without the largest
budget and predict it."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from loopscale.analysis import FitOptions
from loopscale.analysis.allocation import allocation_table
from loopscale.analysis.backtest import backtest
from loopscale.analysis.isoflop import cell_optima
from test_analysis_sim import BATCH, TEMPLATE, paper_runs

NOISE = 0.01
OPTIONS = FitOptions(n_starts=60, n_bootstrap=0)


def run_backtest(runs):
    return backtest(runs, cell_optima(runs, n_bootstrap=100), options=OPTIONS,
                    allocate=partial(allocation_table, template=TEMPLATE, batch_tokens=BATCH))


def test_noise_free_replay_is_predicted_exactly():
    result = run_backtest(paper_runs())
    assert result.held_out == 2.15e19 and result.n_held_out == 16 and result.fit.n_runs == 100
    assert result.runs_rmse < 1e-5
    # the parabola's vertex through 4 widths is itself only an estimate of the optimum (as the paper notes)
    compared = result.cells.dropna(subset=["loss_error"])
    assert len(compared) >= 2 and (compared["loss_error"].abs() < 2e-3).all()
    assert ((compared["width_ratio"] > 0.8) & (compared["width_ratio"] < 1.25)).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_noisy_replay_predicts_the_held_out_budget_within_the_noise(seed):
    result = run_backtest(paper_runs(noise=NOISE, seed=seed))
    assert result.runs_rmse < 1.5 * NOISE
    compared = result.cells.dropna(subset=["loss_error"])
    assert len(compared) >= 2
    assert (compared["loss_error"].abs() < 2.5 * NOISE).all()
    assert "backtest: refit without C=2.15e+19" in result.text()


def test_backtest_needs_three_budgets():
    runs = paper_runs()
    assert run_backtest(runs[runs["budget_flops"] < 2e18]) is None
    two_left = runs[runs["budget_flops"] < 4e18]
    assert np.unique(two_left["budget_flops"]).size == 3 and run_backtest(two_left) is not None


def test_a_sweep_of_one_run_per_cell_is_analysed_without_a_backtest_and_says_why(tmp_path):
    """Nine runs (3 budgets x r in {1, 2, 4}, one each) fit the six-parameter law; the six below the largest
    budget cannot: the analysis goes on without a backtest and says why (it used to stop there with an error)."""
    import json
    import subprocess
    import sys

    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for budget in (1e11, 3e11, 1e12):
        for r in (1, 2, 4):
            n_once = n_rec = 1e5
            tokens = budget / (6 * (n_once + r * n_rec))
            loss = 1.8 + 400 * (n_once + r ** 0.46 * n_rec) ** -0.35 + 400 * tokens ** -0.3 + rng.normal(0, 0.005)
            rows.append({"r": r, "budget_flops": budget, "N_once": n_once, "N_rec": n_rec, "tokens": tokens,
                         "val_loss": loss})
    table = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "analyze", "--experiment", str(table),
                           "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "backtest: none (6 runs cannot determine 6 free parameters below the largest budget)" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backtest"] is None and "cannot determine" in summary["backtest_skipped"]
