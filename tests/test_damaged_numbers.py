"""A trial run whose numbers tag does not read back (valid JSON but no object, strings for numbers, a stale
continuation piece, garbage, a value cut short) is one line naming it and is set aside, listed among the excluded
runs; the rest are analysed. The writer never leaves a piece of an earlier, longer text to be read after its own."""

from __future__ import annotations

import json

import pytest
from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient

from loopscale.analysis.cli import main
from loopscale.analysis.runs import load_runs
from loopscale.analysis.status import sweep_status
from loopscale.analysis.store import NUMBERS_TAG, numbers_tags, trial_numbers
from test_analysis_sim import log_sweep, trial_configs

GRID = {4.64e17: (6, 8, 10, 12), 1e18: (6, 8, 10, 12, 14), 2.15e18: (8, 10, 12, 14, 16)}
FAST = ["--n-starts", "30", "--n-bootstrap", "0"]
DAMAGE = {"a list": "[1, 2, 3]", "strings": '{"N_once": "big", "val_loss": 3.0}', "garbage": "{not json",
          "cut short": '{"N_once": 1.5e8, "N_rec": 2'}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    log_sweep(uri, "sim", trial_configs(noise=0.01, grid=GRID, recurrences=(1, 2, 4)), root / "artifacts")
    return uri


@pytest.fixture
def sweep(logged):
    """The logged sweep's store, client and trial runs; every tag a test changes is put back after it."""
    client = MlflowClient(logged)
    runs = sorted(client.search_runs([client.get_experiment_by_name("sim").experiment_id],
                                     "tags.`loopscale.kind` = 'trial'"), key=lambda run: run.info.run_id)
    yield logged, client, runs
    for run in runs:
        now = client.get_run(run.info.run_id).data.tags
        for key in set(now) - set(run.data.tags):
            client.delete_tag(run.info.run_id, key)
        client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in run.data.tags.items() if now.get(k) != v])


def test_a_list_valued_numbers_tag_is_set_aside_by_analyze_in_one_line(sweep, tmp_path, capsys):
    uri, client, runs = sweep
    damaged = runs[0].info.run_id
    client.set_tag(damaged, NUMBERS_TAG, "[1, 2, 3]")
    out = tmp_path / "analysis"
    assert main(["analyze", "--experiment", "sim", "--tracking-uri", uri, "--out", str(out), "--no-log", *FAST]) == 0
    captured = capsys.readouterr()
    named = [line for line in captured.err.splitlines() if damaged in line]
    assert named == [f"loopscale: warning: set aside run {damaged} ({runs[0].info.run_name}): its {NUMBERS_TAG} tag "
                     "holds a JSON list, not an object of numbers"]
    assert "Traceback" not in captured.err
    assert f"{len(runs)} runs, {len(runs) - 1} used, 1 excluded" in captured.out
    excluded = json.loads((out / "tables" / "excluded_runs.json").read_text())
    assert [row["run_id"] for row in excluded] == [damaged] and excluded[0]["status"] == "damaged"


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_every_damaged_tag_is_set_aside_by_each_command_that_reads_the_sweep(sweep, capsys, damage):
    uri, client, runs = sweep
    damaged = runs[3].info.run_id
    client.set_tag(damaged, NUMBERS_TAG, DAMAGE[damage])
    table = load_runs("sim", uri)
    assert table.set_index("run_id").loc[damaged, "status"] == "damaged"
    assert (table["status"] == "ok").sum() == len(runs) - 1
    capsys.readouterr()
    for argv in (["predict", "--budget", "1e18", "--r", "2", "--width", "640"], ["export", "--budgets", "1e19"]):
        assert main([argv[0], "--experiment", "sim", "--tracking-uri", uri, *argv[1:], *FAST]) == 0, argv
        err = capsys.readouterr().err
        assert sum(damaged in line for line in err.splitlines()) == 1 and "Traceback" not in err
    status = sweep_status("sim", uri)
    assert status.ended == {"search": len(runs)} and len(status.damaged) == 1 and damaged in status.damaged[0]
    assert any(line.startswith(f"set aside run {damaged}") for line in status.lines())


def test_a_stale_continuation_piece_is_set_aside_and_the_writer_leaves_none(sweep):
    uri, client, runs = sweep
    run = runs[5]
    long = {f"module.gate{i}": i / 7 for i in range(400)}  # past MLflow's tag length: several pieces
    client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in numbers_tags(long, run).items()])
    run = client.get_run(run.info.run_id)
    pieces = [k for k in run.data.tags if k.startswith(NUMBERS_TAG)]
    assert len(pieces) > 2 and trial_numbers(run)["module.gate399"] == pytest.approx(399 / 7)

    # an older writer's (or a hand's) stale piece after the text: named, not read as part of the numbers
    client.set_tag(run.info.run_id, f"{NUMBERS_TAG}.{len(pieces) - 1}", ', "x": 1}')
    with pytest.raises(ValueError, match=f"run {run.info.run_id} .*not valid JSON"):
        trial_numbers(client.get_run(run.info.run_id))

    # rewritten shorter over a run that holds more pieces (each value now 0): every piece past the new text emptied
    run = client.get_run(runs[6].info.run_id)
    client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in numbers_tags(long, run).items()])
    run = client.get_run(run.info.run_id)
    held = len([k for k in run.data.tags if k.startswith(NUMBERS_TAG)])
    client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in numbers_tags(dict.fromkeys(long, 0), run).items()])
    run = client.get_run(run.info.run_id)
    numbers = trial_numbers(run)
    assert all(numbers[key] == 0 for key in long) and numbers["val_loss"] == run.data.metrics["val_loss"]
    assert len([k for k in run.data.tags if k.startswith(NUMBERS_TAG)]) == held
    assert run.data.tags[f"{NUMBERS_TAG}.{held - 1}"] == ""
