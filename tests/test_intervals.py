"""Intervals on allocations (analysis/intervals.py): from a fit's bootstrap draws, and from the published law's
phi interval alone; checked against allocation tables computed law by law, and through ``loopscale export``."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pandas as pd
import pytest

from loopscale.analysis import allocation_table, fit_joint_law
from loopscale.analysis.cli import main
from loopscale.analysis.intervals import WITH_INTERVAL, spread_of, with_intervals
from loopscale.model import PAPER_LAW, PAPER_PHI_CI, JointLaw
from test_analysis_sim import paper_runs

BUDGETS, RECURRENCES = [1e19, 1e20], [1, 4]


@pytest.fixture(scope="module")
def fit():
    return fit_joint_law(paper_runs(noise=0.01), n_starts=60, n_bootstrap=24)


def test_intervals_are_the_percentiles_of_the_allocation_under_each_draw(fit):
    spread, note = spread_of(fit)
    assert "24 block-bootstrap draws" in note
    table = with_intervals(allocation_table(fit, BUDGETS, RECURRENCES), spread)
    # each draw's own allocation table, one law at a time (the scalar optimiser, not the batched one)
    per_draw = [allocation_table(JointLaw(**row), BUDGETS, RECURRENCES) for row in fit.draws().to_dict("records")]
    tail = 100 * (1 - fit.confidence) / 2
    for column in WITH_INTERVAL:
        values = np.stack([t[column].to_numpy(float) for t in per_draw])
        lo, hi = np.percentile(values, [tail, 100 - tail], axis=0)
        assert table[f"{column}_lo"].to_numpy() == pytest.approx(lo, rel=1e-6), column
        assert table[f"{column}_hi"].to_numpy() == pytest.approx(hi, rel=1e-6), column


def test_the_published_law_carries_phi_s_interval_only():
    spread, note = spread_of(PAPER_LAW)
    assert "no interval but phi's" in note
    table = with_intervals(allocation_table(PAPER_LAW, BUDGETS, RECURRENCES), spread)
    ends = [allocation_table(dataclasses.replace(PAPER_LAW, phi=phi), BUDGETS, RECURRENCES) for phi in PAPER_PHI_CI]
    for column in ("N", "tokens", "loss"):
        values = np.stack([table[column].to_numpy(), *(t[column].to_numpy() for t in ends)])
        assert table[f"{column}_lo"].to_numpy() == pytest.approx(values.min(axis=0), rel=1e-6)
        assert table[f"{column}_hi"].to_numpy() == pytest.approx(values.max(axis=0), rel=1e-6)
    r1, r4 = table[table["r"] == 1], table[table["r"] == 4]
    assert (r1["loss_lo"] == r1["loss_hi"]).all()  # phi plays no part at r = 1
    assert (r4["loss_hi"] - r4["loss_lo"] > 1e-3).all()


def test_no_draws_no_interval():
    fit = fit_joint_law(paper_runs(), n_starts=20, n_bootstrap=0)
    spread, note = spread_of(fit)
    assert spread is None and "no bootstrap" in note
    table = with_intervals(allocation_table(fit, [1e19], [4]), spread)
    assert table[[f"{c}_lo" for c in WITH_INTERVAL]].isna().all().all()


@pytest.mark.parametrize("fmt", ["csv", "md"])
def test_export_carries_intervals_that_bracket_its_estimates(tmp_path, capsys, fmt):
    path = tmp_path / "sweep.csv"
    paper_runs(noise=0.01).to_csv(path, index=False)
    out = tmp_path / f"alloc.{fmt}"
    assert main(["export", "--experiment", str(path), "--budgets", "1e19,1e20", "--r", "1,4", "--format", fmt,
                 "--out", str(out), "--n-starts", "60", "--n-bootstrap", "40"]) == 0
    err = capsys.readouterr().err
    assert "intervals: 95% intervals from the fit's 40 block-bootstrap draws" in err
    if fmt == "md":
        header = out.read_text().splitlines()[0]
        assert "N lo-hi" in header and "D lo-hi" in header and "loss lo-hi" in header
        return
    table = pd.read_csv(out)
    for value, lo, hi in (("N (params)", "N lo", "N hi"), ("D (tokens)", "D lo", "D hi"),
                          ("loss (nats)", "loss lo", "loss hi")):
        assert (table[lo] <= table[value]).all() and (table[value] <= table[hi]).all(), value
    assert (table["loss hi"] - table["loss lo"] > 0).all()


def test_export_of_the_published_law_says_its_interval_is_phi_s(capsys):
    assert main(["export", "--law", "paper", "--budgets", "1e19", "--r", "1,4", "--full"]) == 0
    captured = capsys.readouterr()
    assert "no interval but phi's (95% CI 0.41 to 0.53)" in captured.err
    table = pd.read_csv(io.StringIO(captured.out))
    assert {"loss_lo", "loss_hi", "N_built_lo", "tokens_built_hi"} <= set(table.columns)
    assert all(len(line) <= 120 for line in captured.err.splitlines())
