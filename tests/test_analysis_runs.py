"""The runs table: from CSV, parquet and a real MLflow sqlite store; validation; every bad input one line."""

from __future__ import annotations

import socket
import sqlite3

import pandas as pd
import pytest

from loopscale.analysis import RUN_COLUMNS, exclusions, load_runs, usable_runs
from loopscale.analysis.flops import paper_grid_flops, paper_grid_reference
from loopscale.analysis.runs import template_of
from loopscale.analysis.sizes import PAPER_BATCH_TOKENS, PAPER_TEMPLATE
from loopscale.search.tracking import flatten_params
from test_analysis_sim import PAPER_GRID, TEMPLATE, log_sweep, paper_runs, trial_configs

SMALL_GRID = {1e18: (6, 8, 10, 12, 14)}


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_load_runs_from_a_file(tmp_path, suffix):
    table = paper_runs(noise=0.01)
    path = tmp_path / f"sweep{suffix}"
    table.to_csv(path, index=False) if suffix == ".csv" else table.to_parquet(path)
    runs = load_runs(path)
    assert list(runs.columns[:len(RUN_COLUMNS)]) == list(RUN_COLUMNS)
    assert len(runs) == 116 and (runs["status"] == "ok").all()
    pd.testing.assert_series_equal(runs["val_loss"], table["val_loss"], check_names=False)
    assert runs.attrs["source"] == str(path)


def test_rows_marked_ok_with_impossible_numbers_are_set_aside_with_a_reason(tmp_path):
    table = paper_runs().astype({"r": float, "tokens": float})
    table.loc[0, "val_loss"] = float("nan")
    table.loc[1, "tokens"] = 0
    table.loc[2, "r"] = 2.5
    table.loc[3, ["status", "reason"]] = ["diverged", "loss went to nan at step 40"]
    table.loc[4, ["status", "reason"]] = ["failed", ""]
    path = tmp_path / "runs.csv"
    table.to_csv(path, index=False)
    runs = load_runs(path)
    assert list(runs.loc[:4, "status"]) == ["invalid", "invalid", "invalid", "diverged", "failed"]
    assert runs.loc[0, "reason"] == "val_loss is missing or not finite"
    assert runs.loc[1, "reason"] == "tokens is not positive"
    assert runs.loc[2, "reason"] == "r is not a positive integer"
    assert runs.loc[4, "reason"] == "no reason recorded"
    assert len(usable_runs(runs)) == 111
    counts = exclusions(runs)
    assert counts["count"].sum() == 5
    assert set(counts["status"]) == {"invalid", "diverged", "failed"}


@pytest.mark.parametrize("content, message", [
    (None, "no runs file"),
    ("", "cannot read runs file"),
    ("a,b\n1,2\n", "lacks column"),
    ("r,budget_flops,N_once,N_rec,tokens,val_loss\n", "no runs"),
])
def test_bad_files_are_one_line_value_errors(tmp_path, content, message):
    path = tmp_path / "runs.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        load_runs(path)
    assert "\n" not in str(err.value)


def test_template_is_read_back_from_mlflow_style_columns():
    runs = paper_runs()
    template, batch, source = template_of(runs)
    assert source == "paper (not recorded)" and batch == 262_144
    for key, value in TEMPLATE.items():
        runs[f"template.{key}"] = str(value)
    runs["template.bptt_k"] = "None"
    template, _, source = template_of(runs)
    assert template == TEMPLATE and source == "recorded"
    runs.loc[0, "template.depth"] = "12"
    with pytest.raises(ValueError, match="disagree on template.depth"):
        template_of(runs)


def test_a_factory_s_options_come_back_from_the_params_with_their_types():
    """Options logged as MLflow params (search/tracking.py) read back as the factory got them: 1.0 a float, "1"
    a string, a list a list; a factory that checks its types builds again for predict, export and analyze."""
    options = {"scale": 1.0, "n": 2, "name": "1", "sizes": [1, 2.5], "flag": True, "inner": {"k": 0.5}}
    params = flatten_params({"template": {"depth": 20, "architecture": "my.py:build", "options": options}})
    runs = paper_runs().assign(**params)
    template, _, _ = template_of(runs)
    assert template["options"] == options and type(template["options"]["scale"]) is float
    assert template["depth"] == 20 and template["architecture"] == "my.py:build"


def test_options_logged_flat_by_an_older_version_still_read_back():
    runs = paper_runs().assign(**{"template.options.rank": "2", "template.options.kind": "lora"})
    assert template_of(runs)[0]["options"] == {"rank": 2, "kind": "lora"}


