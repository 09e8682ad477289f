"""Faults inside trials, injected for real through the simulated objective's testing aid (objectives/simulation.py):
a trial that raises, one that returns NaN, one killed by SIGKILL of its own worker process (what the out-of-memory
killer does) and a worker process that exits. The sweep must finish, retry each failure exactly
``[resources] retries`` times, record every outcome in MLflow with its status and reason, and the analysis must
count and exclude them, saying why. Real Ray, real MLflow sqlite, nothing mocked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import shutil
import signal
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from loopscale.analysis import exclusions, load_runs
from loopscale.analysis.store import trial_numbers
from loopscale.objectives import TrialConfig, simulate, testing
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.tune.driver import run_search
from loopscale.search.tune.receipts import Receipt
from test_kill_resume import kill_leftovers
from test_spec import base_spec, to_toml

RETRIES = 1
pytestmark = pytest.mark.usefixtures("testing_aids")


def write_fault_spec(tmp_path: Path, faults: dict[str, str], filename: str = "spec.toml", **overrides: Any) -> Path:
    """A simulated sweep spec with a ``[testing.faults]`` table (its keys need quoting, so it is written here)."""
    spec = base_spec(tmp_path, **overrides)
    text = to_toml(spec) + "\n[testing.faults]\n" + "".join(f'"{k}" = "{v}"\n' for k, v in faults.items())
    path = tmp_path / filename
    path.write_text(text)
    return path


def journal_events(path: Path) -> Counter:
    """(event, C, r, s) -> how many times it was journaled."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return Counter((e["event"], e["budget_flops"], e["r"], e["s"]) for e in entries)


# ---- the hook itself, without Ray ------------------------------------------------------------------------
def trial_config(tmp_path: Path, fault: str, **extra: Any) -> TrialConfig:
    spec = SweepSpec.from_toml(write_fault_spec(tmp_path, {"C=1e+12,r=1/s=2": fault}, budgets=[1e12], recurrences=[1],
                                                testing={"journal": str(tmp_path / "journal.jsonl")}))
    (cell,) = spec.cells()
    config = spec.trial_config(cell, 2.0)
    return dataclasses.replace(config, testing={**config.testing, **extra})


def test_raise_and_nan_faults_and_once_uses_the_journal(tmp_path):
    config = trial_config(tmp_path, "raise-once")
    assert config.testing["faults"] == {"2": "raise-once"}
    with pytest.raises(RuntimeError, match="injected fault"):
        simulate(config)
    clean = simulate(config)  # the second execution: no fault, the trial's usual loss
    assert clean["status"] == "ok" and math.isfinite(clean["val_loss"])
    assert simulate(dataclasses.replace(config, s=3.0))["status"] == "ok"  # other widths of the cell are not touched
    events = journal_events(tmp_path / "journal.jsonl")
    assert events[("start", 1e12, 1, 2.0)] == 2 and events[("end", 1e12, 1, 2.0)] == 1

    nan = simulate(dataclasses.replace(config, testing={**config.testing, "faults": {"2": "nan"}}))
    assert nan["status"] == "ok" and math.isnan(nan["val_loss"])  # an objective that misses its own divergence


def _run_simulate(config: TrialConfig) -> None:
    simulate(config)


