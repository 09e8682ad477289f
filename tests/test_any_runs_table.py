"""Any runs table in (issue 48): tables in the shapes of public IsoFLOP studies (r = 1, only budget, parameters,
tokens and loss; 85-133 runs), and a looped table with every documented column, each optional one removed
(two unrelated ones at a time) through analyze, export, predict and compare; the law's compute-optimal N and D
where no template builds the runs; --columns; the output of a single-r table. Every table is made here, from a
known law with noise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from loopscale.analysis import load_runs
from loopscale.analysis.runs import REQUIRED_COLUMNS, TABLE_COLUMNS
from loopscale.analysis.sizes import PAPER_TEMPLATE
from loopscale.model import PAPER_LAW, JointLaw, LoopedConfig, account, tokens_for_budget
from loopscale.search.cli import main
from test_bad_input import refuses

FAST = ["--n-starts", "30", "--n-bootstrap", "20"]
# Hoffmann et al. 2022's fitted constants (their eq. 10), a plain law: what a public study's runs follow
CHINCHILLA = JointLaw(E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28, phi=0.0)
NOISE = 0.005


def public_study(budgets: int = 9, sizes: int = 13, *, noise: float = NOISE, seed: int = 0) -> pd.DataFrame:
    """An IsoFLOP study as published: per budget (6e18 to 3e21 FLOPs, log-spaced) ``sizes`` models spread over
    25x around the compute-optimal N, D = C / (6 N), the loss of ``CHINCHILLA`` times log-normal noise; only the
    columns budget, parameters, tokens, loss."""
    rng = np.random.default_rng(seed)
    rows = []
    for budget in np.geomspace(6e18, 3e21, budgets):
        middle = 0.1 * np.sqrt(budget / 6)
        for n in middle * np.geomspace(0.2, 5, sizes):
            tokens = budget / (6 * n)
            loss = CHINCHILLA.loss(n, 0.0, 1, tokens) * np.exp(noise * rng.standard_normal())
            rows.append({"budget": budget, "parameters": n, "tokens": tokens, "loss": float(loss)})
    return pd.DataFrame(rows)


AS_RUNS_TABLE = {"budget": "budget_flops", "parameters": "N_once", "loss": "val_loss"}


def required_only(study: pd.DataFrame) -> pd.DataFrame:
    """``study`` with the required columns of docs/runs_table.md and nothing else."""
    return study.rename(columns=AS_RUNS_TABLE).assign(r=1, N_rec=0)[list(REQUIRED_COLUMNS)]


def full_table(*, seed: int = 0) -> pd.DataFrame:
    """A looped study (r = 1, 2, 4) of the paper's iso-depth models with every column the format documents."""
    rng = np.random.default_rng(seed)
    widths = {1e18: (6, 8, 12, 16, 22), 3e18: (8, 12, 16, 22, 30), 1e19: (12, 16, 22, 30, 42),
              3e19: (16, 22, 30, 42, 58)}
    rows = []
    for budget, multipliers in widths.items():
        for r in (1, 2, 4):
            for s in multipliers:
                config = LoopedConfig.iso_depth(s, r)
                counts = account(config)
                tokens = tokens_for_budget(config, budget, 262_144)
                loss = PAPER_LAW.loss(counts.N_once, counts.N_rec, r, tokens) * np.exp(0.01 * rng.standard_normal())
                rows.append({"r": r, "budget_flops": budget, "N_once": counts.N_once, "N_rec": counts.N_rec,
                             "tokens": tokens, "val_loss": float(loss), "width": config.width,
                             "flops_per_token": counts.flops_per_token, "status": "ok", "reason": "",
                             "stage": "search", "run_id": f"run{len(rows)}", "sweep": "full",
                             "flops_spent": counts.flops_per_token * tokens, "N_embed": counts.N_embed,
                             "lr": 3e-3, "seed": seed, "s": s, "batch_tokens": 262_144,
                             **{f"template.{k}": v for k, v in PAPER_TEMPLATE.items()}})
    return pd.DataFrame(rows)


def test_the_full_table_has_every_documented_column():
    assert set(TABLE_COLUMNS) <= set(full_table().columns)


OPTIONAL = [c for c in TABLE_COLUMNS if c not in REQUIRED_COLUMNS] + ["template.*"]
# Each optional column removed once, beside one that no code reads in its place: never two that stand in for
# each other (width and s, status and reason, flops_per_token, flops_spent and N_embed, batch_tokens and the
# template), whose removal together would skip the path the table takes without just one of them.
ABSENT = [("width", "lr"), ("flops_per_token", "run_id"), ("status", "N_embed"), ("reason", "s"),
          ("stage", "batch_tokens"), ("sweep", "flops_spent"), ("seed", "template.*")]


