"""A law fitted without r = 1 runs compares with r = 1 only by extrapolation: analyze's gap to r = 1 and predict's
and export's "r beats r = 1" come with a warning line, as budgets outside the fitted ones do; with r = 1 run, none."""

from __future__ import annotations

import json

import pytest

from loopscale.analysis.cli import main
from test_analysis_sim import paper_runs

FAST = ["--n-starts", "40", "--n-bootstrap", "0"]
WARNING = "r=1 was not run (the law was fitted on r = 2, 4, 8)"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("r1")
    runs = paper_runs(noise=0.01)
    looped, with_r1 = root / "looped.csv", root / "with_r1.csv"
    runs[runs["r"] > 1].to_csv(looped, index=False)
    runs.to_csv(with_r1, index=False)
    return looped, with_r1


def test_analyze_warns_that_its_gap_to_r1_is_extrapolated_without_r1_runs(tables, tmp_path, capsys):
    looped, with_r1 = tables
    out = tmp_path / "looped"
    assert main(["analyze", "--experiment", str(looped), "--out", str(out), *FAST]) == 0
    lines = capsys.readouterr().out.splitlines()
    gap = next(i for i, line in enumerate(lines) if line.startswith("gap to r=1"))
    after = [line for line in lines[gap + 1:] if not line.startswith("  ")][0]
    assert after.startswith(f"warning: {WARNING}: every comparison with r=1"), lines[gap:gap + 3]
    assert WARNING in json.loads((out / "summary.json").read_text())["gap_to_r1_warning"]

    assert main(["analyze", "--experiment", str(with_r1), "--out", str(tmp_path / "with_r1"), *FAST]) == 0
    printed = capsys.readouterr().out
    assert "gap to r=1" in printed and "was not run" not in printed


@pytest.mark.parametrize("command", [["predict", "--budget", "1e19", "--r", "4"], ["export", "--budgets", "1e19"]])
def test_predict_and_export_warn_that_beating_r1_is_extrapolated_without_r1_runs(tables, capsys, command):
    looped, with_r1 = tables
    assert main([command[0], "--experiment", str(looped), *command[1:], *FAST]) == 0
    err = capsys.readouterr().err
    assert f"loopscale: warning: {WARNING}" in err
    assert main([command[0], "--experiment", str(with_r1), *command[1:], *FAST]) == 0
    assert "was not run" not in capsys.readouterr().err