# ---- MLflow ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A sqlite MLflow store with a small sweep (5 ok trials, 1 failed, 1 diverged, 1 calibration trial)."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    configs = trial_configs(noise=0.01, grid=SMALL_GRID, recurrences=(1,))
    broken = trial_configs(grid={1e18: (16, 18)}, recurrences=(1,))
    calibration = trial_configs(grid={1e18: (10,)}, recurrences=(2,))[0]
    extra = [(broken[0], {"status": "failed", "reason": "CUDA out of memory"}),
             (broken[1], {"status": "diverged", "reason": "loss is nan at step 12"})]
    log_sweep(uri, "small", configs, root / "artifacts", extra=extra)
    log_sweep(uri, "calibrated", [calibration], root / "artifacts2")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    client.create_experiment("empty", artifact_location=(root / "artifacts3").as_uri())
    run = client.search_runs([client.get_experiment_by_name("calibrated").experiment_id])[0]
    client.set_tag(run.info.run_id, "stage", "calibrate")
    return {"uri": uri, "root": root}


@pytest.mark.integration
def test_load_runs_from_mlflow(store):
    runs = load_runs("small", store["uri"])
    assert len(runs) == 7
    ok = runs[runs["status"] == "ok"].sort_values("width")
    assert len(ok) == 5 and (ok["stage"] == "search").all() and (ok["sweep"] == "small").all()
    assert list(ok["width"]) == [384, 512, 640, 768, 896]
    assert (ok[["N_once", "N_rec", "tokens", "flops_per_token", "val_loss"]] > 0).all().all()
    assert runs.attrs["tracking_uri"] == store["uri"]
    not_ok = runs[runs["status"] != "ok"].set_index("status")
    assert not_ok.loc["failed", "reason"] == "CUDA out of memory"
    assert not_ok.loc["diverged", "reason"] == "loss is nan at step 12"
    assert not_ok.loc["failed", "r"] == 1 and not_ok.loc["failed", "budget_flops"] == 1e18  # from the tags
    template, batch, source = template_of(runs)
    assert template == TEMPLATE and batch == 262_144 and source == "recorded"


@pytest.mark.integration
def test_other_stages_are_kept_but_not_usable(store):
    runs = load_runs("calibrated", store["uri"])
    assert list(runs["stage"]) == ["calibrate"]
    assert usable_runs(runs).empty and len(usable_runs(runs, stage=None)) == 1
    assert exclusions(runs)["reason"].tolist() == ["stage calibrate (not fitted)"]


@pytest.mark.integration
@pytest.mark.parametrize("experiment, message", [("nope", "no experiment 'nope'"), ("empty", "has no trial runs")])
def test_missing_or_empty_experiment(store, experiment, message):
    with pytest.raises(ValueError, match=message):
        load_runs(experiment, store["uri"])


@pytest.mark.integration
def test_a_missing_database_is_refused_and_not_created(tmp_path):
    path = tmp_path / "absent.db"
    with pytest.raises(ValueError, match="no MLflow database"):
        load_runs("sweep", f"sqlite:///{path}")
    assert not path.exists()


@pytest.mark.integration
def test_a_corrupted_or_foreign_database_is_refused(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ValueError, match="is not a readable SQLite database"):
        load_runs("sweep", f"sqlite:///{garbage}")
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x)")
    before = foreign.read_bytes()
    with pytest.raises(ValueError, match="an SQLite database but not MLflow's"):
        load_runs("sweep", f"sqlite:///{foreign}")
    assert foreign.read_bytes() == before


@pytest.mark.integration
def test_a_server_that_does_not_answer(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on: bind, read the number, close
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ValueError, match="is unreachable"):
        load_runs("sweep", f"http://127.0.0.1:{port}")


def test_paper_grid_budgets_are_the_papers():
    assert sorted(paper_runs()["budget_flops"].unique()) == sorted(PAPER_GRID)


def test_a_sweep_is_compared_with_the_paper_grid_only_when_it_covers_its_cells():
    grid = paper_grid_flops()
    assert 7.2e20 < grid < 7.3e20  # the paper (Schwethelm et al. 2026): 116 runs, each a hair under its budget
    same = dict(budgets=list(PAPER_GRID), recurrences=[1, 2, 4, 8], template=dict(PAPER_TEMPLATE),
                batch_tokens=PAPER_BATCH_TOKENS)
    assert paper_grid_reference(**same) == grid
    # the paper preset's two cheap budgets below the paper's: the same reference (what the paper spent)
    assert paper_grid_reference(**{**same, "budgets": [1e17, 2.15e17, *PAPER_GRID]}) == grid
    assert paper_grid_reference(**{**same, "budgets": list(PAPER_GRID)[1:]}) is None  # a paper budget missing
    assert paper_grid_reference(**{**same, "recurrences": [1, 2, 4]}) is None
    assert paper_grid_reference(**{**same, "batch_tokens": PAPER_BATCH_TOKENS // 2}) is None


@pytest.mark.integration
def test_the_default_store_is_the_searchs_and_is_not_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="loopscale-runs/mlflow.db"):
        load_runs("sweep")
    assert not (tmp_path / "loopscale-runs").exists()