def test_each_optional_column_is_removed_once():
    assert sorted(c for pair in ABSENT for c in pair) == sorted(OPTIONAL)


@pytest.fixture(scope="module")
def looped_pair(tmp_path_factory) -> tuple[pd.DataFrame, pd.DataFrame]:
    return full_table(seed=0), full_table(seed=1)


def without(table: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    gone = [c for c in table.columns if c in columns or (c.startswith("template.") and "template.*" in columns)]
    return table.drop(columns=gone)


@pytest.mark.parametrize("columns", ABSENT, ids="+".join)
def test_no_optional_column_s_absence_breaks_a_command(looped_pair, tmp_path, capsys, columns):
    """Each command on the looped table with optional columns removed: exit 0 and its output whole."""
    a, b = (tmp_path / "a.csv", tmp_path / "b.csv")
    for table, path in zip(looped_pair, (a, b)):
        without(table, columns).to_csv(path, index=False)
        assert len(pd.read_csv(path).columns) < len(table.columns) - 1  # both gone (the template: all its keys)
    out = tmp_path / "analysis"
    assert main(["analyze", "--experiment", str(a), "--out", str(out), *FAST]) == 0
    allocation = pd.read_csv(out / "tables" / "allocation.csv")
    assert len(allocation) == 12 and allocation[["N", "tokens", "loss"]].notna().all().all()
    json.loads((out / "summary.json").read_text())
    for table in (out / "tables").glob("*.json"):
        json.loads(table.read_text())
    capsys.readouterr()
    assert main(["export", "--experiment", str(a), "--budgets", "1e20", "--r", "1,4", *FAST]) == 0
    exported = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert len(exported) == 2 and exported[["N (params)", "N lo", "N hi"]].notna().all().all()
    assert main(["predict", "--experiment", str(a), "--budget", "1e20", "--r", "2", *FAST]) == 0
    assert "compute-optimal: N " in capsys.readouterr().out
    assert main(["compare", str(a), str(b), *FAST]) == 0
    assert "Delta-phi (B - A) = " in capsys.readouterr().out


@pytest.mark.parametrize("budgets,sizes", [(7, 13), (9, 13), (11, 12)])  # 91, 117 and 132 runs
def test_the_required_columns_alone_analyze_with_an_allocation(tmp_path, capsys, budgets, sizes):
    """The crash of issue 48 (a JSON table with a NaN numpy scalar) and the skipped allocation: a table with the
    required columns alone writes every table, the allocation (the law's N* and D*) among them."""
    path = tmp_path / "study.csv"
    required_only(public_study(budgets, sizes)).to_csv(path, index=False)
    out = tmp_path / "out"
    assert main(["analyze", "--experiment", str(path), "--out", str(out), *FAST]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # lines are wrapped at 120 columns
    assert "k = 6 per parameter pass, the table has no flops_per_token" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert "k = 6 per parameter pass" in summary["template"]
    stems = {p.stem for p in (out / "tables").iterdir()}
    assert "allocation" in stems
    for fmt in ("csv", "md", "tex", "json"):
        assert (out / "tables" / f"allocation.{fmt}").stat().st_size > 0
    table = pd.read_csv(out / "tables" / "allocation.csv")
    assert len(table) == budgets
    for column in ("N", "tokens", "loss"):
        assert (table[f"{column}_lo"] <= table[column]).all() and (table[column] <= table[f"{column}_hi"]).all()
        assert (table[f"{column}_hi"] > table[f"{column}_lo"]).all()
    assert np.allclose(table["budget_flops"], 6 * table["N"] * table["tokens"], rtol=1e-12)


def test_analyze_without_out_writes_its_default_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    required_only(public_study()).to_csv(tmp_path / "study.csv", index=False)
    assert main(["analyze", "--experiment", "study.csv", *FAST]) == 0
    assert (tmp_path / "loopscale-runs" / "analysis" / "study" / "tables" / "allocation.json").is_file()


def test_the_law_s_optimum_recovers_the_true_allocation(tmp_path):
    """Noise-free runs of a known plain law: the fitted law's N*(C) and D*(C) under C = 6 N D are the true
    law's optimum, found here by a dense search along the budget's curve (not the closed form)."""
    from loopscale.analysis.fit import fit_joint_law
    from loopscale.analysis.law_optimum import RunCosts, optimum_table

    runs = load_runs_of(required_only(public_study(noise=0.0)), tmp_path)
    fit = fit_joint_law(runs, n_starts=60, n_bootstrap=0)
    table = optimum_table(fit, [1e19, 1e21, 1e23], [1], costs=RunCosts.of(runs))
    for budget, n_star in zip(table["budget_flops"], table["N"]):
        grid = np.geomspace(1e6, 1e13, 400_001)
        losses = CHINCHILLA.loss(grid, 0.0, 1, budget / (6 * grid))
        assert n_star == pytest.approx(grid[np.argmin(losses)], rel=0.02)


def load_runs_of(table: pd.DataFrame, folder: Path, **kwargs):
    path = folder / "runs.csv"
    table.to_csv(path, index=False)
    return load_runs(path, **kwargs)


def test_k_is_read_from_flops_per_token_and_said(tmp_path):
    """k = flops_per_token / N (the median) where the table has it: here 8 FLOPs per token and parameter, as
    a model whose attention costs a third again; the optimum's D is C / (8 N)."""
    from loopscale.analysis.fit import fit_joint_law
    from loopscale.analysis.law_optimum import RunCosts, optimum_table

    study = required_only(public_study())
    runs = load_runs_of(study.assign(flops_per_token=8 * study["N_once"]), tmp_path)
    costs = RunCosts.of(runs)
    assert costs.k == {1: 8.0} and "from the runs' flops_per_token / N" in costs.note
    table = optimum_table(fit_joint_law(runs, n_starts=30, n_bootstrap=0), [1e20], [1], costs=costs)
    assert table["tokens"].iloc[0] == pytest.approx(1e20 / (8 * table["N"].iloc[0]), rel=1e-12)


def test_export_and_predict_answer_a_table_no_template_builds(tmp_path, capsys):
    path = tmp_path / "study.csv"
    required_only(public_study()).to_csv(path, index=False)
    rows = {"csv": lambda text: text.count("\n") - 1, "md": lambda text: text.count("\n") - 2,
            "latex": lambda text: text.count(r"\\") - 1, "json": lambda text: len(json.loads(text))}
    for fmt, count in rows.items():
        assert main(["export", "--experiment", str(path), "--budgets", "1e21,1e22", "--format", fmt, *FAST]) == 0
        captured = capsys.readouterr()
        err = " ".join(captured.err.split())  # lines are wrapped at 120 columns
        assert "no template sizes the runs" in err and "k = 6 per parameter pass" in err
        assert count(captured.out) == 2 and "N lo" in captured.out.replace("N lo-hi", "N lo"), captured.out
    assert main(["export", "--experiment", str(path), "--budgets", "1e21", "--full", *FAST]) == 0
    full = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert full["flops_per_param_token"].iloc[0] == 6 and full["N_lo"].iloc[0] < full["N"].iloc[0]
    assert main(["predict", "--experiment", str(path), "--budget", "1e21", "--r", "1", *FAST]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("compute-optimal: N ") and lines[2].startswith("cost: C = k N D with k = 6")
    assert all("width" not in line for line in lines[:2])


def test_predict_refuses_a_width_without_a_template_before_any_fit(tmp_path, capsys):
    path = tmp_path / "study.csv"
    required_only(public_study()).to_csv(path, index=False)
    refuses(["predict", "--experiment", str(path), "--budget", "1e21", "--r", "1", "--width", "1024", *FAST],
            tmp_path, capsys, "--width needs a template that builds the runs' models")


def test_a_table_without_r_is_a_plain_study(tmp_path):
    runs = load_runs_of(required_only(public_study()).drop(columns=["r", "N_rec"]), tmp_path)
    assert (runs["r"] == 1).all() and (runs["N_rec"] == 0).all() and (runs["status"] == "ok").all()


def test_a_table_with_r_still_needs_n_rec(tmp_path):
    with pytest.raises(ValueError, match="runs table lacks column\\(s\\) N_rec"):
        load_runs_of(required_only(public_study()).drop(columns=["N_rec"]), tmp_path)


def test_a_single_r_table_says_nothing_meaningless(tmp_path, capsys):
    """No phi-restricted or per-r fits (at one r they are the joint fit), one R^2, no spent line without
    flops_spent."""
    path = tmp_path / "study.csv"
    required_only(public_study()).to_csv(path, index=False)
    out = tmp_path / "out"
    assert main(["analyze", "--experiment", str(path), "--out", str(out), *FAST]) == 0
    captured = capsys.readouterr()
    assert "restricted fits" not in captured.err and "per-r" not in captured.err
    printed = captured.out
    assert "phi=0" not in printed and "phi=1" not in printed and "r=1 0." not in printed
    assert "spent:" not in printed
    r2 = [line for line in printed.splitlines() if line.startswith("R^2")]
    assert len(r2) == 1 and r2[0].count("|") == 0
    fits = pd.read_csv(out / "tables" / "fits.csv")
    assert list(fits["fit"]) == ["joint"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["phi0"] is None and summary["phi1"] is None and summary["per_r"] == {}
    assert summary["flops_spent"] is None


def test_columns_map_and_scale_a_public_table(tmp_path, capsys):
    """The study as published (budget in GFLOPs, tokens in billions, its own names) read with --columns gives
    the fit of the same table renamed by hand."""
    study = public_study()
    published = study.assign(budget=study["budget"] / 1e9, tokens=study["tokens"] / 1e9).rename(
        columns={"budget": "gflops", "tokens": "tokens_b"})
    published.to_csv(tmp_path / "published.csv", index=False)
    required_only(study).to_csv(tmp_path / "renamed.csv", index=False)
    mapping = "budget_flops=gflops*1e9,tokens=tokens_b*1e9,N_once=parameters,val_loss=loss"
    outs = {}
    for name, extra in (("published", ["--columns", mapping]), ("renamed", [])):
        outs[name] = tmp_path / f"out_{name}"
        assert main(["analyze", "--experiment", str(tmp_path / f"{name}.csv"), "--out", str(outs[name]),
                     *extra, *FAST]) == 0
    constants = [pd.read_csv(out / "tables" / "joint_constants.csv") for out in outs.values()]
    assert np.allclose(constants[0]["value"], constants[1]["value"], rtol=1e-9)
    capsys.readouterr()
    assert main(["predict", "--experiment", str(tmp_path / "published.csv"), "--columns", mapping,
                 "--budget", "1e21", "--r", "1", *FAST]) == 0
    assert "compute-optimal: N " in capsys.readouterr().out


def test_columns_through_the_python_api(tmp_path):
    runs = load_runs_of(public_study(), tmp_path, columns="budget_flops=budget, N_once=parameters, val_loss=loss")
    assert len(runs) == 117 and (runs["status"] == "ok").all() and (runs["r"] == 1).all()


@pytest.mark.parametrize("command", ["analyze", "export", "predict", "compare"])
def test_a_mapped_column_that_is_missing_is_one_line_and_nothing_written(tmp_path, capsys, command):
    path = tmp_path / "study.csv"
    public_study().to_csv(path, index=False)
    mapping = ["--columns", "budget_flops=budget,N_once=params,val_loss=loss"]
    argv = {"analyze": ["analyze", "--experiment", str(path), "--out", str(tmp_path / "out")],
            "export": ["export", "--experiment", str(path), "--out", str(tmp_path / "out.csv")],
            "predict": ["predict", "--experiment", str(path), "--budget", "1e21", "--r", "1"],
            "compare": ["compare", str(path), str(path)]}[command]
    err = refuses([*argv, *mapping, *FAST], tmp_path, capsys, "--columns N_once=params: ")
    assert "has no column 'params'" in err


@pytest.mark.parametrize("mapping,message", [
    ("loss", "is not TARGET=SOURCE"),
    ("losses=loss", "target 'losses' is not a runs table column"),
    ("val_loss=loss*0", "the factor after '*' must be a positive number"),
    ("val_loss=loss*nan", "the factor after '*' must be a positive number"),
    ("val_loss=loss,val_loss=loss", "maps val_loss twice"),
    (",", "--columns is empty"),
])
def test_a_bad_mapping_is_one_line(tmp_path, capsys, mapping, message):
    path = tmp_path / "study.csv"
    public_study().to_csv(path, index=False)
    refuses(["analyze", "--experiment", str(path), "--out", str(tmp_path / "out"), "--columns", mapping, *FAST],
            tmp_path, capsys, message)


def test_columns_do_not_apply_to_the_published_law(tmp_path, capsys):
    refuses(["export", "--law", "paper", "--columns", "val_loss=loss"], tmp_path, capsys,
            "--columns maps the columns of a runs table; --law paper reads none")
