"""Any runs table a researcher has: the example tables (examples/runs_tables/make_tables.py, the ones the docs
use) through analyze and export: a single-r study fits as the plain law and says phi is not applicable;
--fix-phi holds phi; the analyze summary and allocation table carry intervals."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from loopscale.analysis import load_runs
from loopscale.analysis.cli import main
from loopscale.analysis.numbers import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--n-starts", "60", "--n-bootstrap", "30"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, Path]:
    spec = importlib.util.spec_from_file_location("make_tables", ROOT / "examples" / "runs_tables" / "make_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {path.stem: path for path in module.main(tmp_path_factory.mktemp("tables"))}


def test_the_example_tables_are_valid_runs_tables(tables):
    single, looped = load_runs(tables["single_r"]), load_runs(tables["looped"])
    assert set(single["r"]) == {1} and set(looped["r"]) == {1, 2, 4}
    assert (single["status"] == "ok").all() and (looped["status"] == "ok").all()


def test_a_single_r_study_analyzes_as_the_plain_law(tables, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert main(["analyze", "--experiment", str(tables["single_r"]), "--out", str(out), *FAST]) == 0
    printed = capsys.readouterr().out
    assert "phi not applicable (one r, r=1: the plain law L = E + A N^-alpha + B D^-beta)" in printed
    assert "gap to r=1" not in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["joint"]["phi_applicable"] is False and summary["joint"]["single_r"] == 1
    allocation = pd.read_csv(out / "tables" / "allocation_buildable.csv")
    assert (allocation["loss lo"] <= allocation["loss (nats)"]).all()
    assert (allocation["loss (nats)"] <= allocation["loss hi"]).all()
    assert (allocation["loss hi"] > allocation["loss lo"]).all()


def test_the_summary_shows_each_constant_with_its_interval(tables, tmp_path, capsys):
    assert main(["analyze", "--experiment", str(tables["looped"]), "--out", str(tmp_path / "a"), *FAST]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    constants = " ".join(line for line in printed.splitlines() if line.startswith("  "))
    for name in ("E", "A", "alpha", "B", "beta"):
        lo, hi = summary["joint"]["ci"][name]
        assert f" {name} " in constants and lo < summary["joint"][name] < hi
    assert "95% CI" in printed
    assert max(len(line) for line in printed.splitlines()) <= COLUMNS  # the backtest, spent and table lines too
    gaps = next(line for line in printed.splitlines() if line.startswith("gap to r=1"))
    assert "smallest and largest over the budgets" in gaps and " to " in gaps  # not a range read as an interval


def test_a_single_r_study_exports(tables, capsys):
    assert main(["export", "--experiment", str(tables["single_r"]), "--budgets", "1e20", *FAST]) == 0
    captured = capsys.readouterr()
    assert "phi not applicable" in captured.err
    assert {"loss lo", "loss hi"} <= set(pd.read_csv(io.StringIO(captured.out)).columns)


@pytest.mark.parametrize("command", ["export", "predict"])
def test_a_single_r_study_answers_another_r_only_under_a_phi_given(tables, capsys, command):
    """At r=4 a single-r (r=1) study's law holds phi at 0, an assumption no line stated: its looped rows came
    with intervals as if measured. Refused unless --fix-phi says which phi."""
    where = ["--budgets", "1e20", "--r", "1,4"] if command == "export" else ["--budget", "1e20", "--r", "4"]
    assert main([command, "--experiment", str(tables["single_r"]), *where, *FAST]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert ("has runs of one r only (r=1): at r=4 phi is not measured; pass --fix-phi VALUE to say which phi "
            "(0: a recurrence adds no capacity)") in captured.err
    assert main([command, "--experiment", str(tables["single_r"]), *where, "--fix-phi", "0", *FAST]) == 0
    assert "phi 0 (fixed)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["analyze", "export"])
def test_fix_phi_holds_phi(tables, tmp_path, capsys, command):
    out = tmp_path / ("analysis" if command == "analyze" else "alloc.csv")
    assert main([command, "--experiment", str(tables["looped"]), "--fix-phi", "0.3", "--out", str(out), *FAST]) == 0
    printed = capsys.readouterr()
    assert "phi 0.3 (fixed)" in printed.out + printed.err
    if command == "analyze":
        joint = json.loads((out / "summary.json").read_text())["joint"]
        assert joint["phi"] == 0.3 and joint["fixed_phi"] == 0.3 and joint["phi_applicable"]
        assert {row["value"] for row in pd.read_csv(out / "tables" / "joint_constants.csv").to_dict("records")
                if row["constant"] == "phi"} == {0.3}


def test_fix_phi_must_be_a_number(tables, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "--experiment", str(tables["looped"]), "--fix-phi", "half"])
    assert exit_.value.code == 2 and "--fix-phi" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["analyze", "export", "predict"])
@pytest.mark.parametrize("value", ["1e308", "10", "-3.5"])
def test_fix_phi_outside_the_fits_bounds_is_refused_before_any_work(tables, tmp_path, capsys, command, value):
    """1e308 overflowed the fit (warnings, then a traceback); 10 was fitted, outside the box phi is fitted in."""
    out = tmp_path / "out"
    argv = [command, "--experiment", str(tables["looped"]), "--fix-phi", value, *FAST]
    argv += ["--budget", "1e20", "--r", "2"] if command == "predict" else ["--out", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert f"fix_phi {float(value)} is outside the fit's bounds on phi, -3 to 3" in captured.err
    assert not out.exists()


def test_tokens_that_disagree_with_the_budgets_are_said_and_refused_when_all_do(tables, tmp_path, capsys):
    """tokens x flops_per_token = 100 x budget_flops in every run was fitted without a remark, and the recommended
    model fell from 753M to 62M parameters. A sweep's run spends between half its budget and all of it."""
    table = pd.read_csv(tables["looped"])
    every, some = tmp_path / "every.csv", tmp_path / "some.csv"
    table.assign(tokens=table["tokens"] * 100).to_csv(every, index=False)
    table.assign(tokens=table["tokens"] * [100 if i < 3 else 1 for i in range(len(table))]).to_csv(some, index=False)
    for command in (["export", "--budgets", "1e19"], ["predict", "--budget", "1e19", "--r", "2"]):
        assert main([*command, "--experiment", str(every), *FAST]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured.err
        assert (f"every run of {every} ({len(table)}) has tokens x flops_per_token 100x its budget_flops"
                in captured.err)
    assert main(["export", "--experiment", str(some), "--budgets", "1e19", *FAST]) == 0
    err = " ".join(capsys.readouterr().err.split())  # wrapped within the columns
    assert (f"loopscale: warning: 3 of {len(table)} runs of {some} have tokens x flops_per_token 100x their "
            "budget_flops") in err


def test_compare_refuses_a_single_r_study_before_any_fit(tables, capsys):
    assert main(["compare", str(tables["single_r"]), str(tables["looped"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has runs of one r only (r=1): phi is not applicable" in err