@pytest.mark.parametrize("fault, exitcode", [("sigkill", -signal.SIGKILL), ("exit", 1)])
def test_sigkill_and_exit_end_the_trial_process(tmp_path, fault, exitcode):
    config = trial_config(tmp_path, fault)
    child = multiprocessing.get_context("fork").Process(target=_run_simulate, args=(config,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == exitcode


def test_a_rendezvous_holds_each_trial_until_enough_have_started(tmp_path):
    """The first of two trials waits in its own process until the second starts; neither waits afterwards."""
    config = trial_config(tmp_path, "raise", faults={}, rendezvous=2)  # the spec's fault table, emptied
    first = multiprocessing.get_context("fork").Process(target=_run_simulate, args=(config,))
    first.start()
    first.join(timeout=2)
    assert first.is_alive()  # held: only one start in the journal
    second = simulate(dataclasses.replace(config, s=3.0))  # the second trial starts, so both go on
    first.join(timeout=60)
    assert first.exitcode == 0 and second["status"] == "ok"
    events = journal_events(tmp_path / "journal.jsonl")
    assert [events[("start", 1e12, 1, s)] for s in (2.0, 3.0)] == [1, 1]
    assert events[("end", 1e12, 1, 2.0)] == 1
    assert simulate(config)["status"] == "ok"  # a third execution finds two starts and goes on


def test_end_order_ends_proposed_trials_in_their_order_however_they_start(tmp_path):
    """Three proposed trials started widest first, each in its own process, end narrowest first, END_GAP_S apart."""
    base = trial_config(tmp_path, "raise", faults={}, end_order="ascending")
    configs = [dataclasses.replace(base, s=s) for s in (1.0, 2.0, 3.0)]
    for config in configs:
        testing.proposed(config)
    processes = [multiprocessing.get_context("fork").Process(target=_run_simulate, args=(c,)) for c in configs]
    for process in reversed(processes):
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    entries = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    ends = [e for e in entries if e["event"] == "end"]
    assert [e["s"] for e in ends] == [1.0, 2.0, 3.0]
    assert all(b["time"] - a["time"] >= testing.END_GAP_S for a, b in zip(ends, ends[1:]))


@pytest.mark.parametrize("faults, testing_table, message", [
    ({"C=1e+12,r=3/s=2": "raise"}, {}, "names no cell"),
    ({"C=1e+12,r=1/s=99": "raise"}, {}, "not a width of cell"),
    ({"C=1e+12,r=1/s=2": "segfault"}, {}, "is not a fault"),
    ({"C=1e+12,r=1/s=2": "sigkill-once"}, {}, "needs \\[testing\\] journal"),
    ({}, {"delay_s": -1}, "delay_s must be >= 0"),
    ({}, {"end_order": "by width", "journal": "j.jsonl"}, "end_order must be ascending or descending, got 'by"),
    ({}, {"end_order": "ascending"}, "end_order needs \\[testing\\] journal"),
    ({}, {"rendezvous": 2}, "rendezvous needs \\[testing\\] journal"),
    ({}, {"rendezvous": -1, "journal": "j.jsonl"}, "rendezvous must be >= 0 trials"),
    ({}, {"fill_disk": 3}, "fill_disk must be a path"),
    ({}, {"hold": 3}, "hold must be a path"),
])
def test_fault_tables_are_checked_before_anything_runs(tmp_path, faults, testing_table, message):
    path = write_fault_spec(tmp_path, faults, budgets=[1e12], recurrences=[1], testing=testing_table or None)
    with pytest.raises(ValueError, match=message):
        SweepSpec.from_toml(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]  # nothing written


def test_a_production_spec_cannot_trip_the_aids_and_they_leave_the_hash_alone(tmp_path, monkeypatch, capsys):
    """Without LOOPSCALE_TESTING=1 a [testing] table is refused in one line; with it, the sweep's design and hash
    are those of the same spec without the table, and the trial configs carry the aids."""
    aided = write_fault_spec(tmp_path, {"C=1e+12,r=1/s=2": "raise"}, "aided.toml", budgets=[1e12],
                             recurrences=[1], testing={"delay_s": 0.5})
    plain = SweepSpec.from_toml(write_fault_spec(tmp_path, {}, "plain.toml", budgets=[1e12], recurrences=[1]))
    with_aids = SweepSpec.from_toml(aided)
    assert with_aids.spec_hash == plain.spec_hash and with_aids.design() == plain.design()
    (cell,) = with_aids.cells()
    assert with_aids.trial_config(cell, 2.0).testing == {"delay_s": 0.5, "faults": {"2": "raise"}}
    assert plain.trial_config(cell, 2.0).testing is None and "testing" not in plain.trial_config(cell, 2.0).to_params()
    monkeypatch.delenv("LOOPSCALE_TESTING")
    with pytest.raises(ValueError, match=r"^aided.toml: \[testing\] is for loopscale's own tests \(set "
                                         r"LOOPSCALE_TESTING=1 to use it\)$"):
        SweepSpec.from_toml(aided)
    assert main(["search", str(aided)]) == 2  # the command line: exit 2, that line, nothing written
    assert "[testing] is for loopscale's own tests" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aided.toml", "plain.toml"]


def test_a_trained_trial_takes_the_aids_of_timing_alone(tmp_path):
    """A training spec's trials carry delay, journal, rendezvous, holds and end order; faults and fill_disk, which
    would change or end a trained trial, are refused in one line before anything is written."""
    train = {"objective": "train", "budgets": [4e9], "recurrences": [1], "data": {"source": "kjv"}}
    timed = SweepSpec.from_toml(write_fault_spec(tmp_path, {}, "timed.toml", **train,
                                                 testing={"delay_s": 0.5, "journal": "j.jsonl",
                                                          "end_order": "descending", "hold": "h"}))
    (cell,) = timed.cells()
    assert timed.trial_config(cell, 2.0).testing == {"delay_s": 0.5, "end_order": "descending",
                                                      "journal": str(Path("j.jsonl").absolute()),
                                                      "hold": str(Path("h").absolute())}
    with pytest.raises(ValueError, match=r"\[testing\] faults apply to the simulated objective only; a trained "
                                         r"trial takes delay_s, journal, rendezvous, hold, hold_end, end_order$"):
        SweepSpec.from_toml(write_fault_spec(tmp_path, {"C=4e+09,r=1/s=2": "raise"}, "faulty.toml", **train))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faulty.toml", "timed.toml"]


def test_a_receipt_returns_the_result_only_for_the_same_trial(tmp_path):
    config = {"s": 2.0, "r": 1, "budget_flops": 1e12}
    receipt = Receipt(str(tmp_path / "receipts"), "search/C=1e+12,r=1/1", config)
    assert receipt.load() is None
    receipt.save({"val_loss": float("nan"), "status": "invalid"})
    assert math.isnan(receipt.load()["val_loss"])
    assert Receipt(str(tmp_path / "receipts"), "search/C=1e+12,r=1/1", {**config, "s": 3.0}).load() is None
    assert Receipt(str(tmp_path / "receipts"), "search/C=1e+12,r=1/2", config).load() is None
    assert [p.suffix for p in (tmp_path / "receipts").iterdir()] == [".json"]  # no partial file left


# ---- a sweep with every kind of fault --------------------------------------------------------------------
@pytest.fixture
def private_ray():
    """A local Ray whose files live in a private folder, so anything it leaves behind is found and killed."""
    folder = tempfile.mkdtemp(prefix="lsf", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR", _temp_dir=folder)
    yield
    ray.shutdown()
    kill_leftovers(folder)
    shutil.rmtree(folder, ignore_errors=True)


FAULTS = {
    "C=1e+12,r=1/s=1": "raise",         # raises on every attempt: exhausts its retries
    "C=1e+12,r=1/s=2": "nan",           # returns a NaN loss with status ok
    "C=1e+12,r=2/s=1": "sigkill-once",  # its worker is SIGKILLed (as by the OOM killer); the retry succeeds
    "C=1e+12,r=2/s=2": "exit",          # its worker process exits on every attempt
}


@pytest.mark.slow
@pytest.mark.integration
def test_faulty_trials_are_retried_a_bounded_number_of_times_recorded_and_excluded(tmp_path, private_ray, capsys):
    journal = tmp_path / "journal.jsonl"
    spec = SweepSpec.from_toml(write_fault_spec(
        tmp_path, FAULTS, budgets=[1e12, 1e13], recurrences=[1, 2], sampler="grid", trials_per_cell=4,
        widths={"s_min": 1, "s_max": 4}, testing={"journal": str(journal)}, resources={"retries": RETRIES}))
    assert spec.planned_trials() == 16  # every width of every cell: each fault's trial surely runs

    outcome_of_search = run_search(spec)  # the sweep finishes despite the faults

    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    every = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'", max_results=1000,
                               run_view_type=ViewType.ALL)
    runs = [r for r in every if r.info.lifecycle_stage == "active"]
    assert len(runs) == len({r.data.tags["trial_key"] for r in runs}) == 16  # one run per trial
    assert not [r for r in every if r.info.status == "RUNNING"]
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'sweep'")
    assert parent.info.status == "FINISHED"

    outcome = {f"{r.data.tags['cell']}/s={float(r.data.params['s']):g}": r for r in runs}
    attempts = f"({RETRIES + 1} attempts)"
    raised, nan, killed, exited = (outcome[k] for k in FAULTS)
    assert (raised.info.status, raised.data.tags["status"]) == ("FAILED", "failed")
    assert raised.data.tags["reason"] == \
        f"RuntimeError: injected fault: the trial at C=1e+12, r=1, s=1 raised {attempts}"
    assert (nan.info.status, nan.data.tags["status"]) == ("FINISHED", "invalid")
    assert nan.data.tags["reason"] == "the objective returned val_loss = nan with status ok"
    assert "val_loss" not in nan.data.metrics and trial_numbers(nan)["tokens"] > 0  # the rest of it was logged
    assert (killed.info.status, killed.data.tags["status"], killed.data.tags["reason"]) == ("FINISHED", "ok", "")
    assert math.isfinite(killed.data.metrics["val_loss"])
    assert (exited.info.status, exited.data.tags["status"]) == ("FAILED", "failed")
    assert exited.data.tags["reason"].startswith("worker process died: Worker exit type: SYSTEM_ERROR")
    assert exited.data.tags["reason"].endswith(attempts)
    healthy = [r for key, r in outcome.items() if key not in FAULTS]
    # what run_search returns says the same, in the same one line as MLflow
    returned = {f"{r['cell']}/s={r['trial']['s']:g}": r for r in outcome_of_search.stages["search"].results}
    assert {k: (r["status"], r.get("reason", "")) for k, r in returned.items()} == \
        {k: (r.data.tags["status"], r.data.tags["reason"]) for k, r in outcome.items()}
    assert len(healthy) == 12 and all(r.data.tags["status"] == "ok" and r.info.status == "FINISHED" for r in healthy)

    # retries are bounded: what the journal says each trial went through
    events = journal_events(journal)
    for key, runs_of in (("C=1e+12,r=1/s=1", RETRIES + 1), ("C=1e+12,r=2/s=2", RETRIES + 1),
                         ("C=1e+12,r=2/s=1", 2), ("C=1e+12,r=1/s=2", 1)):
        cell = spec.cells()[[c.key for c in spec.cells()].index(key.split("/")[0])]
        s = float(key.split("s=")[1])
        assert events[("start", cell.budget, cell.r, s)] == runs_of, key
    assert events[("end", 1e12, 2, 1.0)] == 1 and events[("end", 1e12, 1, 1.0)] == 0
    assert sum(n for (event, *_), n in events.items() if event == "start") == 16 + 2 * RETRIES + 1

    # the analysis counts and excludes them with the reasons
    table = load_runs(spec.name, spec.placement.tracking_uri)
    assert len(table) == 16 and (table["status"] == "ok").sum() == 13
    counts = {(row.status, row.reason.split(":")[0]): row.count for row in exclusions(table).itertuples()}
    assert counts == {("failed", "RuntimeError"): 1, ("failed", "worker process died"): 1,
                      ("invalid", "the objective returned val_loss = nan with status ok"): 1}
    capsys.readouterr()
    out_dir = tmp_path / "analysis"
    assert main(["analyze", "--experiment", spec.name, "--tracking-uri", spec.placement.tracking_uri, "--out",
                 str(out_dir),
                 "--n-starts", "50", "--n-bootstrap", "0", "--no-log"]) == 0
    report = " ".join(capsys.readouterr().out.split())  # its long lines wrap at 120 columns
    assert "16 runs, 13 used, 3 excluded" in report
    assert "excluded: 3 runs:" in report and "1 invalid (the objective returned val_loss = nan" in report
    assert "1 failed (worker process died: Worker exit type: SYSTEM_ERROR" in report
    assert "1 failed (RuntimeError: injected fault" in report
