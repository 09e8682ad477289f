"""``loopscale analyze | export | compare`` end to end: a simulated paper replay in a real MLflow sqlite store."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from loopscale.analysis.cli import main, register, run_export
from loopscale.model import PAPER_LAW, JointLaw
from test_analysis_sim import PAPER_GRID, log_sweep, paper_runs, trial_configs

FAST = ["--n-starts", "100", "--n-bootstrap", "100"]


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    """The paper's 116-run grid simulated with 0.01-nat noise, plus 2 failed and 1 diverged trial, in MLflow."""
    root = tmp_path_factory.mktemp("replay")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    broken = trial_configs(grid={1e19: (30, 32, 36)}, recurrences=(2,))
    extra = [(broken[0], {"status": "failed", "reason": "worker died"}),
             (broken[1], {"status": "failed", "reason": "worker died"}),
             (broken[2], {"status": "diverged", "reason": "loss is nan at step 40"})]
    log_sweep(uri, "paper", trial_configs(noise=0.01), root / "artifacts", extra=extra)
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).create_experiment("empty", artifact_location=(root / "empty-artifacts").as_uri())
    return {"uri": uri, "root": root}


def analysis_runs(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("paper")
    return client, client.search_runs([exp.experiment_id], "tags.`loopscale.kind` = 'analysis'")


@pytest.mark.integration
@pytest.mark.slow
def test_analyze_the_paper_replay_from_mlflow(replay, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert main(["analyze", "--experiment", "paper", "--tracking-uri", replay["uri"], "--out", str(out), *FAST]) == 0
    printed = capsys.readouterr().out
    assert "phi = 0.4" in printed and "95% CI" in printed and "R^2: joint 0.99" in printed
    assert "excluded: 3 runs: 2 failed (worker died); 1 diverged (loss is nan at step 40)" in printed
    assert "gap to r=1" in printed

    summary = json.loads((out / "summary.json").read_text())
    joint = summary["joint"]
    assert abs(joint["phi"] - PAPER_LAW.phi) < 0.03
    lo, hi = joint["phi_ci"]
    assert lo < PAPER_LAW.phi < hi and hi - lo < 0.2
    assert joint["status"] == "converged" and joint["n_runs"] == 116
    assert summary["runs_total"] == 119 and summary["runs_used"] == 116
    assert summary["phi1"]["r2"] < summary["phi0"]["r2"] < joint["r2"]
    assert "recorded" in summary["template"]

    for name in ("fits", "joint_constants", "cell_optima", "frontier", "power_laws", "allocation", "excluded"):
        for suffix in (".csv", ".md", ".tex", ".json"):
            assert (out / "tables" / f"{name}{suffix}").stat().st_size > 0
    allocation = pd.read_csv(out / "tables" / "allocation.csv")
    assert len(allocation) == 24 and set(allocation["r"]) == {1, 2, 4, 8}
    assert "\\begin{tabular}" in (out / "tables" / "fits.tex").read_text()
    pngs = {p.name for p in (out / "plots").glob("*.png")}
    assert pngs == {"isoflop.png", "frontier.png", "law_vs_optima.png", "residuals.png", "phi_bootstrap.png"}
    assert all((out / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    for png in pngs:  # and each figure for a paper, as SVG and PDF
        stem = out / "plots" / Path(png).stem
        assert stem.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
        assert b"<svg" in stem.with_suffix(".svg").read_bytes()[:2000]

    client, runs = analysis_runs(replay["uri"])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["sweep"] == "paper"
    assert run.data.metrics["phi"] == pytest.approx(joint["phi"])
    assert run.data.metrics["runs_excluded"] == 3
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"tables", "plots", "summary.json", "summary.txt"} <= artifacts
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert "plots/phi_bootstrap.png" in plots

    # Analysing again replaces the analysis run instead of adding a second one.
    again = ["analyze", "--experiment", "paper", "--tracking-uri", replay["uri"], "--out", str(out),
             "--n-starts", "30", "--n-bootstrap", "10"]
    assert main(again) == 0
    assert "replaced 1 earlier analysis run" in capsys.readouterr().out
    _, runs = analysis_runs(replay["uri"])
    assert len(runs) == 1 and runs[0].info.run_id != run.info.run_id
    assert runs[0].data.tags["loopscale.replaces"] == run.info.run_id


@pytest.mark.integration
def test_export_from_a_fitted_experiment(replay, tmp_path):
    target = tmp_path / "alloc.json"
    assert main(["export", "--experiment", "paper", "--tracking-uri", replay["uri"], "--budgets", "1e20",
                 "--r", "1,4", "--format", "json", "--out", str(target), "--n-starts", "60", "--full"]) == 0
    rows = json.loads(target.read_text())
    assert [row["r"] for row in rows] == [1, 4]
    assert rows[1]["width"] > rows[0]["width"] and rows[1]["loss_gap_to_r1"] > 0


@pytest.mark.integration
@pytest.mark.parametrize("argv, message", [
    (["analyze", "--experiment", "nope"], "no experiment 'nope'"),
    (["analyze", "--experiment", "empty"], "has no trial runs"),
    (["export", "--experiment", "nope"], "no experiment 'nope'"),
    (["compare", "paper", "nope"], "no experiment 'nope'"),
])
def test_bad_experiments_exit_2_with_one_line_and_write_nothing(replay, tmp_path, capsys, argv, message):
    out = tmp_path / "never"
    extra = ["--out", str(out)] if argv[0] in ("analyze", "export") else []
    assert main([*argv, "--tracking-uri", replay["uri"], *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("make, message", [("missing", "no MLflow database at"),
                                           ("corrupted", "is not a readable SQLite database")])
def test_unreadable_stores_exit_2(tmp_path, capsys, make, message):
    db = tmp_path / "mlflow.db"
    if make == "corrupted":
        db.write_bytes(b"\x00garbage" * 512)
    out = tmp_path / "out"
    assert main(["analyze", "--experiment", "paper", "--tracking-uri", f"sqlite:///{db}", "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and (make == "corrupted" or not db.exists())


def test_analyze_a_csv_runs_table_without_mlflow(tmp_path, capsys):
    path = tmp_path / "sweep.csv"
    paper_runs(noise=0.01).to_csv(path, index=False)
    out = tmp_path / "out"
    assert main(["analyze", "--experiment", str(path), "--out", str(out), "--n-starts", "40",
                 "--n-bootstrap", "20"]) == 0
    printed, progress = capsys.readouterr()
    assert printed.startswith("sweep: 116 runs") and "logged to MLflow" not in printed
    # the fits report as they start, on stderr, with the seconds since the start
    steps = [line.split("] ", 1)[1].split(":")[0] for line in progress.splitlines()]
    assert steps == ["116 runs in 24 cells", "joint fit", "restricted fits", "per-r Chinchilla fits",
                     "allocation tables", "backtest", f"writing tables and plots to {out}"], progress
    assert "joint fit: 40 starts, 20 bootstrap resamples" in progress
    # no template recorded in a plain table: the paper's is assumed, then checked against the runs' sizes
    assert "paper (not recorded)" in json.loads((out / "summary.json").read_text())["template"]


@pytest.mark.parametrize("fmt, check", [
    ("csv", lambda text: len(pd.read_csv(io.StringIO(text))) == 8),
    ("json", lambda text: len(json.loads(text)) == 8),
    ("md", lambda text: text.startswith("| budget (FLOPs) | r | width |") and text.count("\n") == 10),
    ("latex", lambda text: "\\toprule" in text and "loss (nats)" in text and "1.00e19" in text),
])
def test_export_the_published_law(capsys, fmt, check):
    assert main(["export", "--law", "paper", "--budgets", "1e18,1e19", "--r", "1,2,4,8", "--format", fmt]) == 0
    assert check(capsys.readouterr().out)


def test_compare_finds_a_better_loop_and_no_difference_for_a_rerun(tmp_path, capsys):
    low = {c: s for c, s in list(PAPER_GRID.items())[:4]}
    base = tmp_path / "baseline.csv"
    paper_runs(noise=0.01, seed=0).to_csv(base, index=False)
    better = JointLaw(**{**PAPER_LAW.to_dict(), "phi": 0.65})
    # the paper's hyperconnections sweep: 4 lower budgets, r > 1 only, r = 1 borrowed from the baseline
    variant = tmp_path / "hyper.csv"
    paper_runs(better, noise=0.01, seed=1, grid=low, recurrences=(2, 4, 8)).to_csv(variant, index=False)
    assert main(["compare", str(base), str(variant), "--n-starts", "60", "--n-bootstrap", "100"]) == 0
    text = capsys.readouterr().out
    assert "borrows the other sweep's 20 r = 1 runs" in text
    assert "A recurrence is worth more in" in text
    delta = float(text.split("Delta-phi (B - A) = ")[1].split()[0])
    assert delta == pytest.approx(0.65 - 0.459, abs=0.08)

    rerun = tmp_path / "rerun.csv"
    paper_runs(noise=0.01, seed=7).to_csv(rerun, index=False)
    assert main(["compare", str(base), str(rerun), "--n-starts", "60", "--n-bootstrap", "100"]) == 0
    assert "No clear difference" in capsys.readouterr().out


def test_register_adds_four_documented_subcommands():
    parser = argparse.ArgumentParser(prog="loopscale")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    assert set(sub.choices) == {"analyze", "export", "predict", "compare"}
    for name, sub_parser in sub.choices.items():  # each says which store it reads when given none
        assert "MLFLOW_TRACKING_URI" in " ".join(sub_parser.format_help().split()), name
    args = parser.parse_args(["export", "--law", "paper", "--format", "md"])
    assert args.func is run_export and args.format == "md"
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["export", "--law", "paper", "--budgets", "1e18,abc"])
    assert exit_info.value.code == 2
