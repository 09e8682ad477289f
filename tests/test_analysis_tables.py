"""What ``analyze`` and ``export`` hand a person: the buildable allocation table (units, one number format per
column, every column on request), a warning for budgets outside the fitted range, and tables that are never
blank: power_laws says why an r has no law, excluded_runs lists every run the fit left out."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pandas as pd
import pytest

from loopscale.analysis import allocation_table
from loopscale.analysis.allocation import BUILDABLE, buildable, outside_fitted, readable
from loopscale.analysis.cli import main
from loopscale.model import PAPER_LAW, LoopedConfig, count_params
from test_analysis_sim import paper_runs

PAPER = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, seq_len=2048, vocab_size=32064)


def test_the_buildable_table_is_the_model_to_build():
    full = allocation_table(PAPER_LAW, [1e18, 1e19], [1, 4])
    short = buildable(full)
    assert list(short.columns) == list(BUILDABLE.values()) and len(full.columns) >= 23
    for row in short.itertuples(index=False):
        width, heads, n, d = row[2], row[3], row[4], row[5]
        config = LoopedConfig.iso_depth(width / 64, row[1], **PAPER)
        assert config.width == width and heads == width // 128
        assert n == count_params(config).N  # N of the model built, not of the continuous optimum
        assert row[6] == pytest.approx(d / n)
    text = readable(short)
    assert text["budget (FLOPs)"].tolist() == ["1.00e18", "1.00e18", "1.00e19", "1.00e19"]
    assert all(v[-1] in "MB" and len(v.rstrip("MB").replace(".", "")) == 3 for v in text["N (params)"])
    assert all(len(v.split(".")[1]) == 3 for v in text["loss (nats)"])


def test_budgets_outside_the_fitted_range_are_named():
    assert outside_fitted([1e17, 1e18, 4e18, 1e20], [1e18, 2e18, 4e18]) == [1e17, 1e20]


def test_export_is_short_by_default_full_on_request_and_warns_on_extrapolation(tmp_path, capsys):
    path = tmp_path / "sweep.csv"
    paper_runs(noise=0.01).to_csv(path, index=False)
    common = ["export", "--experiment", str(path), "--r", "1,4", "--n-starts", "40"]
    assert main([*common, "--budgets", "1e18,1e20", "--format", "md"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("| budget (FLOPs) | r | width | heads | N (params) | D (tokens) | D/N | loss (nats) |")
    assert "| 1.00e20 | 4 |" in out
    assert "budget(s) 1.00e20 outside the fitted budgets 4.64e17 to 2.15e19 FLOPs" in err
    assert main([*common, "--budgets", "1e18", "--format", "csv", "--full"]) == 0
    out, err = capsys.readouterr()
    full = pd.read_csv(io.StringIO(out))
    assert len(full.columns) >= 23 and {"N_eff", "loss_gap_to_r1", "equiv_r1_flops"} <= set(full.columns)
    assert "outside the fitted" not in err


@pytest.mark.integration
@pytest.mark.slow
def test_a_real_sweep_lists_its_excluded_runs_and_says_why_r_has_no_power_law(tmp_path):
    """The smoke preset for real (Ray, MLflow, one real training trial in the calibration stage): the
    calibration run is left out of the fit, and its 2 budgets are too few for a power law in C."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    for argv in (["search", "smoke"], ["analyze", "--experiment", "smoke", "--n-starts", "40", "--n-bootstrap",
                                        "10", "--no-log", "--out", str(tmp_path / "out")]):
        done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", *argv, "--tracking-uri", uri],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    tables = tmp_path / "out" / "tables"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    excluded = pd.read_csv(tables / "excluded_runs.csv")
    assert len(excluded) == summary["runs_total"] - summary["runs_used"] == 1
    assert excluded.loc[0, "stage"] == "calibrate" and excluded.loc[0, "reason"] == "stage calibrate (not fitted)"
    laws = pd.read_csv(tables / "power_laws.csv")
    assert sorted(laws["r"]) == [1, 2, 4]
    assert laws["note"].str.startswith("no power law: ").all()
    assert "(a fit needs 3)" in (tables / "power_laws.md").read_text()
